"""Peak matmul FLOP/s of a device: the one function MFU is computed against.

For now the peak is *measured*: a square matmul at the run's precision, warm-up then the median
of several repeats, on random data, rotating among inputs so caches do not flatter. The result
is cached per (device, dtype, torch version, threads) in the user cache directory. The hardware
catalog (datasheet peaks) plugs in here; until then every MFU says it is against a measured
ceiling, never against an invented number.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True, slots=True)
class Peak:
    flops_per_s: float | None
    source: str                  # e.g. "measured bf16 matmul ceiling (n=2048, median of 5)"


def cache_dir() -> Path:
    """$TENSORPILOT_CACHE, else $XDG_CACHE_HOME/tensorpilot, else ~/.cache/tensorpilot."""
    if os.environ.get("TENSORPILOT_CACHE"):
        return Path(os.environ["TENSORPILOT_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "tensorpilot"


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device.startswith("mps"):
        torch.mps.synchronize()
    elif device.startswith("xpu"):
        torch.xpu.synchronize()


def measure_matmul_flops(device: str, dtype: str, n: int = 2048, repeats: int = 5,
                         min_time_s: float = 0.05) -> float:
    """Median FLOP/s of (n x n) @ (n x n) at ``dtype`` ('fp32', 'tf32', 'bf16', 'fp16')."""
    import torch

    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        mats = [torch.randn(n, n, generator=g).to(device=device, dtype=tdtype) for _ in range(4)]
        out = torch.empty(n, n, device=device, dtype=tdtype)
        torch.mm(mats[0], mats[1], out=out)                        # warm-up
        _sync(device)
        # calibrate the inner count so one timed sample lasts at least min_time_s
        t0 = time.perf_counter()
        torch.mm(mats[1], mats[2], out=out)
        _sync(device)
        one = max(time.perf_counter() - t0, 1e-6)
        inner = max(1, int(min_time_s / one))
        samples = []
        for r in range(repeats):
            _sync(device)
            t0 = time.perf_counter()
            for i in range(inner):
                torch.mm(mats[(r + i) % 4], mats[(r + i + 1) % 4], out=out)
            _sync(device)
            samples.append((time.perf_counter() - t0) / inner)
        return 2 * n**3 / statistics.median(samples)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32


def _key(device: str, dtype: str) -> str:
    import torch

    from tensorpilot.hardware.device import detect

    caps = detect(device)
    return f"{caps.kind}|{caps.name}|{dtype}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def peak_flops(device: str, dtype: str, refresh: bool = False) -> Peak:
    """Peak dense matmul FLOP/s of ``device`` at ``dtype``, measured once and cached."""
    path = cache_dir() / "ceilings.json"
    key = _key(device, dtype)
    try:
        cache = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        cache = {}
    if key in cache and not refresh:
        return Peak(cache[key], f"measured {dtype} matmul ceiling (cached)")
    n = 2048 if device.startswith("cpu") else 8192
    value = measure_matmul_flops(device, dtype, n=n)
    cache[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a re-measurement next time
    return Peak(value, f"measured {dtype} matmul ceiling (n={n}, median of 5)")


def mfu(achieved_flops_per_s: float, peak: Peak) -> float | None:
    """Model FLOPs utilisation; None when the device's peak is unknown."""
    if not peak.flops_per_s:
        return None
    return achieved_flops_per_s / peak.flops_per_s
