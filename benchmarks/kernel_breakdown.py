"""Where a GPU step's device time goes, by kernel class, for models tensorpilot did not write: the
measurement beside `tensorpilot plan`'s compute / memory split of the same step (compiled_steps.py's
models and step, eager).

    python benchmarks/kernel_breakdown.py --models resnet50,hf_gpt2 --out breakdown.json

Per model: 3 warm-up steps, then 3 steps under torch.profiler (CUDA activity); each kernel's
duration summed by class (`tensorpilot profile`'s classes, profiling/breakdown.kernel_class: GEMMs
and convolutions together as matmul_conv), divided by the steps; plus the busiest kernels and the
device's busy time per step. The JSON of the second H100 lease (benchmarks/results/
gpu_h100_20261127b/breakdown.json) was made by this script at 275ad53, which classed by its own
name patterns, kept GEMMs (gemm) apart from convolutions (conv), and also summed the optimizer
step's annotation range that Kineto mirrors onto the device ("Optimizer.step#AdamW.step",
0.3-1.6 ms a step, counted with the elementwise kernels it spans).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def one(name: str, steps: int = 3) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from compiled_steps import make_step
    from tensorpilot.profiling.breakdown import kernel_class
    from tensorpilot.profiling.events import device_kernels

    step, batch = make_step(name)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / steps
    by_class: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    by_name: dict[str, float] = defaultdict(float)
    for k in device_kernels(prof):             # kernels, copies, fills: not annotation ranges
        us = (k.end_ns - k.start_ns) / 1e3
        cls = kernel_class(k.name)
        by_class[cls] += us / steps
        count[cls] += 1
        by_name[k.name[:90]] += us / steps
    busy = sum(by_class.values())
    return {"batch_size": batch, "wall_ms": wall * 1e3, "device_busy_ms": busy / 1e3,
            "ms_by_class": {k: v / 1e3 for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
            "kernels_per_step": {k: v / steps for k, v in count.items()},
            "top": [(k, round(v / 1e3, 3)) for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:15]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,hf_gpt2,convnext_tiny,vit_base")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = {}
    for name in args.models.split(","):
        try:
            out[name] = one(name)
        except Exception as exc:   # noqa: BLE001 - one model's failure is reported, the others run
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(name, json.dumps(out[name])[:1500], flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
