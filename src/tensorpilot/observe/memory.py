"""Peak memory of a run, measured for real and labelled with how."""

from __future__ import annotations

import contextlib
import os
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


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one storage count once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        if hasattr(t, "to_local"):                     # a DTensor: this process holds its shard
            t = t.to_local()
        try:
            key, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):    # a tensor subclass without one storage
            key, size = id(t), t.numel() * t.element_size()
        if key not in seen:
            seen.add(key)
            total += size
    return total


@contextlib.contextmanager
def _native_stderr_quiet():
    """The profiler's native code writes start/stop markers and "memory block allocated before
    profiling" warnings straight to file descriptor 2; they say nothing to a user, so the
    descriptor points at /dev/null for the one profiled step (Python's own sys.stderr is kept)."""
    try:
        saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    try:
        sys.stderr.flush()
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def profiled_step(step, live_bytes: int, known: set[str] | frozenset = frozenset()
                  ) -> tuple[int, list[tuple[str, float]], str]:
    """Run ``step()`` once under torch.profiler with memory events and return (peak bytes, op
    times, method). The peak is ``live_bytes`` (what the caller knows is allocated before the
    step: parameters, gradients, optimizer state, the batch) plus the largest running sum of the
    allocator's allocation and free events during the step -- the allocator's peak, comparable to
    CUDA's max_memory_allocated. Op times: the total time of each outermost aten op named in
    ``known`` (e.g. "aten::addmm", what a trace recorded; what it calls inside is its own), and
    the self time of other aten ops. The profiler slows the step: it is not a throughput figure."""
    import torch
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with _native_stderr_quiet(), profile(activities=acts, profile_memory=True) as prof:
        step()
    allocs: list[tuple[int, int]] = []
    ops: list[tuple[str, float]] = []

    def walk(nodes, inside: bool):
        for n in nodes:
            if n.tag == _EventType.Allocation:
                allocs.append((n.start_time_ns, n.extra_fields.alloc_size))
                continue
            mine = not inside and n.tag == _EventType.TorchOp and n.name in known
            if not inside and not mine and n.tag == _EventType.TorchOp and n.name.startswith("aten::"):
                child = sum(c.duration_time_ns for c in n.children if c.tag == _EventType.TorchOp)
                ops.append((n.name, max(n.duration_time_ns - child, 0) / 1e9))
            if mine:
                ops.append((n.name, n.duration_time_ns / 1e9))
            walk(n.children, inside or mine)
    walk(prof.profiler.kineto_results.experimental_event_tree(), False)
    allocs.sort()
    running = peak = 0
    for _, size in allocs:
        running += size
        peak = max(peak, running)
    return live_bytes + peak, ops, "allocator events (torch.profiler profile_memory) above the tensors live at step start"
