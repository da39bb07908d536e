"""The CPU kernel choices of the built-in gpt, side by side in one process (issue 5, sessions 3-4):

  attention   one gpt-small layer's causal attention, forward + backward, bf16, B 16, H 6, T 256,
              D 64: SDPA (PyTorch's CPU flash kernel) vs ``math_attention`` as one block vs in
              blocks of 128 query rows (the default), eager and compiled; and, eager, the blocks
              masked with ``masked_fill`` (session 3's form) vs the additive bias they use now
  gelu        GeLU forward + backward on the MLP's 4096 x 1536 bf16 activations: the tanh
              approximation (GPT-2's) vs exact erf GeLU (the gpt's now), eager and compiled; and
              x * sigmoid(2z), session 3's compile-friendly form of the tanh approximation

Rounds alternate the variants; each figure is the median over rounds of a median of timed calls,
and the ratios are of those medians.

    python benchmarks/cpu_kernels.py          # ~1 min on 2 cores
"""

from __future__ import annotations

import json
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.nn import functional as F

from benchutil import machine, median
from tensorpilot.attention import blocked_attention as math_attention

HERE = Path(__file__).resolve().parent
B, H, T, D = 16, 6, 256, 64


def masked_fill_attention(q, k, v, block: int = 128):
    """Session 3's math_attention: the same blocks, masked with a masked_fill copy of the scores."""
    T = q.shape[-2]
    rows = torch.arange(T)
    outs = []
    for s in range(0, T, block):
        e = min(s + block, T)
        att = (q[:, :, s:e] / math.sqrt(q.shape[-1])) @ k[:, :, :e].transpose(-2, -1)   # (B, H, e-s, e)
        att = torch.softmax(att.masked_fill(rows[None, :e] > rows[s:e, None], float("-inf")), dim=-1)
        outs.append(att @ v[:, :, :e])
    return torch.cat(outs, dim=2)


def gelu_sigmoid_form(x):
    """0.5 x (1 + tanh z) written as x * sigmoid(2z), z = sqrt(2/pi) (x + 0.044715 x^3)."""
    return x * torch.sigmoid(2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x))


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
        "attention blocks of 128 masked_fill eager": (masked_fill_attention, qkv, g_att),
        "attention sdpa compiled": (torch.compile(sdpa), qkv, g_att),
        "attention one block compiled": (torch.compile(one_block), qkv, g_att),
        "attention blocks of 128 compiled": (torch.compile(blocked), qkv, g_att),
        "gelu tanh eager": (tanh, [h], g_h), "gelu erf eager": (F.gelu, [h], g_h),
        "gelu tanh compiled": (torch.compile(tanh), [h], g_h),
        "gelu erf compiled": (torch.compile(F.gelu), [h], g_h),
        "gelu sigmoid form compiled": (torch.compile(gelu_sigmoid_form), [h], g_h)}
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
        print(f"{k:42s} {v:7.1f} ms")
    ratios = {
        "eager: sdpa / blocks": ms["attention sdpa eager"] / ms["attention blocks of 128 eager"],
        "eager: one block / blocks": ms["attention one block eager"] / ms["attention blocks of 128 eager"],
        "compiled: sdpa / blocks": ms["attention sdpa compiled"] / ms["attention blocks of 128 compiled"],
        "compiled: one block / blocks": ms["attention one block compiled"] / ms["attention blocks of 128 compiled"],
        "eager: masked_fill / bias": ms["attention blocks of 128 masked_fill eager"] / ms["attention blocks of 128 eager"],
        "gelu eager: tanh / erf": ms["gelu tanh eager"] / ms["gelu erf eager"],
        "gelu compiled: tanh / erf": ms["gelu tanh compiled"] / ms["gelu erf compiled"],
        "gelu compiled: sigmoid form / erf": ms["gelu sigmoid form compiled"] / ms["gelu erf compiled"],
        "gelu: erf eager / erf compiled": ms["gelu erf eager"] / ms["gelu erf compiled"]}
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
