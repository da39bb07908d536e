"""The stack efficiency: one measured step of the user's stack carried to other plans (plan.anchor)."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest

from tensorpilot.errors import ConfigError
from tensorpilot.hardware import catalog
from tensorpilot.plan.anchor import MIN_STACK_EFFICIENCY, solve_efficiency, stack_efficiency
from tensorpilot.plan.models import get_model
from tensorpilot.plan.predict import Layout, TrainSetup, predict
from tensorpilot.plan.validate import anchored, validate_rows


def test_a_kernel_bound_speed_is_solved_in_one_step():
    calls = []

    def speed(e):
        calls.append(e)
        return 120.0 * e                   # speed proportional to the kernel rates
    found = solve_efficiency(speed, 90.0)
    assert found.reached and found.efficiency == pytest.approx(0.75, rel=1e-9)
    assert len(calls) == 2                 # e = 1, then the proportional guess


def test_exposed_communication_is_solved_by_hand():
    # step = 2 s of kernels / e + 1 s of communication; a measured 6 s step: 2 / e = 5, e = 0.4
    found = solve_efficiency(lambda e: 1 / (2 / e + 1), 1 / 6)
    assert found.reached and found.efficiency == pytest.approx(0.4, rel=2e-3)


def test_a_speed_the_kernels_cannot_reach_is_clamped_and_said():
    # 1 s of communication alone: no kernel share makes the step 0.9 s
    found = solve_efficiency(lambda e: 1 / (0.5 / e + 1), 1 / 0.9)
    assert not found.reached and found.efficiency == pytest.approx(4.0)
    found = solve_efficiency(lambda e: 5.0, 1.0)       # the kernels do not set the speed at all
    assert not found.reached
    with pytest.raises(ValueError):
        solve_efficiency(lambda e: 1.0, 0.0)
    assert MIN_STACK_EFFICIENCY > 0


@pytest.fixture
def no_gemm_fixed_cost(monkeypatch):
    """Plans whose every second is kernel-rate time, so a stack efficiency scales them exactly: a
    GEMM's fixed cost (calibration.GEMM_OVERHEAD_S), like a link's, does not scale with it."""
    from tensorpilot.plan import calibration as cal

    monkeypatch.setattr(cal, "GEMM_OVERHEAD_S", 0.0)


def _plan(eff: float, **layout):
    spec = get_model("llama3-8b")
    lo = Layout(tp=1, pp=1, dp=8, sharding="fsdp", micro_batch=1, recompute="full", **layout)
    setup = TrainSetup(seq_len=4096, global_batch=64, stack_efficiency=eff)
    return spec, lo, setup, predict(spec, catalog.get("h100-sxm"), lo, setup)


def test_the_efficiency_divides_the_kernels_and_leaves_the_links(no_gemm_fixed_cost):
    *_, full = _plan(1.0)
    *_, half = _plan(0.5)
    t1, t2 = full.time_breakdown_s, half.time_breakdown_s
    for k in ("compute", "memory_bound", "optimizer"):       # every kernel at half the rate
        assert t2[k] == pytest.approx(2 * t1[k], rel=1e-9), k
    # the gathers and reduce-scatters keep their link time: what stays exposed only shrinks
    # behind the longer kernels, it never grows
    assert t2["dp_comm_exposed"] <= t1["dp_comm_exposed"] + 1e-12
    assert half.memory_bytes == full.memory_bytes
    with pytest.raises(ConfigError, match="stack_efficiency"):
        TrainSetup(seq_len=4096, global_batch=64, stack_efficiency=0)


def test_the_solved_efficiency_reproduces_the_measured_step():
    spec, lo, setup, plan = _plan(1.0)
    measured = plan.step_time_s * 1.6
    found = stack_efficiency(spec, catalog.get("h100-sxm"), lo, setup, measured)
    assert found.reached
    again = predict(spec, catalog.get("h100-sxm"), lo, replace(setup, stack_efficiency=found.efficiency))
    assert again.step_time_s == pytest.approx(measured, rel=2e-3)


def test_plan_measured_step_round_trips_through_stack_efficiency(capsys):
    from tensorpilot.cli import main

    base = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--sharding", "fsdp",
            "--seq-len", "4096", "--global-batch", "64", "--recompute", "full", "--json"]
    assert main(base) == 0                       # unanchored: the blind error and the flag that narrows it
    assert any(n.startswith("expect misses:") and "--measured-step-s" in n
               for n in json.loads(capsys.readouterr().out)["notes"])
    assert main(base + ["--measured-step-s", "9.0"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["step_time_s"] == pytest.approx(9.0, rel=2e-3)
    eff = float(plan["notes"][0].split("stack efficiency ")[1].split(":")[0])
    assert not any(n.startswith("expect misses:") for n in plan["notes"])
    assert main(base + ["--stack-efficiency", str(eff)]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == pytest.approx(9.0, rel=5e-3)
    # tokens a second over all devices: 64 x 4096 tokens in 9 s
    assert main(base + ["--measured-tokens-per-s", str(64 * 4096 / 9.0)]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == pytest.approx(9.0, rel=2e-3)
    # the search plans every layout at that efficiency
    assert main(base + ["--measured-step-s", "9.0", "--search", "--top", "2"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["stack_efficiency"] == pytest.approx(eff, rel=1e-2) and "stack efficiency" in found["anchor"]


@pytest.mark.parametrize("flags, needle", [
    (["--measured-step-s", "0"], "--measured-step-s must be above 0"),
    (["--measured-step-s", "1", "--stack-efficiency", "0.5"], "say the same thing"),
    (["--stack-efficiency", "5"], "at most 4"),
    (["--measured-step-s", "1", "--deadline", "3d", "--tokens", "1e12"], "--stack-efficiency X"),
    (["--stack-efficiency", "0.5", "--inference"], "drop it"),
    (["--anchor"], "goes with validate"),
])
def test_bad_anchors_are_one_sentence(flags, needle, capsys):
    from tensorpilot.cli import main

    assert main(["plan", *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def _rows(tmp_path, values):
    """One source's single-GPU runs of a Llama-style 1B (the published tokens/s of each given; the
    n-th at micro-batch 2^n, so each is another configuration), the first run's TFLOP/s as a
    second row, and another source with one row."""
    cols = dict(model="m", params_b="", hidden="2048", layers="16", heads="16", vocab="32000", ffn_hidden="8192",
                kv_heads="16", gpu="H100-80GB", n_gpus="1", tp="1", pp="1", dp="1", seq_len="2048",
                global_batch="8", precision="bf16", recompute="none", sharding="none",
                metric="tokens_per_s_per_gpu", unit="tokens/s/GPU", flops_convention="", tokens="", optimizer="",
                split="holdout")
    rows = [dict(cols, id=f"A-{n}", value=str(v), source="doc A", micro_batch=str(2 ** n), global_batch=str(2 ** n))
            for n, v in enumerate(values)]
    rows.insert(1, dict(rows[0], id="A-0f", metric="achieved_tflops_per_gpu", unit="TFLOP/s/GPU", value="300"))
    rows.append(dict(cols, id="B-0", value="1000", source="doc B", micro_batch="1", global_batch="1"))
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path, rows


def test_validate_anchor_carries_the_first_rows_efficiency(tmp_path, no_gemm_fixed_cost):
    path, rows = _rows(tmp_path, [20000, 25000, 30000])
    results = validate_rows(rows)
    carried = anchored(rows, results)
    # the anchor, its own run again (A-0f) and the lone source (B-0) are not carried
    assert [(i, r.id) for i, r in carried] == [(2, "A-1"), (3, "A-2")]
    # one device, fused kernels: every second of the step is kernel time, so the speed scales
    # with the efficiency exactly: each row's plan times the anchor's published / planned speed
    e = 20000 / results[0].predicted
    for i, r in carried:
        assert r.predicted == pytest.approx(results[i].predicted * e, rel=3e-3)
        assert r.note.startswith("anchored on A-0: stack efficiency")


def test_validate_anchor_cli_reports_both_errors(tmp_path, capsys, no_gemm_fixed_cost):
    from tensorpilot.cli import main

    path, rows = _rows(tmp_path, [20000, 25000])
    assert main(["plan", "validate", str(path), "--anchor", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    a = out["anchored"]
    assert [r["id"] for r in a["rows"]] == ["A-1"]
    plain = {r["id"]: r["predicted"] for r in out["rows"]}
    carried = plain["A-1"] * 20000 / plain["A-0"]
    assert a["rows"][0]["predicted"] == pytest.approx(carried, rel=3e-3)
    assert a["summary"]["all"]["median_abs_error"] == pytest.approx(abs(carried / 25000 - 1), rel=1e-2)
    assert a["unanchored_summary"]["all"]["median_abs_error"] == pytest.approx(abs(plain["A-1"] / 25000 - 1))
    assert main(["plan", "validate", str(path), "--anchor"]) == 0
    text = capsys.readouterr().out
    assert f"1 rows anchored: median abs error {100 * abs(carried / 25000 - 1):.1f}%" in text
    # nearest: A-0 and its TFLOP/s row are anchored on on A-0
    assert main(["plan", "validate", str(path), "--anchor", "nearest", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)["anchored"]["rows"]] == ["A-0", "A-0f", "A-1"]


def _eager(batch: int, **stack):
    """GPT-2 on one H100, eager kernels: a small batch waits for the host to dispatch ops."""
    spec = get_model("gpt2")
    lo = Layout(tp=1, pp=1, dp=1, micro_batch=batch)
    setup = TrainSetup(seq_len=128, global_batch=batch, kernels="eager", **stack)
    return spec, lo, setup, predict(spec, catalog.get("h100-sxm"), lo, setup)


def test_a_host_bound_step_informs_the_host_not_the_kernels():
    from tensorpilot.plan.anchor import anchor_part

    spec, lo, setup, small = _eager(1)
    assert small.time_breakdown_s["host_dispatch"] > 0 and anchor_part(small.time_breakdown_s) == "host_efficiency"
    measured = small.step_time_s * 1.5
    found = stack_efficiency(spec, catalog.get("h100-sxm"), lo, setup, measured)
    assert found.part == "host_efficiency" and found.reached
    again = predict(spec, catalog.get("h100-sxm"), lo, replace(setup, host_efficiency=found.efficiency))
    assert again.step_time_s == pytest.approx(measured, rel=2e-3)
    # only the host's wait grew: the kernels' parts of the step are the unanchored plan's
    for k in ("compute", "memory_bound", "optimizer"):
        assert again.time_breakdown_s[k] == small.time_breakdown_s[k]
    # a batch the device is busy for hides the host: the same stack plans it as before, where
    # blaming the kernels (the factor the small step needs on them) would have slowed it
    *_, large = _eager(512)
    *_, large_anchored = _eager(512, host_efficiency=found.efficiency)
    assert large.time_breakdown_s["host_dispatch"] == 0 == large_anchored.time_breakdown_s["host_dispatch"]
    assert large_anchored.step_time_s == large.step_time_s
    kernels = stack_efficiency(spec, catalog.get("h100-sxm"), lo, replace(setup, kernels="fused"), measured)
    *_, large_kernels = _eager(512, stack_efficiency=kernels.efficiency)
    assert kernels.part == "stack_efficiency" and large_kernels.step_time_s > 1.2 * large.step_time_s


def test_a_host_bound_step_faster_than_the_device_falls_back_to_the_kernels():
    from tensorpilot.plan.anchor import solve_part

    # step = max(host 1 s / h, device 0.6 s / e): measured 0.3 s -- the host alone reaches only 0.6 s
    def speed(part, x):
        h, e = (x, 1.0) if part == "host_efficiency" else (1.0, x)
        return 1 / max(1 / h, 0.6 / e)
    found = solve_part(speed, "host_efficiency", 1 / 0.3)
    assert found.part == "stack_efficiency" and found.reached is False   # the host still takes 1 s at h = 1
    found = solve_part(speed, "host_efficiency", 1 / 2.0)                # a 2 s step: the host at half rate
    assert found.part == "host_efficiency" and found.efficiency == pytest.approx(0.5, rel=2e-3)


def test_validate_anchors_a_host_bound_first_row_on_the_host(tmp_path):
    # GPT-2's shape, eager PyTorch on one H100: the first row (batch 1) waits for the host, the
    # second (batch 256) keeps the device busy
    cols = dict(model="gpt2", params_b="", hidden="768", layers="12", heads="12", vocab="50257", ffn_hidden="3072",
                kv_heads="12", gpu="H100-80GB", n_gpus="1", tp="1", pp="1", dp="1", seq_len="128",
                precision="bf16", recompute="none", sharding="none", metric="iteration_time", unit="s",
                flops_convention="eager PyTorch", tokens="", optimizer="", split="holdout", source="doc E")
    rows = [dict(cols, id="E-0", micro_batch="1", global_batch="1"),
            dict(cols, id="E-1", micro_batch="256", global_batch="256")]
    plain = validate_rows([dict(r, value="1") for r in rows])
    rows[0]["value"] = str(2 * plain[0].predicted)          # the host took twice the planned time
    rows[1]["value"] = "1"
    results = validate_rows(rows)
    (i, carried), = anchored(rows, results)
    assert carried.note.startswith("anchored on E-0: host efficiency")
    # the device-bound row is planned as before: the host's wait hides behind its kernels
    assert carried.predicted == pytest.approx(plain[1].predicted, rel=1e-9)


def test_nearest_anchors_each_row_on_its_most_similar_run(tmp_path, no_gemm_fixed_cost):
    path, rows = _rows(tmp_path, [20000, 25000])         # A-0 (mb 1), A-0f (its TFLOP/s), A-1 (mb 2)
    rows.insert(3, dict(rows[2], id="A-2", gpu="A100-80GB", value="9000"))   # A-1 on another part
    results = validate_rows(rows)
    carried = dict((r.id, r) for _, r in anchored(rows, results, "nearest"))
    # A-1's nearest other run is A-2 (one column differs: the part) not A-0 (micro- and global batch)
    assert carried["A-1"].note.startswith("anchored on A-2:")
    assert carried["A-2"].note.startswith("anchored on A-1:")
    # A-0 and its TFLOP/s row are one run: each is anchored on, never on the other
    assert carried["A-0"].note.startswith("anchored on A-1:") and carried["A-0f"].note.startswith("anchored on A-1:")
    # one device, fused kernels: the speed scales with the kernels' factor exactly
    by_id = {r.id: r for r in results}
    assert carried["A-1"].predicted == pytest.approx(by_id["A-1"].predicted * 9000 / by_id["A-2"].predicted,
                                                     rel=3e-3)
    with pytest.raises(ConfigError, match="anchor must be one of first, nearest"):
        anchored(rows, results, "closest")


def test_a_stack_column_keeps_a_documents_two_stacks_apart(tmp_path):
    path, rows = _rows(tmp_path, [20000, 25000, 30000, 12000])
    # the document compares two stacks: A-0..A-2 run one, A-3 another
    for r in rows:
        r["stack"] = "slow stack" if r["id"] == "A-3" else "fast stack"
    results = validate_rows(rows)
    carried = dict((r.id, r) for _, r in anchored(rows, results))
    assert carried["A-1"].note.startswith("anchored on A-0:") and carried["A-2"].note.startswith("anchored on A-0:")
    assert "A-3" not in carried            # its stack's only run: nothing measured it
    # without the column the document is one stack: A-3 is carried at A-0's factor
    for r in rows:
        del r["stack"]
    assert dict((r.id, r) for _, r in anchored(rows, validate_rows(rows)))["A-3"].note.startswith("anchored on A-0:")


def test_a_solved_share_is_said_once_the_same_way():
    from tensorpilot.plan.anchor import Anchor, sentence

    said = sentence(Anchor(0.4123, True, "stack_efficiency"), "tp=1 pp=1 dp=8", 2.5)
    assert said == ("stack efficiency 0.412: the share of the planner's kernel rates at which tp=1 pp=1 dp=8 steps "
                    "in the measured 2.5 s (pass --stack-efficiency 0.412 to plan other runs of this stack)")
    host = sentence(Anchor(4.0, False, "host_efficiency"), "this run", 0.01, " (why)")
    assert "op-dispatch rate" in host and "--host-efficiency 4 " in host
    assert host.endswith("; no share reproduces the measurement (why), so it is clamped")


def test_the_stated_blind_error_is_the_one_the_blind_passes_recorded():
    # every row line of benchmarks/results/holdout*_blind.md: | id | metric | published | predicted | error | note |
    import re
    import statistics
    from pathlib import Path

    from tensorpilot.plan import anchor

    row = re.compile(r"^\| [^|]+ \| [^|]+ \| [^|]+ \| [^|]+ \| ([+-][0-9.]+)% \|")
    files = sorted((Path(__file__).parents[2] / "benchmarks" / "results").glob("holdout*_blind.md"))
    errors = [abs(float(m.group(1))) for f in files for m in map(row.match, f.read_text().splitlines()) if m]
    assert len(files) >= 40 and len(errors) == anchor.BLIND_RUNS
    assert round(statistics.median(errors) / 100, 3) == anchor.BLIND_MEDIAN_ABS_ERROR
    assert round(sum(e <= 10 for e in errors) / len(errors), 2) == anchor.BLIND_WITHIN_10
    assert f"half were predicted within {anchor.BLIND_MEDIAN_ABS_ERROR:.0%}" in anchor.expected_error_sentence()


def test_the_publisher_says_whether_a_row_is_a_tuned_recipe():
    from tensorpilot.plan.validate import row_stack

    recipes = ("NVIDIA/NeMo docs/source/performance/performance_summary.md", "NVIDIA-NeMo/Megatron-Bridge "
               "docs/performance-summary.md", "NVIDIA/dgxc-benchmarking llama3.1/README.md",
               "github mlcommons/training_results_v4.0 NVIDIA/results/dgxh100_n8/llama2_70b_lora",
               "mosaicml/llm-foundry scripts/train/benchmarking/README.md", "Narayanan et al. SC21 Table 1",
               "pytorch/torchtitan docs/performance.md", "AI-Hypercomputer/maxtext README.md")
    typical = ("a user's blog post on 8 x RTX 4090", "deepspeedai/DeepSpeed blogs/deepspeed-ulysses/README.md",
               # a user's report or work in progress in a recipe's tracker is not its published table
               "NVIDIA/NeMo issue #8123 'training slower than the performance summary'",
               "pytorch/torchtitan pull request #822 'Makes FSDP reshard_after_forward configurable'")
    assert [row_stack({"source": s}) for s in recipes] == ["recipe"] * len(recipes)
    assert [row_stack({"source": s}) for s in typical] == ["typical"] * len(typical)


def test_a_typical_stacks_row_runs_its_kernels_at_the_typical_share():
    """The same one-device run, published by a user and by a vendor's recipe: nothing is
    communicated and nothing waits for the host, so the planned speed is the kernels' and the user's
    is the typical share of the recipe's -- less a GEMM's fixed cost (calibration.GEMM_OVERHEAD_S),
    which is the hardware's and not scaled."""
    from tensorpilot.plan import calibration as cal
    from tensorpilot.plan.validate import predict_row

    row = dict(id="S-1", model="llama-1b", hidden="2048", layers="16", heads="32", vocab="128256", ffn_hidden="8192",
               kv_heads="8", gpu="H100-80GB", n_gpus="1", tp="1", pp="1", dp="1", seq_len="4096", global_batch="8",
               micro_batch="8", precision="bf16 mixed", recompute="none", sharding="none",
               metric="tokens_per_s_per_gpu", value="10000", unit="tokens/s/GPU",
               flops_convention="flash attention 2, fused AdamW", source="a user's blog post", split="holdout")
    user = predict_row(row).predicted
    vendor = predict_row(dict(row, source="NVIDIA/dgxc-benchmarking llama3.1/README.md")).predicted
    assert cal.TYPICAL_STACK_EFFICIENCY < 1
    assert user / vendor == pytest.approx(cal.TYPICAL_STACK_EFFICIENCY, rel=1e-3)
    # a measured factor replaces the typical one: anchored at 1, the user's row is the vendor's
    assert predict_row(row, stack={"stack_efficiency": 1.0}).predicted == pytest.approx(vendor, rel=1e-12)
