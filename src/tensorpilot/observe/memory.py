"""Peak memory of a run, measured for real and labelled with how."""

from __future__ import annotations

import resource
import sys


def reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak_memory(device: str) -> tuple[int | None, str]:
    """(bytes, method). CUDA: allocator peak. Elsewhere: the process's peak resident set size,
    which includes the Python interpreter, torch's libraries and the data (an upper bound)."""
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"
    if device.startswith("mps"):
        return int(torch.mps.driver_allocated_memory()), "torch.mps.driver_allocated_memory"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024          # macOS reports bytes, Linux KiB
    return int(rss * scale), "process peak RSS (getrusage ru_maxrss)"
