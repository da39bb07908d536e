"""torch.profiler's events as plain values: ``Ev`` trees of the host threads (ops, annotations,
autograd nodes) and flat lists of accelerator kernels. The analysis (breakdown.py) reads only
these, so it is tested on hand-made event lists without running anything.

Names the analysis relies on, all written by PyTorch itself or by us:
    "aten::addmm"                                             an operator (self time = its kernel)
    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"   waiting for the next batch
    "Optimizer.step#AdamW.step", "Optimizer.zero_grad#..."   the optimizer (torch.optim annotates)
    "autograd::engine::evaluate_function: AddmmBackward0"    one backward node; its sequence
                                                              number is the forward op's
    "gloo:all_reduce" (a comm thread), "c10d::allreduce_"    collectives
    "tensorpilot.step#3", "tensorpilot.module:blocks.0.attn", "tensorpilot.attention"   ours
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STEP_PREFIX = "tensorpilot.step#"
MODULE_PREFIX = "tensorpilot.module:"
ATTENTION_MARKER = "tensorpilot.attention"       # attention.FastAttention's blocked path


@dataclass(slots=True)
class Ev:
    """One event: [start_ns, end_ns) on thread ``tid``; ``seq`` links a forward op to the
    backward node it created (-1: none)."""

    name: str
    start_ns: int
    end_ns: int
    tid: int = 1
    seq: int = -1
    children: list[Ev] = field(default_factory=list)

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


def ev(name: str, start_us: float, dur_us: float, *children: Ev, seq: int = -1, tid: int = 1) -> Ev:
    """A hand-made event in microseconds (tests, docs): ``ev("aten::mm", 10, 5)``."""
    return Ev(name, int(start_us * 1000), int((start_us + dur_us) * 1000), tid, seq, list(children))


def host_events(prof: Any) -> list[Ev]:
    """The root events of every host thread, as ``Ev`` trees (allocations and Python calls
    dropped; the profiler's own per-op memory records are not events in time)."""
    from torch._C._profiler import _EventType

    def convert(node) -> Ev | None:
        if node.tag not in (_EventType.TorchOp, _EventType.Backend):
            return None
        seq = getattr(node.extra_fields, "sequence_number", -1) if node.tag == _EventType.TorchOp else -1
        kids = [c for c in (convert(k) for k in node.children) if c is not None]
        return Ev(node.name, node.start_time_ns, node.end_time_ns, node.start_tid, seq, kids)

    roots = prof.profiler.kineto_results.experimental_event_tree()
    return [e for e in (convert(r) for r in roots) if e is not None]


def allocations(prof: Any) -> list[tuple[int, int]]:
    """(time ns, bytes: + allocated, - freed) of every allocator event, in time order."""
    from torch._C._profiler import _EventType

    out: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        n = stack.pop()
        if n.tag == _EventType.Allocation:
            out.append((n.start_time_ns, n.extra_fields.alloc_size))
        stack.extend(n.children)
    return sorted(out)


# Kineto activity types of work an accelerator did. Its timeline also carries
# "gpu_user_annotation" events (each record_function range -- our step and module markers --
# mirrored onto the device, spanning the kernels launched inside it) and synchronisation
# records: counted as kernels, a step marker made the whole step look like one elementwise
# kernel (seen on an H100, torch 2.11).
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
# Kineto's CUDA synchronisation records ("Stream Sync", "Context Sync", "Event Sync"; the runtime's
# cuda*Synchronize names), for events without an activity type
SYNC_NAMES = ("Sync", "Synchronize")


def device_kernels(prof: Any) -> list[Ev]:
    """Kernels and copies that ran on an accelerator (CUDA/ROCm/XPU), flat, in time order;
    empty on a CPU-only run. Kineto reports them in microseconds-resolution nanoseconds."""
    from torch.autograd import DeviceType

    devices = (DeviceType.CUDA, getattr(DeviceType, "XPU", DeviceType.CUDA))
    out = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() in devices and is_device_work(e):
            start = e.start_ns()
            out.append(Ev(e.name(), start, start + e.duration_ns(), tid=-1))
    return sorted(out, key=lambda k: k.start_ns)


def is_device_work(event: Any) -> bool:
    """Whether a Kineto event on an accelerator's timeline is a kernel, copy or fill (not an
    annotation range or a synchronisation record)."""
    if event.is_user_annotation():
        return False
    kind = getattr(event, "activity_type", None)
    if kind is None:        # torch 2.11's events have no activity type: sync records by their names
        return not event.name().endswith(SYNC_NAMES) and "Wait Event" not in event.name()
    return kind() in DEVICE_WORK


def steps(roots: list[Ev]) -> list[Ev]:
    """Our per-step markers, in order."""
    return sorted((r for r in roots if r.name.startswith(STEP_PREFIX)), key=lambda r: r.start_ns)
