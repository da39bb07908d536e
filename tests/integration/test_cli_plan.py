"""`tensorpilot plan` end to end: readable output, --json, search, deadline, validate, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

REFERENCE = Path(__file__).parents[1] / "unit" / "data" / "published_runs.csv"


def test_plan_json_has_the_promised_fields(tmp_path):
    proc = run_cli("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192",
                   "--global-batch", "16", "--precision", "bf16", "--recompute", "selective",
                   "--sharding", "fsdp", "--tokens", "1e12", "--goodput", "0.95", "--overlap-comm", "--json",
                   cwd=tmp_path, check=True)
    d = json.loads(proc.stdout)
    assert d["time_to_train_s"] == pytest.approx(1e12 / d["tokens_per_s"] / 0.95)
    assert d["layout_detail"]["overlap_comm"] is True
    for key in ("memory_bytes", "fits", "step_time_s", "tokens_per_s_per_device", "mfu", "time_to_train_s",
                "cost_usd", "energy_kwh"):
        assert d[key] is not None, key
    parts = {k: v for k, v in d["memory_bytes"].items() if k != "total"}
    assert d["memory_bytes"]["total"] == pytest.approx(sum(parts.values()))
    assert d["layout"] == "fsdp" and d["fits"] is True
    # the same run eagerly: more elementwise traffic, a longer step, the same memory
    proc = run_cli("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192",
                   "--global-batch", "16", "--precision", "bf16", "--recompute", "selective",
                   "--sharding", "fsdp", "--overlap-comm", "--kernels", "eager", "--json", cwd=tmp_path, check=True)
    eager = json.loads(proc.stdout)
    assert eager["step_time_s"] > d["step_time_s"] and eager["memory_bytes"] == d["memory_bytes"]
    # fp8 through torchao's torch._scaled_mm runs its GEMMs slower than Transformer Engine's
    fp8 = {r: json.loads(run_cli("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--precision",
                                 "fp8", "--fp8-recipe", r, "--json", cwd=tmp_path, check=True).stdout)
           for r in ("te", "torchao")}
    assert fp8["torchao"]["step_time_s"] > fp8["te"]["step_time_s"]


def test_grad_bucket_copies_stream_four_times_the_gradient_bytes(tmp_path):
    """--grad-bucket-copies (PyTorch DDP's default gradient_as_bucket_view=False): each gradient is
    copied into its bucket and back, a read and a write each way, at the streaming rate (0.88 of the
    A100's 2,039 GB/s, a tuned recipe's: --stack recipe); one device has no replica to reduce with, so
    nothing is copied."""
    def plan(gpus, *extra):
        return json.loads(run_cli("plan", "--model", "gpt2", "--gpu", "a100-sxm4-80gb", "--gpus", gpus, "--seq-len",
                                  "1024", "--global-batch", "64", "--stack", "recipe", *extra, "--json", cwd=tmp_path,
                                  check=True).stdout)

    views, copies = plan("8"), plan("8", "--grad-bucket-copies")
    added = copies["time_breakdown_s"]["memory_bound"] - views["time_breakdown_s"]["memory_bound"]
    assert added == pytest.approx(4 * views["memory_bytes"]["grads"] / (0.88 * 2039e9), rel=1e-6)
    assert copies["layout_detail"]["grad_bucket_copies"] is True
    assert plan("1", "--grad-bucket-copies")["step_time_s"] == plan("1")["step_time_s"]


def test_plan_readable_output(tmp_path):
    proc = run_cli("plan", "--model", "gpt2", "--gpu", "a100-sxm4-80gb", "--gpus", "1", "--global-batch", "8",
                   cwd=tmp_path, check=True)
    assert "fits" in proc.stdout and "MFU" in proc.stdout and "step time" in proc.stdout


def test_search_and_deadline(tmp_path):
    proc = run_cli("plan", "--search", "--model", "llama3.1-405b", "--gpus", "16384", "--seq-len", "8192",
                   "--global-batch", "2048", "--json", cwd=tmp_path, check=True)
    d = json.loads(proc.stdout)
    assert d["ranked"] and d["search_s"] < 5 and d["why"]
    proc = run_cli("plan", "--deadline", "14d", "--tokens", "1e12", "--model", "llama3-8b", cwd=tmp_path, check=True)
    assert "recommendation:" in proc.stdout


def test_validate_reference_file(tmp_path):
    parts = REFERENCE.with_name("published_runs_hardware.toml")
    proc = run_cli("plan", "validate", str(REFERENCE), "--hardware-file", str(parts), "--json", cwd=tmp_path,
                   check=True)
    # the whole file, once: strict RFC 8259 JSON (no NaN or Infinity on any row)
    d = json.loads(proc.stdout, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    ref = d["by_split"]["reference"]
    assert ref["counts"] == {"rows": 43, "predicted": 43, "not_modelled": 0}
    assert ref["summary"]["memory"]["median_abs_error"] <= 0.10
    assert ref["summary"]["step_time"]["median_abs_error"] <= 0.10
    assert ref["summary"]["throughput"]["median_abs_error"] <= 0.10
    # every row is either predicted or says why not; the counts add up over the splits
    assert all(r["predicted"] is not None or r["note"].startswith("not modelled: ") for r in d["rows"])
    assert sum(v["counts"]["rows"] for v in d["by_split"].values()) == d["counts"]["rows"] == len(d["rows"])
    # the readable table, on the reference rows alone (the file's first 43)
    head = tmp_path / "reference.csv"
    head.write_text("\n".join(REFERENCE.read_text().splitlines()[:44]) + "\n")
    proc = run_cli("plan", "validate", str(head), cwd=tmp_path, check=True)
    assert "| MEG-01 |" in proc.stdout and "median abs error" in proc.stdout
    assert "| reference | 43 | 43 (100%) |" in proc.stdout


def test_inference_and_hf_config(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
                               "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522}))
    proc = run_cli("plan", "--hf-config", str(cfg), "--inference", "--batch", "4", "--context", "512", "--json",
                   cwd=tmp_path, check=True)
    assert json.loads(proc.stdout)["fits"] is True


@pytest.mark.parametrize("args,needle", [
    (["--model", "llama3-9b"], "did you mean llama3-8b"),
    (["--gpu", "h100-sxn"], "did you mean h100-sxm"),
    (["--gpus", "6", "--tp", "3"], "does not divide the 32 attention heads"),
    (["--gpus", "8", "--tp", "2", "--pp", "2", "--dp", "4"], "does not equal --gpus 8"),
    (["--gpus", "8", "--global-batch", "12", "--micro-batch", "2"], "does not divide the global batch 12"),
    (["validate", "/no/such.csv"], "does not exist"),
    (["--deadline", "14d"], "needs --tokens"),
    (["--tokens", "1e12", "--goodput", "1.5"], "--goodput must be above 0 and at most 1"),
    (["--gpu", "h100-sxm", "--precision", "fp4"], "h100-sxm has no published fp4 peak"),
])
def test_bad_input_is_one_sentence(args, needle, tmp_path):
    proc = run_cli("plan", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr + proc.stdout


def test_user_hardware_file_end_to_end(tmp_path):
    parts = tmp_path / "parts.toml"
    parts.write_text('[accelerator.h100-96gb-500w]\nbase = "h100-sxm"\nmem_gb = 96\ntdp_w = 500\n'
                     'aliases = ["H100 96GB 500W"]\n')
    proc = run_cli("plan", "--hardware-file", str(parts), "--gpu", "H100 96GB 500W", "--gpus", "8", "--json",
                   cwd=tmp_path, check=True)
    d = json.loads(proc.stdout)
    assert d["hardware"] == "h100-96gb-500w" and d["device_memory_bytes"] == 96 * 2**30
    assert d["power_w_per_device"] <= 500
    # overrides on the command line give the same part without a file; the 500 W cap runs slower
    # clocks than the 700 W part (calibration.power_cap_clock_fraction)
    over = json.loads(run_cli("plan", "--gpu", "h100-sxm", "--memory-gb", "96", "--tdp-w", "500", "--gpus", "8",
                              "--json", cwd=tmp_path, check=True).stdout)
    assert over["device_memory_bytes"] == 96 * 2**30 and over["step_time_s"] == pytest.approx(d["step_time_s"])
    full = json.loads(run_cli("plan", "--gpu", "h100-sxm", "--gpus", "8", "--json", cwd=tmp_path, check=True).stdout)
    assert full["step_time_s"] < d["step_time_s"]
    # a validation row may name the part; the file's other rows are predicted as usual
    rows = REFERENCE.read_text().splitlines()
    row = rows[1].replace("A100-80GB", "H100 96GB 500W").replace("MEG-01", "USER-01")
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join([rows[0], rows[1], row]) + "\n")
    out = json.loads(run_cli("plan", "validate", str(csv), "--hardware-file", str(parts), "--json",
                             cwd=tmp_path, check=True).stdout)
    assert out["counts"] == {"rows": 2, "predicted": 2, "not_modelled": 0}
    plain = json.loads(run_cli("plan", "validate", str(csv), "--json", cwd=tmp_path, check=True).stdout)
    assert plain["counts"]["not_modelled"] == 1 and "unknown accelerator" in plain["rows"][1]["note"]
    # a second file adds its parts to the first's: a row naming each is predicted
    more = tmp_path / "more.toml"
    more.write_text('[accelerator.a100-80gb-300w]\nbase = "a100-sxm4-80gb"\ntdp_w = 300\naliases = ["A100 300W"]\n')
    csv.write_text("\n".join([rows[0], row, rows[1].replace("A100-80GB", "A100 300W")]) + "\n")
    both = json.loads(run_cli("plan", "validate", str(csv), "--hardware-file", str(parts), "--hardware-file",
                              str(more), "--json", cwd=tmp_path, check=True).stdout)
    assert both["counts"] == {"rows": 2, "predicted": 2, "not_modelled": 0}
    parts.write_text("[accelerator.h100-96gb-500w\n")
    proc = run_cli("plan", "--hardware-file", str(parts), cwd=tmp_path)
    assert proc.returncode == 2 and "is not TOML" in proc.stderr and "Traceback" not in proc.stderr


def test_a_traced_model_is_planned_eagerly_by_default_and_compiled_with_kernels_fused(tmp_path):
    def plan(*extra):
        return json.loads(run_cli("plan", "--model", "gpt", "--batch-size", "4", "--gpu", "h100-sxm", "--json",
                                  *extra, cwd=tmp_path, check=True).stdout)
    default, eager, fused = plan(), plan("--kernels", "eager"), plan("--kernels", "fused")
    assert default["step_time_s"] == eager["step_time_s"]
    # the same GEMMs and attention; the memory-bound ops between them fused, views free
    assert fused["time_breakdown_s"]["compute"] == eager["time_breakdown_s"]["compute"]
    assert fused["time_breakdown_s"]["memory"] < eager["time_breakdown_s"]["memory"]
    assert fused["step_time_s"] < eager["step_time_s"]
    assert fused["memory_bytes"] == eager["memory_bytes"]
    assert any(n.startswith("compiled: ") for n in fused["notes"])


def test_an_unmeasured_plan_is_a_typical_stacks_and_says_so(tmp_path):
    """No measurement: kernels at calibration.TYPICAL_STACK_EFFICIENCY of a tuned recipe's rates,
    which --stack recipe keeps whole; one device of a large batch is all kernel time (a GEMM's
    fixed cost aside), so the step is 1 / that share longer."""
    from tensorpilot.plan.calibration import TYPICAL_STACK_EFFICIENCY

    def plan(*extra):
        return json.loads(run_cli("plan", "--model", "mpt-1b", "--gpu", "h100-sxm", "--gpus", "1", "--seq-len",
                                  "4096", "--global-batch", "8", "--micro-batch", "8", *extra, "--json", cwd=tmp_path,
                                  check=True).stdout)

    typical, recipe = plan(), plan("--stack", "recipe")
    assert typical["step_time_s"] == plan("--stack", "typical")["step_time_s"]
    assert recipe["step_time_s"] == plan("--stack-efficiency", "1")["step_time_s"]
    assert typical["step_time_s"] * TYPICAL_STACK_EFFICIENCY == pytest.approx(recipe["step_time_s"], rel=1e-3)
    assert any("--stack recipe" in n for n in typical["notes"])
    bad = run_cli("plan", "--stack", "recipe", "--stack-efficiency", "0.7", cwd=tmp_path)
    assert bad.returncode == 2 and "say the same thing" in bad.stderr and "Traceback" not in bad.stderr


def test_an_odd_vocabulary_is_named_with_the_flag_that_pads_it(tmp_path):
    """GPT-2's 50,257-column output layer on an H100: the plan says its GEMMs run unaligned and
    names --vocab-multiple, which, pasted, plans the padded layer faster; a bad multiple is one
    sentence."""
    def plan(*extra):
        return json.loads(run_cli("plan", "--model", "gpt2", "--gpu", "h100-sxm", "--gpus", "1", "--seq-len", "1024",
                                  "--global-batch", "8", "--micro-batch", "8", *extra, "--json", cwd=tmp_path,
                                  check=True).stdout)

    odd = plan()
    note = next(n for n in odd["notes"] if "not a multiple of 8" in n)
    padded = plan(*note.split("(")[-1].split(" plans")[0].split())
    assert padded["step_time_s"] < odd["step_time_s"] and not any("multiple of 8" in n for n in padded["notes"])
    bad = run_cli("plan", "--vocab-multiple", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "vocab_multiple" in bad.stderr and "Traceback" not in bad.stderr
