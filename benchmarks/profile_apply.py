"""Does the fix a `tensorpilot profile` finding names actually speed the run up? For each
deliberately bottlenecked run, `tensorpilot profile --apply` measures the step with and without
the top finding's flag in one invocation; this prints the ratios (time per sample before / after,
so a flag that changes the samples per step is compared fairly) and writes
benchmarks/results/profile_apply.json.

    python benchmarks/profile_apply.py              # ~4 min on 2 cores

Each run is the real CLI in a subprocess with one intra-op thread (OMP_NUM_THREADS=1): on a small
shared machine an OpenMP region waiting for a descheduled thread is noise, not a bottleneck.
The bottlenecked models are the same as tests/integration/test_profile.py's. The load of other
processes shows as each run's ``cpu_queue_wait_s`` (run-queue time of the training thread per
profiled step); the arms of one case run back to back in one invocation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchutil import machine

BOTTLENECKS = Path(__file__).parent / "bottlenecks.py"      # the models of the cases

GPT = ["--model.n_layer", "2", "--model.d_model", "64", "--model.n_head", "2", "--data.max_bytes", "400000"]
COMMON = ["--compile", "off", "--steps", "8", "--warmup", "3", "--no-train.predict"]
CASES = {
    "data loader stall (2 ms/sample, batch 8)": ["--model", "bottlenecks:slow_data", "--batch-size", "8"],
    "96 tiny layers at batch 1": ["--model", "bottlenecks:tiny_layers", "--batch-size", "1"],
    "gpt, SDPA math path (dropout), fp32": [*GPT, "--model.seq_len", "256", "--batch-size", "8", "--precision", "fp32",
                                            "--engine.attention", "sdpa", "--model.dropout", "0.1"],
    "gpt, seq 128, fp32, SDPA kernels": [*GPT, "--model.seq_len", "128", "--batch-size", "8", "--precision", "fp32",
                                         "--engine.attention", "sdpa"],
    "the same with activation checkpointing": [*GPT, "--model.seq_len", "128", "--batch-size", "8", "--precision",
                                               "fp32", "--engine.attention", "sdpa", "--engine.activation_checkpointing"],
    "gpt tiny in fp32": ["--precision", "fp32", "--batch-size", "16"],
    "2 gloo processes, 3.1 M-parameter mlp at batch 2": ["--model", "mlp", "--model.hidden", "1024,1024,1024",
                                                          "--data.input_shape", "1024", "--batch-size", "2",
                                                          "--precision", "fp32", "--nproc", "2"],
}


def run_case(args: list[str], cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tensorpilot", "profile", *args, *COMMON, "--apply", "--json",
                           "--out", "out"], cwd=cwd, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    r = json.loads(proc.stdout)
    return {"findings": [(f["kind"], round(f["share_of_step"], 3)) for f in r["findings"]],
            "profiler_overhead": r["profiler_overhead"], "apply": r.get("apply"),
            "step_s": r["step_time_s"]["unprofiled"], "cpu_queue_wait_s": r.get("cpu_queue_wait_s")}


def main() -> None:
    results = {"machine": machine(), "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        shutil.copy(BOTTLENECKS, cwd / "bottlenecks.py")
        for name, args in CASES.items():
            res = run_case(args, cwd)
            results["cases"][name] = res
            a = res.get("apply") or {}
            top = res["findings"][0] if res.get("findings") else None
            if "error" in res:
                line = f"error: {res['error']}"
            elif not a.get("applied"):
                line = f"findings {res['findings']}: nothing applied"
            else:
                line = (f"top {top[0]} ({top[1]:.0%}) -> {a['applied']}: {a['before_s_per_sample'] * 1e3:.3f} -> "
                        f"{a['after_s_per_sample'] * 1e3:.3f} ms/sample, {a['speedup_per_sample']:.2f}x; "
                        f"profiler overhead {res['profiler_overhead']:+.0%}, waited for a CPU "
                        f"{res['cpu_queue_wait_s'] * 1e3:.1f} ms/step")
            print(f"{name}: {line}", flush=True)
    out = Path(__file__).parent / "results" / "profile_apply.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
