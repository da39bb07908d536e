"""Where a GPU step's device time goes, by kernel class, for models tensorpilot did not write: the
measurement beside `tensorpilot plan`'s compute / memory split of the same step (compiled_steps.py's
models and loop, eager).

    python benchmarks/kernel_breakdown.py --models resnet50,hf_gpt2 --out breakdown.json

Per model: 3 warm-up steps, then 3 steps under torch.profiler (CUDA activity); each kernel's
duration summed by class, divided by the steps: GEMMs (cuBLAS / CUTLASS / nvjet), convolutions
(cuDNN), attention (flash / memory-efficient), copies and fills, everything else (elementwise and
reductions); plus the busiest kernels and the device's idle share of the step's wall time.
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

CLASSES = (  # first match wins, on the lower-cased kernel name
    ("attention", ("flash", "fmha", "attention", "efficient_attention")),
    ("conv", ("conv", "fprop", "dgrad", "wgrad", "implicit_gemm", "winograd", "cudnn")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "sm80_", "splitk", "gemv")),
    ("copy", ("memcpy", "memset")),
)


def classify(name: str) -> str:
    low = name.lower()
    for cls, keys in CLASSES:
        if any(k in low for k in keys):
            return cls
    return "elementwise/reduction"


def one(name: str, steps: int = 3) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from compiled_steps import MODELS
    import user_models
    from tensorpilot.modelplan.sources import Loss

    factory, shape, dtype, batch = MODELS[name]
    torch.manual_seed(0)
    model = getattr(user_models, factory)().cuda().train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    dims = tuple(int(d) for d in shape.split(","))
    x = torch.randint(0, 256, (batch, *dims), device="cuda") if dtype == "int64" else \
        torch.randn((batch, *dims), device="cuda")
    loss_fn = Loss("ce")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = loss_fn(out if isinstance(out, torch.Tensor) else out.logits, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
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
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.time_range.elapsed_us()
        cls = classify(e.name)
        by_class[cls] += us / steps
        count[cls] += 1
        by_name[e.name[:90]] += us / steps
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
