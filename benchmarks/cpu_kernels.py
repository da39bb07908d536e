"""The CPU kernel choices of the built-in gpt, side by side in one process (session 3 of issue 5):

  attention   one gpt-small layer's causal attention, forward + backward, bf16, B 16, H 6, T 256,
              D 64: SDPA (PyTorch's CPU flash kernel) vs ``math_attention`` as one block vs in
              blocks of 128 query rows (the default), eager and compiled
  gelu        GeLU (tanh approximation) forward + backward on the MLP's 4096 x 1536 bf16
              activations, compiled: ``F.gelu(approximate="tanh")`` vs ``gpt.gelu_tanh`` (which
              compiles to x * sigmoid(2z))

Rounds alternate the variants; each figure is the median over rounds of a median of timed calls,
and the ratios are of those medians.

    python benchmarks/cpu_kernels.py          # ~1 min on 2 cores
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.nn import functional as F

from benchutil import machine, median
from tensorpilot.workloads.gpt import gelu_tanh, math_attention

HERE = Path(__file__).resolve().parent
B, H, T, D = 16, 6, 256, 64


def timed(fn, args, grad, calls: int = 5) -> float:
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(*args).backward(grad)
        ts.append(time.perf_counter() - t0)
    return median(ts)


def main() -> int:
    torch.manual_seed(0)
    qkv = [torch.randn(B, H, T, D).bfloat16().requires_grad_() for _ in range(3)]
    g_att = torch.randn(B, H, T, D).bfloat16()
    h = torch.randn(B * T, 6 * D * 4).bfloat16().requires_grad_()      # (4096, 1536)
    g_h = torch.randn_like(h)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    one_block = lambda q, k, v: math_attention(q, k, v, 0.0, block=T)
    blocked = lambda q, k, v: math_attention(q, k, v, 0.0)
    tanh = lambda x: F.gelu(x, approximate="tanh")
    variants = {
        "attention sdpa eager": (sdpa, qkv, g_att), "attention one block eager": (one_block, qkv, g_att),
        "attention blocks of 128 eager": (blocked, qkv, g_att),
        "attention sdpa compiled": (torch.compile(sdpa), qkv, g_att),
        "attention one block compiled": (torch.compile(one_block), qkv, g_att),
        "attention blocks of 128 compiled": (torch.compile(blocked), qkv, g_att),
        "gelu tanh compiled": (torch.compile(tanh), [h], g_h),
        "gelu sigmoid form compiled": (torch.compile(gelu_tanh), [h], g_h)}
    for fn, args, g in variants.values():                                # compile + warm up
        for _ in range(2):
            fn(*args).backward(g)
    rounds: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(11):
        for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
            fn, args, g = variants[name]
            rounds[name].append(timed(fn, args, g))
    ms = {k: median(v) * 1e3 for k, v in rounds.items()}
    for k, v in ms.items():
        print(f"{k:34s} {v:7.1f} ms")
    ratios = {
        "eager: sdpa / blocks": ms["attention sdpa eager"] / ms["attention blocks of 128 eager"],
        "eager: one block / blocks": ms["attention one block eager"] / ms["attention blocks of 128 eager"],
        "compiled: sdpa / blocks": ms["attention sdpa compiled"] / ms["attention blocks of 128 compiled"],
        "compiled: one block / blocks": ms["attention one block compiled"] / ms["attention blocks of 128 compiled"],
        "gelu compiled: tanh / sigmoid form": ms["gelu tanh compiled"] / ms["gelu sigmoid form compiled"]}
    for k, v in ratios.items():
        print(f"{k:36s} {v:.2f}x")
    out = HERE / "results" / "cpu_kernels.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "cpu_kernels", "date": datetime.now(timezone.utc).isoformat(
        timespec="seconds"), "command": "python benchmarks/cpu_kernels.py", "machine": machine(),
        "ms": ms, "ratios": ratios}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
