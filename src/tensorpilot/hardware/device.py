"""Device choice and capability flags.

:class:`DeviceCaps` is a plain value so that decisions made from it (precision, fused
optimizer, compile) are testable with fake profiles: a test builds ``DeviceCaps(kind="cuda",
cuda_capability=(7, 0))`` for a V100 without touching a GPU.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from functools import lru_cache

from tensorpilot.errors import ConfigError


@dataclass(frozen=True, slots=True)
class DeviceCaps:
    kind: str                                  # "cpu" | "cuda" | "mps" | "xpu"
    name: str = "unknown"
    index: int | None = None
    cuda_capability: tuple[int, int] | None = None   # (major, minor), CUDA and ROCm builds
    is_rocm: bool = False
    cpu_flags: frozenset[str] = field(default_factory=frozenset)
    memory_bytes: int | None = None

    @property
    def torch_device(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"

    @property
    def cpu_fast_bf16(self) -> bool:
        """AVX512-BF16 or AMX: the CPU has bf16 dot-product instructions (our Tensor Cores)."""
        return bool(self.cpu_flags & {"avx512_bf16", "amx_bf16"})

    @property
    def supports_bf16_fast(self) -> bool:
        if self.kind == "cpu":
            return self.cpu_fast_bf16
        if self.kind == "cuda":
            # Ampere (sm_80) and newer have bf16 Tensor Cores; ROCm MI200+ (gfx90a) report 9.x.
            return self.cuda_capability is not None and self.cuda_capability >= (8, 0)
        if self.kind == "xpu":
            return True
        return False  # MPS: bf16 works on recent macOS but is not faster than fp16

    @property
    def supports_tf32(self) -> bool:
        return self.kind == "cuda" and not self.is_rocm and (self.cuda_capability or (0, 0)) >= (8, 0)


def cpu_flags() -> frozenset[str]:
    """ISA flags of this CPU from /proc/cpuinfo (Linux); empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _available(kind: str) -> bool:
    import torch

    if kind == "cpu":
        return True
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return torch.backends.mps.is_available()
    if kind == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    return False


def resolve_device(requested: str = "auto") -> str:
    """'auto' -> cuda (incl. ROCm) > mps > xpu > cpu; an explicit device must be present."""
    from tensorpilot.config import check_device_name

    check_device_name(requested)
    if requested == "auto":
        for kind in ("cuda", "mps", "xpu"):
            if _available(kind):
                return kind
        return "cpu"
    kind = requested.split(":")[0]
    if not _available(kind):
        raise ConfigError(f"device {requested!r} was requested but is not available on this machine.")
    if kind in ("cuda", "xpu") and ":" in requested:
        import torch

        index = int(requested.split(":")[1])
        count = torch.cuda.device_count() if kind == "cuda" else torch.xpu.device_count()
        if index >= count:
            raise ConfigError(f"device {requested!r} does not exist: this machine has {count}.")
    return requested


@lru_cache(maxsize=None)
def detect(device: str) -> DeviceCaps:
    """Capabilities of a resolved torch device string such as 'cpu' or 'cuda:0'."""
    import torch

    kind, _, idx = device.partition(":")
    index = int(idx) if idx else None
    if kind == "cuda":
        i = index if index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(i)
        return DeviceCaps(kind="cuda", name=props.name, index=index,
                          cuda_capability=(props.major, props.minor),
                          is_rocm=torch.version.hip is not None,
                          memory_bytes=props.total_memory)
    if kind == "cpu":
        mem = None
        try:
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
        return DeviceCaps(kind="cpu", name=cpu_name(), cpu_flags=cpu_flags(), memory_bytes=mem)
    return DeviceCaps(kind=kind, name=kind, index=index)


# ------------------------------------------------------------------------- CPU facts

def _cpuinfo_field(name: str) -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.split(":")[0].strip() == name:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_cores() -> int:
    """CPUs this process may run on (affinity), which is what its threads can use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cpu_clock_hz() -> tuple[float | None, str]:
    """(Hz, where from): cpufreq's maximum if exposed, else /proc/cpuinfo's current 'cpu MHz'
    (virtual machines often expose only the nominal clock; boost may run higher)."""
    try:
        khz = int(open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read())
        return khz * 1e3, "cpufreq cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    mhz = _cpuinfo_field("cpu MHz")
    if mhz:
        return float(mhz) * 1e6, "/proc/cpuinfo cpu MHz (nominal; boost may be higher)"
    return None, "unknown"


def numa_nodes() -> int:
    try:
        return len([p for p in os.listdir("/sys/devices/system/node") if p.startswith("node") and p[4:].isdigit()])
    except OSError:
        return 1


def fma_units_per_core(flags: frozenset[str]) -> int:
    """FMA pipes at the widest vector width: AMD family 25 (Zen 3/4) executes 512-bit ops on two
    256-bit pipes (= one 512-bit FMA per cycle); Zen 5 (family 26) and Intel Xeon Scalable Gold/
    Platinum have two 512-bit FMA units (assumed for other Intel parts too)."""
    vendor, family = _cpuinfo_field("vendor_id"), _cpuinfo_field("cpu family")
    if vendor == "AuthenticAMD" and family == "25" and "avx512f" in flags:
        return 1
    return 2


def cpu_estimate(dtype: str):
    """Estimated peak of this CPU for ``dtype`` (a CpuPeakEstimate, labelled 'estimate:')."""
    from tensorpilot.hardware.catalog import CpuPeakEstimate, cpu_peak_flops

    clock, _ = cpu_clock_hz()
    flags = cpu_flags()
    if clock is None:
        return CpuPeakEstimate(None, None, "estimate: unknown (no CPU clock exposed)")
    return cpu_peak_flops(cpu_cores(), clock, flags, dtype, fma_units=fma_units_per_core(flags))


NOTABLE_CPU_FLAGS = ("sse2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                     "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "sve")


def gpu_topology(index: int) -> dict:
    """NVLink links and their state through NVML (nvidia-ml-py, optional); {} without it."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        active = 0
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                active += pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
            except pynvml.NVMLError:
                break
        return {"nvlink_active_links": active, "driver": str(pynvml.nvmlSystemGetDriverVersion())}
    except Exception:  # noqa: BLE001 - NVML missing or unsupported: topology unknown
        return {}
