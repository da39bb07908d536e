"""predict(), search and validation on the published-runs fixture."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tensorpilot.errors import ConfigError
from tensorpilot.hardware import catalog
from tensorpilot.plan.models import get_model
from tensorpilot.plan.predict import Layout, TrainSetup, check_layout, predict, predict_inference
from tensorpilot.plan.search import parse_duration_s, search

# shared/reference/published_runs.csv (Megatron-LM, Korthikanti et al., llm-foundry, torchtitan,
# ZeRO, Hugging Face and accelerate docs; split "reference") grown with published runs found later
# (splits "tuning" and "holdout"); sources per row in the column 'source'.
REFERENCE = Path(__file__).parent / "data" / "published_runs.csv"
H100 = catalog.get("h100-sxm")
SETUP = TrainSetup(seq_len=8192, global_batch=16)


def reference_rows(tmp_path: Path, prefix: bytes = b"") -> Path:
    """The file's 43 reference rows (its first) as a CSV of their own, ``prefix`` before the header:
    without --anchor every row is predicted on its own, so they predict as in the whole file."""
    path = tmp_path / "reference.csv"
    path.write_bytes(prefix + b"".join(REFERENCE.read_bytes().splitlines(keepends=True)[:44]))
    return path


def test_validation_meets_accuracy_goal(tmp_path):
    from tensorpilot.plan.validate import summarize, validate_file

    results = [r for r in validate_file(reference_rows(tmp_path))[0] if r.split == "reference"]
    summary = summarize(results)
    assert len(results) == 43 and all(r.predicted is not None for r in results)
    # issue 4: median absolute error <= 10% on step-time/throughput rows and on memory rows
    timing = sorted(abs(r.error) for r in results if r.kind in ("step_time", "throughput"))
    assert timing[len(timing) // 2] <= 0.10
    assert summary["memory"]["median_abs_error"] <= 0.10
    # the exact arithmetic rows are exact
    exact = {r.id: r.error for r in results if r.id.startswith(("ZERO", "INF"))}
    assert all(abs(e) < 0.015 for e in exact.values()), exact


@pytest.mark.parametrize("layout,needle", [
    (Layout(tp=3, dp=1), "does not divide the 32 attention heads"),
    (Layout(dp=8, micro_batch=4), "does not divide the global batch"),
    (Layout(pp=64), "exceeds the 32 layers"),
    (Layout(sequence_parallel=True), "needs tp > 1"),
])
def test_invalid_layouts_are_one_sentence(layout, needle):
    with pytest.raises(ConfigError, match=needle):
        check_layout(get_model("llama3-8b"), layout, TrainSetup(seq_len=8192, global_batch=12))


def test_device_count_must_match():
    with pytest.raises(ConfigError, match="does not equal --gpus 16"):
        check_layout(get_model("llama3-8b"), Layout(tp=2, dp=4), SETUP, n_devices=16)


def test_more_recomputation_less_memory_more_time():
    spec = get_model("llama3-8b")
    plans = [predict(spec, H100, Layout(dp=8, sharding="fsdp", recompute=r), SETUP)
             for r in ("none", "selective", "full")]
    mems = [p.memory_bytes["activations"] for p in plans]
    times = [p.step_time_s for p in plans]
    assert mems[0] >= mems[1] > mems[2] and times[0] <= times[1] < times[2]
    # HFU counts recomputation, MFU does not
    assert plans[2].hfu > plans[2].mfu and plans[0].hfu == plans[0].mfu


def test_sharding_shrinks_model_states():
    spec = get_model("llama3-8b")
    totals = [sum(predict(spec, H100, Layout(dp=8, sharding=s), SETUP).memory_bytes[k]
                  for k in ("params", "grads", "master_params", "optimizer")) for s in ("none", "zero1", "zero2", "fsdp")]
    assert totals == sorted(totals, reverse=True)
    # bf16 weights 2 + fp32 gradients 4 (Megatron's accumulation dtype for bf16) + fp32 master 4 + Adam 8
    assert totals[0] == pytest.approx(18 * spec.n_params)


def test_plan_derived_quantities_are_consistent():
    spec = get_model("llama3-8b")
    setup = TrainSetup(seq_len=8192, global_batch=16, tokens=1e12, price_per_hour=2.0, grid_g_per_kwh=500)
    p = predict(spec, H100, Layout(dp=8, sharding="fsdp", recompute="selective"), setup)
    assert p.tokens_per_s == pytest.approx(16 * 8192 / p.step_time_s)
    # the steady-state rate over the share of wall-clock that trains: Llama 3 lost 1/9 of its
    # trained time to interruptions on 16,384 devices, 8 devices lose 8/16384 of that
    assert p.time_to_train_s == pytest.approx(1e12 / p.tokens_per_s * (1 + 8 / 16384 / 9))
    assert p.cost_usd == pytest.approx(p.time_to_train_s / 3600 * 8 * 2.0)
    assert p.energy_kwh == pytest.approx(p.power_w_per_device * 8 * p.time_to_train_s / 3.6e6)
    assert p.co2_kg == pytest.approx(p.energy_kwh * 0.5)
    assert p.power_w_per_device <= H100.tdp_w
    assert 0 < p.mfu < 0.8 * 0.9     # below the sustained matmul ceiling


def test_inference_sizing_llama2_70b():
    # 69B x 2 bytes = 138 GB of bf16 weights: not on one 80 GB device, fits on 4 (34.5 GB each)
    spec = get_model("llama2-70b")
    assert not predict_inference(spec, H100, batch=1, context=4096).fits
    four = predict_inference(spec, H100, batch=1, context=4096, tp=4)
    assert four.fits and four.weights_bytes == pytest.approx(spec.n_params * 2 / 4)


def test_search_405b_on_16384_gpus_is_fast_and_valid():
    spec = get_model("llama3.1-405b")
    setup = TrainSetup(seq_len=8192, global_batch=2048)
    t0 = time.perf_counter()
    res = search(spec, H100, 16384, setup)
    assert time.perf_counter() - t0 < 5
    assert res.ranked and all(p.fits and p.n_devices == 16384 for p in res.ranked)
    steps = [p.step_time_s for p in res.ranked]
    assert steps == sorted(steps) and res.why


def test_parse_duration():
    assert parse_duration_s("14d") == 14 * 86400 and parse_duration_s("36h") == 36 * 3600
    with pytest.raises(ConfigError):
        parse_duration_s("soon")


# ------------------------------------------------------------------ divisors and big device counts

def test_divisors_match_brute_force():
    from tensorpilot.plan.search import divisors, prime_factors

    for n in range(1, 3000):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0], n
        product = 1
        for p, k in prime_factors(n).items():
            product *= p**k
        assert product == n


def test_divisors_of_large_counts():
    from tensorpilot.plan.search import divisors, prime_factors

    # 735134400 = 2^6 3^3 5^2 7 11 13 17 (a highly composite number, OEIS A002182):
    # (6+1)(3+1)(2+1)(1+1)^4 = 1344 divisors
    assert prime_factors(735134400) == {2: 6, 3: 3, 5: 2, 7: 1, 11: 1, 13: 1, 17: 1}
    divs = divisors(735134400)
    assert len(divs) == 1344 and all(735134400 % d == 0 for d in divs) and divs == sorted(set(divs))
    # a prime just under the device limit and a semiprime of two large primes: trial division
    # stops at sqrt(n) (~3,200 here), not at n
    t0 = time.perf_counter()
    assert divisors(9_999_991) == [1, 9_999_991]
    assert divisors(3_163 * 3_167) == [1, 3_163, 3_167, 3_163 * 3_167]
    assert time.perf_counter() - t0 < 0.1


def test_search_refuses_more_devices_than_the_limit():
    from tensorpilot.plan.predict import MAX_DEVICES

    with pytest.raises(ConfigError, match="between 1 and 10,000,000"):
        search(get_model("llama3-8b"), H100, MAX_DEVICES + 1, SETUP)


def test_search_on_a_highly_composite_count_is_fast():
    # 8,648,640 has 448 divisors, the most of any count up to MAX_DEVICES; a global batch they all
    # divide keeps every one a candidate
    setup = TrainSetup(seq_len=2048, global_batch=8_648_640 * 64)
    t0 = time.perf_counter()
    res = search(get_model("llama3.1-405b"), H100, 8_648_640, setup)
    assert time.perf_counter() - t0 < 5
    assert res.ranked and all(p.n_devices == 8_648_640 and p.fits for p in res.ranked)


def test_search_space_too_large_is_one_sentence():
    from tensorpilot.plan.models import ModelSpec

    # thousands of layers let every divisor of 8,648,640 be a pipeline depth: > 20,000 layouts
    deep = ModelSpec(name="deep", hidden=512, layers=100_000, heads=8, vocab=1000, ffn_hidden=2048)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="more than 20,000 layouts to search"):
        search(deep, H100, 8_648_640, TrainSetup(seq_len=128, global_batch=8_648_640 * 16))
    assert time.perf_counter() - t0 < 1           # refused before any prediction


def test_deadline_pruning_never_changes_the_answer(monkeypatch):
    from tensorpilot.plan import search as search_mod

    # bound by FLOPs (the first two: 8B needs >= 40 H100s for 1e12 tokens in 14 days) and by
    # memory (405B: 6.5 TB of model states need >= 86 H100s however long the deadline)
    accs = [catalog.get("h100-sxm")]
    cases = [("llama3-8b", 1e12, 14 * 86400), ("gpt2", 1e10, 3600), ("llama3.1-405b", 1e9, 1000 * 86400)]

    def answer():
        return [[(p.hardware, p.n_devices, p.layout_detail, round(c, 6)) for p, c in search_mod.cheapest_for_deadline(
            get_model(m), tokens, deadline, TrainSetup(seq_len=2048, global_batch=512), accelerators=accs)]
            for m, tokens, deadline in cases]

    pruned = answer()
    monkeypatch.setattr(search_mod, "_fewest_devices", lambda *a: 1)     # every count from 1 up
    assert answer() == pruned and any(pruned)


@pytest.mark.parametrize("text,seconds", [("14d", 14 * 86400), ("36h", 36 * 3600), ("90m", 5400), ("3600s", 3600),
                                          ("2w", 14 * 86400), ("1.5h", 5400), ("1e3", 1000), (" 7D ", 7 * 86400)])
def test_parse_duration_accepts(text, seconds):
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text,needle", [("abc", "cannot read"), ("-3d", "cannot read"), ("nan", "cannot read"),
                                         ("inf", "cannot read"), ("3x", "cannot read"), ("", "cannot read"),
                                         ("0h", "more than 0"), ("1e400d", "finite"), ("1" * 400, "finite")])
def test_parse_duration_rejects(text, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_duration_s(text)


# ------------------------------------------------------------------ setups, prices, layouts

@pytest.mark.parametrize("change,needle", [
    ({"tokens": float("inf")}, "tokens must be a finite number"),
    ({"tokens": 0.0}, "tokens must be above 0"),
    ({"price_per_hour": float("nan")}, "price_per_hour must be a finite number"),
    ({"price_per_hour": -1.0}, "price_per_hour must be at least 0"),
    ({"grid_g_per_kwh": -5.0}, "grid_g_per_kwh must be at least 0"),
    ({"seq_len": 10**12}, "seq_len must be between 1 and 1,000,000,000"),
    ({"global_batch": 0}, "global_batch must be between 1"),
])
def test_train_setup_rejects_out_of_range(change, needle):
    with pytest.raises(ConfigError, match=needle):
        TrainSetup(**{"seq_len": 2048, "global_batch": 8, **change})


def test_price_zero_is_a_price():
    # owned hardware: a price of 0 must not fall back to the catalog's list price
    p = predict(get_model("llama3-8b"), H100, Layout(dp=8, sharding="fsdp"),
                TrainSetup(seq_len=8192, global_batch=16, tokens=1e12, price_per_hour=0.0))
    assert p.price_per_gpu_hour == 0.0 and p.cost_usd == 0.0 and not p.notes


def test_cost_objective_needs_a_price():
    mi300x = catalog.get("mi300x")
    assert mi300x.price_usd_per_gpu_hour is None
    with pytest.raises(ConfigError, match="ranking by cost needs a price"):
        search(get_model("llama3-8b"), mi300x, 8, SETUP, objective="cost")
    priced = TrainSetup(seq_len=8192, global_batch=16, price_per_hour=2.0)
    assert search(get_model("llama3-8b"), mi300x, 8, priced, objective="cost").ranked


def test_interleaved_chunks_need_layers():
    with pytest.raises(ConfigError, match="pp x virtual stages = 4 x 16 exceeds the 32 layers"):
        check_layout(get_model("llama3-8b"), Layout(pp=4, dp=2, schedule="interleaved", virtual_stages=16), SETUP)
    # 32 blocks + the embedding + the output layer fill 17 x 2 chunks exactly (Megatron's
    # account-for-embedding/loss split), so that layout runs
    check_layout(get_model("llama3-8b"), Layout(pp=17, dp=1, schedule="interleaved", virtual_stages=2),
                 TrainSetup(seq_len=8192, global_batch=17))


@pytest.mark.parametrize("kw,needle", [({"batch": 10**12}, "batch must be between"),
                                       ({"context": 0}, "context must be between"),
                                       ({"kv_dtype": "int3"}, "unknown KV-cache dtype")])
def test_inference_rejects_bad_sizes(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        predict_inference(get_model("llama3-8b"), H100, **{"batch": 1, "context": 1024, **kw})


# ------------------------------------------------------------------ validate: rows and files

def _reference_rows():
    from tensorpilot.plan.validate import load_rows

    return [r for r in load_rows(REFERENCE) if r["split"] == "reference"]


@pytest.mark.parametrize("change,reason", [
    ({"precision": "fp7 weird"}, "unknown precision label 'fp7 weird'"),
    ({"gpu": "Z900"}, "unknown accelerator 'Z900'"),
    ({"sharding": "zero-9"}, "unknown sharding label 'zero-9'"),
    ({"hidden": "abc"}, "column 'hidden' is 'abc', not a number"),
    ({"layers": "2.5"}, "column 'layers' is '2.5', not a whole number"),
    ({"seq_len": "1e400"}, "column 'seq_len' is '1e400', not a finite number"),
    ({"seq_len": "9" * 30}, "column 'seq_len'"),
    ({"value": "0"}, "column 'value' is '0', not a positive number"),
    ({"value": "n/a"}, "column 'value' is 'n/a', not a positive number"),
    ({"recompute": "partial"}, "unknown recompute 'partial'"),
    ({"metric": "watts"}, "metric 'watts'"),
    ({"tp": "5"}, "tp=5 does not divide the 24 attention heads"),
    ({"metric": None}, "the row lacks the columns metric"),
])
def test_a_row_that_cannot_be_modelled_says_why(change, reason):
    from tensorpilot.plan.validate import counts, validate_rows

    rows = _reference_rows()
    bad = {**rows[0], **change}            # MEG-01: GPT 1.7B, 24 heads
    results = validate_rows([bad, *rows[1:]])
    assert results[0].predicted is None and reason in results[0].note, results[0].note
    # every other row is still predicted, and the counts add up
    assert all(r.predicted is not None for r in results[1:])
    assert counts(results) == {"rows": 43, "predicted": 42, "not_modelled": 1}


@pytest.mark.parametrize("column", ["params_b", "hidden", "layers", "heads", "vocab", "ffn_hidden", "kv_heads",
                                    "n_gpus", "tp", "pp", "dp", "seq_len", "global_batch", "micro_batch"])
@pytest.mark.parametrize("value", ["-5", "0"])
def test_a_size_that_is_not_positive_is_the_rows_reason(column, value):
    """Whether or not the row's metric uses the column: params_b = -5 is a typo, not a run."""
    from tensorpilot.plan.validate import validate_rows

    rows = _reference_rows()
    shapeless = next(r for r in rows if not r["hidden"])          # predicted from params_b alone
    for row in (rows[0], shapeless):
        result = validate_rows([{**row, column: value}])[0]
        assert result.predicted is None, (row["id"], column, value, result)
        kind = "number" if column == "params_b" else "whole number"
        assert f"column {column!r} is {value!r}, not a positive {kind}" in result.note


def test_a_long_row_is_reported():
    from tensorpilot.plan.validate import validate_rows

    row = {**_reference_rows()[0], None: ["surplus"]}
    assert "the row has" in validate_rows([row])[0].note


@pytest.mark.parametrize("content,needle", [
    ("", "is empty"),
    ("id,metric,value,unit,params_b,n_gpus\n", "has a header but no rows"),
    ('{"not": "csv"}\n', "its header lacks id, metric"),
    ("id,metric,value\nX,weights_memory,14\n", "its header lacks unit, params_b, n_gpus"),
])
def test_a_file_that_is_not_a_published_runs_csv(tmp_path, content, needle):
    from tensorpilot.plan.validate import validate_file

    path = tmp_path / "runs.csv"
    path.write_text(content)
    with pytest.raises(ConfigError, match=needle):
        validate_file(path)


def test_validation_file_paths(tmp_path):
    from tensorpilot.errors import PathError
    from tensorpilot.plan.validate import validate_file

    with pytest.raises(PathError, match="does not exist"):
        validate_file(tmp_path / "none.csv")
    with pytest.raises(PathError, match="is a directory"):
        validate_file(tmp_path)
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00id")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        validate_file(tmp_path / "bin.csv")


def test_validation_file_with_a_byte_order_mark(tmp_path):
    # spreadsheets save CSV as UTF-8 with a BOM; the first column must still read as 'id'
    from tensorpilot.plan.validate import validate_file

    results, _ = validate_file(reference_rows(tmp_path, prefix=b"\xef\xbb\xbf"))
    assert results[0].id == "MEG-01" and len(results) == 43 and all(r.predicted is not None for r in results)


def test_validation_file_from_a_comma_decimal_spreadsheet(tmp_path):
    # a spreadsheet in a comma-decimal locale saves ';'-separated cells with '1,7' for 1.7, and
    # users capitalise headers: the same rows predict the same values as the plain file
    import csv
    from tensorpilot.plan.validate import validate_file

    rows = list(csv.DictReader(REFERENCE.open(newline="")))[:6]
    plain, semi = tmp_path / "plain.csv", tmp_path / "semi.csv"
    with plain.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with semi.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[f" {k.upper()} " for k in rows[0]], delimiter=";")
        w.writeheader()
        w.writerows({f" {k.upper()} ": v.replace(".", ",") if k in ("params_b", "value") else v
                     for k, v in r.items()} for r in rows)
    assert any("." in r["params_b"] for r in rows)     # the decimal commas are exercised
    a, _ = validate_file(plain)
    b, _ = validate_file(semi)
    assert [r.id for r in b] == [r.id for r in a]
    assert [r.published for r in b] == [r.published for r in a]
    assert all(x.predicted is not None and x.predicted == pytest.approx(y.predicted) for x, y in zip(a, b))
