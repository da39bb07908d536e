"""Which numeric precision to train in, and why.

``choose`` is a pure function of the request and the device's capabilities so that every
branch is tested with fake profiles. The dtype sizes table is the one place that knows them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorpilot.errors import ConfigError
from tensorpilot.hardware.device import DeviceCaps

# bytes per element; the planner (later) and the trainer share this table
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True, slots=True)
class PrecisionChoice:
    name: str                # "fp32" | "tf32" | "bf16" | "fp16"
    autocast: str | None     # torch dtype name for torch.autocast, or None for no autocast
    grad_scaler: bool        # fp16 needs dynamic loss scaling against gradient underflow
    tf32: bool               # allow TF32 matmuls (CUDA Ampere+)
    reason: str

    @property
    def matmul_dtype(self) -> str:
        """dtype whose matmul ceiling bounds this run: the one MFU is measured against."""
        return {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16"}[self.name]


# bf16 is chosen on a CPU only when its measured matmul ceiling beats fp32's by this much: below
# it, fp32 is as fast and keeps full precision (and no casts). CPUs with AVX512-BF16 but no AMX
# run bf16 GEMMs anywhere from ~0.5x to ~4x fp32 depending on the core and oneDNN's kernels
# (benchmarks/RESULTS.md), so the flag alone does not say which is faster.
BF16_MIN_GAIN = 1.10


def choose(requested: str, caps: DeviceCaps, ceilings: dict[str, float] | None = None) -> PrecisionChoice:
    """``ceilings``: measured matmul FLOP/s by dtype ("bf16", "fp32") on this device; with both,
    ``auto`` on a CPU follows the measurement rather than the instruction-set flags."""
    if requested == "auto":
        if caps.kind == "cpu" and caps.supports_bf16_fast and ceilings and ceilings.get("bf16") \
                and ceilings.get("fp32"):
            bf16, fp32 = ceilings["bf16"], ceilings["fp32"]
            measured = f"measured bf16 matmul {bf16 / 1e9:.0f} GFLOP/s vs fp32 {fp32 / 1e9:.0f}"
            if bf16 >= BF16_MIN_GAIN * fp32:
                return PrecisionChoice("bf16", "bfloat16", False, False, f"auto: bf16 autocast, {measured}")
            return PrecisionChoice("fp32", None, False, False,
                                   f"auto: fp32, {measured} (bf16 must be {BF16_MIN_GAIN:.2f}x faster)")
        if caps.supports_bf16_fast:
            why = ("the CPU has AVX512-BF16/AMX bf16 instructions" if caps.kind == "cpu"
                   else f"{caps.name} has bf16 matrix units")
            return PrecisionChoice("bf16", "bfloat16", False, False, f"auto: bf16 autocast because {why}")
        if caps.kind == "cuda":
            return PrecisionChoice("fp16", "float16", True, False,
                                   f"auto: fp16 autocast with loss scaling because {caps.name} "
                                   "(compute capability "
                                   f"{'.'.join(map(str, caps.cuda_capability or ()))}) lacks fast bf16")
        if caps.kind == "mps":
            return PrecisionChoice("fp16", "float16", False, False,
                                   "auto: fp16 autocast because MPS runs fp16 faster than fp32")
        return PrecisionChoice("fp32", None, False, False,
                               "auto: fp32 because this CPU has no bf16 instructions "
                               "(bf16 would be emulated and slower)")
    if requested == "fp32":
        return PrecisionChoice("fp32", None, False, False, "fp32 as requested")
    if requested == "tf32":
        if not caps.supports_tf32:
            raise ConfigError("precision tf32 needs an NVIDIA GPU of compute capability 8.0 or newer.")
        return PrecisionChoice("tf32", None, False, True, "tf32 matmuls as requested")
    if requested == "bf16":
        note = "" if caps.supports_bf16_fast else " (this device has no fast bf16: expect it to be slow)"
        return PrecisionChoice("bf16", "bfloat16", False, caps.supports_tf32, "bf16 autocast as requested" + note)
    if requested == "fp16":
        scaler = caps.kind == "cuda"
        note = " with dynamic loss scaling" if scaler else ""
        return PrecisionChoice("fp16", "float16", scaler, False, f"fp16 autocast{note} as requested")
    raise ConfigError(f"unknown precision {requested!r}: use auto, fp32, tf32, bf16 or fp16.")
