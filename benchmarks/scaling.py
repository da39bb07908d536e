"""1 vs 2 processes on this machine: data-parallel scaling of `tensorpilot train`, and the measured
gloo all-reduce bandwidth next to what the gradient all-reduce of one step needs.

    python benchmarks/scaling.py            # ~1 minute on the 2-core dev machine

Weak scaling: each process keeps the per-process batch, so 2 processes do twice the work per
step; efficiency = (samples/s with 2) / (2 x samples/s with 1). On a 2-core machine the ceiling
is below 100% by construction: 1 process runs on 2 threads, 2 processes on 1 thread each, and the
gradient all-reduce goes through loopback TCP. Read the number as "cost of DDP here", not as
what a GPU node shows. The runs are tensorpilot.bench.scaling's (`tensorpilot bench scaling`
measures the same, plus strong scaling).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tensorpilot.bench.figures import scaling_efficiency
from tensorpilot.bench.scaling import allreduce_bandwidth, gradient_allreduce_s, train, train_command

BATCH, STEPS = 16, 30


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # one thread per process everywhere: the same 2 cores' worth of threads in both runs
        # would be 1 x 2 threads vs 2 x 1; 2 threads in one process contend badly here
        runs = {}
        for n in (1, 2):
            run_dir = Path(tmp) / f"n{n}"
            runs[n] = train(train_command(n, run_dir, batch=BATCH, steps=STEPS, predict=True), run_dir, threads=1)
    one, two = runs[1], runs[2]
    params = one["parameters"]
    bus = allreduce_bandwidth(2)                                     # bytes/s, 4 MiB message
    eff = scaling_efficiency(one["samples_per_s"], two["samples_per_s"], 2)
    rows = {
        "tiny gpt parameters": f"{params / 1e6:.2f} M ({params * 4 / 2**20:.2f} MiB fp32 gradients)",
        "1 process (1 thread)": f"{one['samples_per_s']:.1f} samples/s, step {1 / one['samples_per_s'] * BATCH * 1000:.1f} ms",
        "2 processes DDP (1 thread each)": f"{two['samples_per_s']:.1f} samples/s (global batch {2 * BATCH}), "
                                           f"step {two['parallel']['step_s'] * 1000:.1f} ms",
        "scaling efficiency (weak)": f"{eff:.0%}",
    }
    if bus:
        rows["gloo all-reduce bus bandwidth (2 procs, 4 MiB)"] = f"{bus / 1e9:.2f} GB/s"
        rows["gradient all-reduce at that bandwidth"] = f"{gradient_allreduce_s(params, 2, bus) * 1000:.2f} ms per step"
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
