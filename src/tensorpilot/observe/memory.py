"""Peak memory of a run, measured for real and labelled with how."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def reset_peak(device: str) -> None:
    """Start measuring the peak afresh (e.g. after autotune's trials, whose largest micro-batch is
    not the run's). CUDA: the allocator's peak. Linux: the process's peak resident set size
    (writing 5 to /proc/self/clear_refs resets VmHWM, proc(5), Linux >= 4.0); elsewhere the
    process peak cannot be reset and stays an upper bound."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    elif device.startswith("cpu") and _CLEAR_REFS.exists():
        try:
            _CLEAR_REFS.write_text("5")
        except OSError:
            pass


def _vm_hwm() -> int | None:
    """The process's peak resident set size in bytes since start or the last reset (Linux)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024                   # reported in kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_memory(device: str) -> tuple[int | None, str]:
    """(bytes, method). CUDA: allocator peak. Elsewhere: the process's peak resident set size,
    which includes the Python interpreter, torch's libraries and the data (an upper bound)."""
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"
    if device.startswith("mps"):
        return int(torch.mps.driver_allocated_memory()), "torch.mps.driver_allocated_memory"
    hwm = _vm_hwm()
    if hwm is not None:
        return hwm, "process peak RSS (VmHWM)"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024          # macOS reports bytes, Linux KiB
    return int(rss * scale), "process peak RSS (getrusage ru_maxrss)"
