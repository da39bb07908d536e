"""1 vs 2 processes on this machine: data-parallel scaling of `tensorpilot train`, and the measured
gloo all-reduce bandwidth next to what the gradient all-reduce of one step needs.

    python benchmarks/scaling.py            # ~1 minute on the 2-core dev machine

Weak scaling: each process keeps the per-process batch, so 2 processes do twice the work per
step; efficiency = (samples/s with 2) / (2 x samples/s with 1). On a 2-core machine the ceiling
is below 100% by construction: 1 process runs on 2 threads, 2 processes on 1 thread each, and the
gradient all-reduce goes through loopback TCP. Read the number as "cost of DDP here", not as
what a GPU node shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tensorpilot.hardware.probe import allreduce_bus_bandwidth

ARGS = ["--size", "tiny", "--compile", "off", "--precision", "fp32", "--steps", "30", "--batch-size", "16",
        "--train.eval_interval", "1000", "--train.eval_batches", "1", "--no-checkpoint.enabled",
        "--logging.progress", "off", "--no-logging.tensorboard", "--data.max_bytes", "400000"]


def train(nproc: int, run_dir: Path, threads: int) -> dict:
    cmd = [sys.executable, "-m", "tensorpilot", "train", *ARGS, "--nproc", str(nproc), "--run-dir", str(run_dir)]
    subprocess.run(cmd, check=True, capture_output=True, text=True,
                   env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # one thread per process everywhere: the same 2 cores' worth of threads in both runs
        # would be 1 x 2 threads vs 2 x 1; 2 threads in one process contend badly here
        one = train(1, Path(tmp) / "one", threads=1)
        two = train(2, Path(tmp) / "two", threads=1)
    params = one["parameters"]
    grad_bytes = params * 4                                          # fp32 gradients
    bus = allreduce_bus_bandwidth(2, 4 << 20)                        # bytes/s, 4 MiB message
    # ring all-reduce moves 2(n-1)/n of the buffer per rank: the bus-bandwidth convention
    allreduce_s = grad_bytes * 2 * (2 - 1) / 2 / bus
    eff = two["samples_per_s"] / (2 * one["samples_per_s"])
    rows = {
        "tiny gpt parameters": f"{params / 1e6:.2f} M ({grad_bytes / 2**20:.2f} MiB fp32 gradients)",
        "1 process (1 thread)": f"{one['samples_per_s']:.1f} samples/s, step {1 / one['samples_per_s'] * 16 * 1000:.1f} ms",
        "2 processes DDP (1 thread each)": f"{two['samples_per_s']:.1f} samples/s (global batch 32), "
                                           f"step {two['parallel']['step_s'] * 1000:.1f} ms",
        "scaling efficiency (weak)": f"{eff:.0%}",
        "gloo all-reduce bus bandwidth (2 procs, 4 MiB)": f"{bus / 1e9:.2f} GB/s",
        "gradient all-reduce at that bandwidth": f"{allreduce_s * 1000:.2f} ms per step",
    }
    for name, run in (("1 process", one), ("2 processes", two)):
        pred = run.get("predicted") or {}
        if pred.get("step_time_s"):
            rows[f"planner, {name} ({pred['layout']} on {pred['hardware']})"] = (
                f"step {pred['step_time_s'] * 1000:.1f} ms predicted vs {pred['measured_step_time_s'] * 1000:.1f} ms "
                f"measured (measured / predicted {pred['measured_over_predicted']:.2f})")
    width = max(map(len, rows))
    for k, v in rows.items():
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
