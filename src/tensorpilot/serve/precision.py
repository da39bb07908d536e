"""Serving precision: run the model in fp32, bf16 or fp16 autocast, or int8 dynamic quantization,
and say what it costs in accuracy.

``auto`` measures instead of guessing: every precision this device runs fast is timed on one
batch and compared with fp32 on a held-out batch; the fastest one that agrees with fp32 on the
top-1 class of at least ``min_agreement`` of the rows (and is >= 1.1x faster) wins. Which one
that is depends on the device: where bf16 has matrix instructions (AMX, Tensor Cores) it is
several times fp32, elsewhere int8 dynamic quantization may win (benchmarks/serve_load.py and
benchmarks/RESULTS.md give the measured figures).
"""

from __future__ import annotations

import copy
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from tensorpilot.errors import ConfigError

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
MIN_SPEEDUP = 1.1   # auto keeps fp32 unless a candidate is at least this much faster


@dataclass(frozen=True, slots=True)
class Accuracy:
    """Change against fp32 on a held-out batch."""

    max_abs_diff: float          # largest |logit - fp32 logit|
    ref_scale: float             # largest |fp32 logit|, to read the difference against
    top1_agreement: float        # share of rows whose argmax equals fp32's
    rows: int

    def describe(self) -> str:
        return (f"top-1 agreement with fp32 {self.top1_agreement:.1%} on {self.rows} held-out rows, "
                f"max |logit diff| {self.max_abs_diff:.3g} (fp32 logits up to {self.ref_scale:.3g})")


@dataclass(kw_only=True)
class Prepared:
    name: str                              # "fp32" | "bf16" | "fp16" | "int8"
    run: Callable[[Any], Any]              # (B, ...) input -> (B, ...) float32 output
    reason: str
    accuracy: Accuracy | None = None       # None for fp32
    timings_s: dict[str, float] | None = None


def _runner(served, module, autocast_dtype: str | None) -> Callable:
    import torch

    device_type = torch.device(served.device).type
    last_only = served.last_position_only

    def run(x):
        with torch.inference_mode():
            if autocast_dtype is None:
                y = module(x)
            else:
                with torch.autocast(device_type, dtype=getattr(torch, autocast_dtype)):
                    y = module(x)
            y = y[:, -1, :] if last_only else y
            return y.float()
    return run


def quantize_int8(module):
    """Dynamic int8 quantization of every nn.Linear (weights int8 ahead of time, activations
    quantized per batch); CPU only. torch.ao.quantization is deprecated in favour of torchao but
    still ships with torch; its deprecation warning is silenced here, not hidden from the report."""
    import torch
    from torch import nn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(copy.deepcopy(module), {nn.Linear}, dtype=torch.qint8)


def _has_linear(module) -> bool:
    from torch import nn

    return any(isinstance(m, nn.Linear) for m in module.modules())


def build(served, name: str) -> Callable:
    """A runner for one precision (fp32 / bf16 / fp16 autocast, int8 dynamic)."""
    import torch

    kind = torch.device(served.device).type
    if name == "fp32":
        return _runner(served, served.module, None)
    if name in ("bf16", "fp16"):
        return _runner(served, served.module, "bfloat16" if name == "bf16" else "float16")
    if name == "int8":
        if kind != "cpu":
            raise ConfigError("--precision int8 (dynamic quantization) runs on CPU only; use fp16 or bf16 on GPUs.")
        if not _has_linear(served.module):
            raise ConfigError("--precision int8 quantizes nn.Linear layers and this model has none.")
        return _runner(served, quantize_int8(served.module), None)
    raise ConfigError(f"unknown precision {name!r}: use {', '.join(PRECISIONS)}.")


def candidates(served, caps) -> list[str]:
    """Precisions worth trying on this device, fp32 first."""
    import torch

    found = ["fp32"]
    if caps.kind == "cpu":
        if caps.cpu_fast_bf16:
            found.append("bf16")
        if _has_linear(served.module) and torch.backends.quantized.engine in ("x86", "fbgemm", "onednn"):
            found.append("int8")
    elif caps.kind == "cuda":
        found.append("bf16" if caps.supports_bf16_fast else "fp16")
    elif caps.kind in ("mps", "xpu"):
        found.append("fp16")
    return found


def accuracy(ref, out) -> Accuracy:
    """Compare (B, ..., classes) outputs: max abs difference and argmax agreement per row."""
    ref, out = ref.float(), out.float()
    agree = (ref.argmax(-1) == out.argmax(-1)).float().mean().item()
    return Accuracy(max_abs_diff=(ref - out).abs().max().item(), ref_scale=ref.abs().max().item(),
                    top1_agreement=agree, rows=int(ref.shape[0]))


def _time_s(run: Callable, x, reps: int = 3) -> float:
    run(x)                                         # first call: allocation, kernel selection
    best = float("inf")
    for _ in range(reps):                          # min of a few: the machine is shared and noisy
        t0 = time.perf_counter()
        run(x)
        best = min(best, time.perf_counter() - t0)
    return best


def prepare(served, requested: str, caps, *, timing_batch: int = 8, held_out_rows: int = 64,
            min_agreement: float = 0.95) -> Prepared:
    """Choose (``auto``) or apply the requested precision and measure its accuracy change."""
    if requested not in PRECISIONS:
        raise ConfigError(f"unknown precision {requested!r}: use {', '.join(PRECISIONS)}.")
    ref_run = build(served, "fp32")
    held_out = served.example(held_out_rows, seed=1)     # never the warm-up/timing batch
    ref = ref_run(held_out)
    if requested != "auto":
        if requested == "fp32":
            return Prepared(name="fp32", run=ref_run, reason="fp32 as requested")
        run = build(served, requested)
        return Prepared(name=requested, run=run, reason=f"{requested} as requested",
                        accuracy=accuracy(ref, run(held_out)))
    x = served.example(timing_batch, seed=0)
    timings = {"fp32": _time_s(ref_run, x)}
    best = Prepared(name="fp32", run=ref_run, reason="")
    rejected = []
    for name in candidates(served, caps)[1:]:
        run = build(served, name)
        acc = accuracy(ref, run(held_out))
        if acc.top1_agreement < min_agreement:
            rejected.append(f"{name} (top-1 agreement {acc.top1_agreement:.1%})")
            continue
        timings[name] = _time_s(run, x)
        if timings[name] * MIN_SPEEDUP <= timings[best.name]:
            best = Prepared(name=name, run=run, reason="", accuracy=acc)
    speed = ", ".join(f"{k} {timings['fp32'] / v:.2f}x" for k, v in timings.items())
    why = f"auto: measured at batch {timing_batch} ({speed} of fp32 speed)"
    if rejected:
        why += f"; rejected for accuracy: {', '.join(rejected)}"
    best.reason = why
    best.timings_s = timings
    return best
