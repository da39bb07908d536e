"""Where one training step's wall time goes, from its profiler events (events.py). Pure functions
of ``Ev`` values: the tests build events by hand and check the shares against arithmetic.

Categories (a stable vocabulary; profile.json ``breakdown``):

    data_loading   waiting for the next batch: the DataLoader's ``__next__``, inclusive
    host_overhead  what no kernel accounts for: Python, module calls, autograd's engine, dispatch
                   of views and allocations, launches -- the step's wall time minus everything below
    matmul_conv, attention, normalization, elementwise, softmax_loss, optimizer, casts_copies
                   kernel time by op class (on a CPU an op's self time: its time minus the ops it
                   called; on a GPU the kernels' device time)
    communication  collectives the step waits for (exposed); overlapped time is reported beside
    idle           the training thread slept, not for data or peers (CPU: wall minus its running
                   and run-queue time, Linux schedstat; time queued behind other processes is not
                   idle and stays where it happened)

How an op gets its class: annotations first (inside the DataLoader or a collective everything
counts there, inclusive; inside the optimizer's step its ops are optimizer time and its Python
host overhead); then the op's own name
(``classify``); helper ops inside a matmul, attention, normalization or loss op belong to that op
(``aten::copy_`` inside ``aten::addmm`` is the matmul's bias copy), and so do the ops of the
blocked attention path (``tensorpilot.attention`` marker); views and allocations are framework
work, i.e. host overhead. Backward nodes inherit the module (and attention) of the
forward op that created them, through the autograd sequence number.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from tensorpilot.profiling.events import ATTENTION_MARKER, MODULE_PREFIX, Ev

COMPUTE = ("matmul_conv", "attention", "normalization", "elementwise", "softmax_loss", "optimizer",
           "casts_copies")
CATEGORIES = ("data_loading", "host_overhead", *COMPUTE, "communication", "idle")
FRAMEWORK = "framework"                     # views, allocation, shape queries: host overhead
# op classes whose helper ops (copies, fills, reductions they call) are part of their own cost
FAMILIES = ("matmul_conv", "attention", "normalization", "softmax_loss")
# memory-bound by arithmetic intensity on every current device (a few FLOPs per byte at most)
MEMORY_BOUND = ("elementwise", "normalization", "softmax_loss", "casts_copies")

_RULES: tuple[tuple[str, str], ...] = (
    # (class, regex on the op name without "aten::"), first match wins
    ("optimizer", r"_foreach_|_fused_(adam|adamw|sgd|adagrad)"),
    ("attention", r"attention"),
    ("normalization", r"(layer|batch|group|instance|rms)_norm|_batch_norm_|batch_norm_"),
    ("softmax_loss", r"softmax|nll_loss|cross_entropy|mse_loss|l1_loss|binary_cross_entropy|kl_div|"
                     r"huber_loss|ctc_loss"),
    ("matmul_conv", r"^(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|mv|addmv|dot|vdot|einsum|tensordot|"
                    r"_addmm_activation|_scaled_mm|_int_mm|linear_backward)$|conv|mkldnn_linear|_mkldnn_"),
    (FRAMEWORK, r"^(view|_unsafe_view|view_as|reshape|_reshape_alias|t|transpose|permute|expand|expand_as|"
                r"as_strided|squeeze|unsqueeze|select|slice|split|split_with_sizes|chunk|unbind|narrow|"
                r"detach|detach_|alias|lift_fresh|empty|empty_like|empty_strided|new_empty|"
                r"new_empty_strided|resize_|set_|result_type|flatten|unflatten|item|_local_scalar_dense|"
                r"resolve_conj|resolve_neg|is_same_size|requires_grad_|_has_compatible_shallow_copy_type|"
                r"zeros|ones|full|zeros_like|ones_like|full_like|new_zeros|new_ones|new_full|"
                r"scalar_tensor|is_nonzero|size|stride|numel|dim|_to_dense)$"),
    ("casts_copies", r"^(copy_|_to_copy|to|clone|contiguous|cat|stack|_copy_from|_copy_from_and_resize|"
                     r"index_select|embedding|embedding_backward|embedding_dense_backward|gather|scatter|"
                     r"scatter_add|scatter_add_|index|index_put_|_index_put_impl_|index_add_|pad|"
                     r"constant_pad_nd|repeat|flip|roll|narrow_copy|_unsafe_index|masked_select|"
                     r"type_as|_pin_memory|pin_memory)$"),
)
_COMPILED = [(cls, re.compile(rx)) for cls, rx in _RULES]
_COMM = re.compile(r"^(c10d::|gloo:|nccl:|record_param_comms)|reducer::|all_gather|reduce_scatter|all_reduce|"
                   r"allreduce|broadcast_coalesced")


def classify(op: str) -> str:
    """Op class of an aten op name (``"aten::addmm"`` or ``"addmm"``): one of COMPUTE or
    FRAMEWORK. Elementwise ops, activations and reductions -- and any op no rule names -- are
    ``elementwise``."""
    name = op.split("::", 1)[-1].split(".", 1)[0]
    for cls, rx in _COMPILED:
        if rx.search(name):
            return cls
    return "elementwise"


def annotation(name: str) -> str | None:
    """The category of a non-op event that owns all of its time, or None."""
    if name.startswith("enumerate(DataLoader)"):
        return "data_loading"
    if _COMM.search(name):
        return "communication"
    return None


def is_comm_kernel(name: str) -> bool:
    """A collective running on a communication thread or stream (gloo worker, NCCL kernel)."""
    return bool(_COMM.search(name)) or "nccl" in name.lower()


@dataclass
class StepTimes:
    """Seconds of one step (or the typical of several) per category, and beside them."""

    wall_s: float
    seconds: dict[str, float]                        # CATEGORIES -> seconds; they sum to wall_s
    modules: dict[str, float] = field(default_factory=dict)       # module -> kernel seconds
    recompute_s: float = 0.0                         # forward of checkpointed modules rerun in backward
    optimizer_step_s: float = 0.0                    # optimizer.step/zero_grad inclusive (Python too)
    comm_total_s: float = 0.0                        # collectives' own time (exposed + overlapped)
    comm_overlapped_s: float = 0.0
    attention_paths: dict[str, float] = field(default_factory=dict)   # SDPA kernel name -> seconds
    events: dict[str, float] = field(default_factory=dict)   # category -> profiler events recorded there

    def share(self, category: str) -> float:
        return self.seconds.get(category, 0.0) / self.wall_s if self.wall_s > 0 else 0.0


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        elif e > s:
            out.append((s, e))
    return out


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in intervals)


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Intersection of two unions of disjoint intervals."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _gaps(outer: Ev) -> list[tuple[int, int]]:
    """Parts of ``outer`` covered by none of its children: where the thread ran no op."""
    covered = _union([(c.start_ns, c.end_ns) for c in outer.children])
    return _intersect([(outer.start_ns, outer.end_ns)], _complement(covered, outer.start_ns, outer.end_ns))


def _complement(intervals: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    out, cur = [], lo
    for s, e in intervals:
        if s > cur:
            out.append((cur, min(s, hi)))
        cur = max(cur, e)
    if cur < hi:
        out.append((cur, hi))
    return out


class _Walk:
    """One pass over a step's host events, in time order (forward before its backward)."""

    def __init__(self, floor_ns: int = 0):
        self.floor = floor_ns
        self.ns: dict[str, int] = defaultdict(int)
        self.modules: dict[str, int] = defaultdict(int)
        self.recompute_ns = 0
        self.optimizer_ns = 0
        self.paths: dict[str, int] = defaultdict(int)
        self.seq: dict[int, tuple[str | None, str | None]] = {}   # forward seq -> (module, family)
        self.events: dict[str, int] = defaultdict(int)

    def add(self, cls: str, ns: int, module: str | None) -> None:
        self.ns[cls] += ns
        owner = {"optimizer": "(optimizer)", "data_loading": "(data)", "communication": "(communication)"}.get(cls)
        if owner or module:
            self.modules[owner or module] += ns

    def visit(self, e: Ev, family: str | None, module: str | None, backward: bool, recomputing: bool) -> None:
        name = e.name
        if name.startswith(MODULE_PREFIX):
            if backward and not recomputing:         # a checkpointed block's forward, run again
                self.recompute_ns += e.dur_ns
                recomputing = True
            module = name[len(MODULE_PREFIX):]
        elif name.startswith("autograd::engine::evaluate_function"):
            backward = True
            mod, fam = self.seq.get(e.seq, (None, None))
            module = mod or module
            family = fam if fam == "attention" else None
        elif name == ATTENTION_MARKER:                # SDPA routed to blocked matmuls: its ops
            family = "attention"
            self.paths["blocked matmuls (engine.attention)"] += e.dur_ns
        elif name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
            if family != "optimizer":                 # its kernels are optimizer time, its Python host
                self.optimizer_ns += e.dur_ns
            family, module = "optimizer", "(optimizer)"
        elif family is None and (cat := annotation(name)) is not None:
            self.add(cat, e.dur_ns, module)           # its whole time, Python inside included
            self.events[cat] += _count(e)
            return
        elif name.startswith("aten::"):
            own = classify(name)
            self.events[(family or own) if own != FRAMEWORK else "host_overhead"] += 1
            if own != FRAMEWORK:
                cls = family or own
                self_ns = max(e.dur_ns - sum(c.dur_ns for c in e.children) - self.floor, 0)
                self.add(cls, self_ns, module)
                if own == "attention" and name != "aten::scaled_dot_product_attention":
                    self.paths[name] += e.dur_ns          # the kernel SDPA chose (math, flash, ...)
            if e.seq >= 0 and not backward:
                self.seq.setdefault(e.seq, (module, family or (own if own == "attention" else None)))
            if family is None and own in FAMILIES:
                family = own
        if not name.startswith("aten::"):
            self.events["host_overhead"] += 1        # autograd nodes, module ranges: recorded on the host
        for c in e.children:
            self.visit(c, family, module, backward, recomputing)


def _count(e: Ev) -> int:
    return 1 + sum(_count(c) for c in e.children)


def cpu_step(step: Ev, comm: list[Ev] = (), blocked_ns: int | None = None, floor_ns: int = 0) -> StepTimes:
    """The breakdown of one step run on the host: ``step`` is our step marker on the training
    thread, ``comm`` the collectives other threads ran meanwhile (gloo's workers), ``blocked_ns``
    the part of the step the training thread slept (wall minus running and run-queue time),
    ``floor_ns`` the self time of the smallest op under the profiler (dispatch, allocation and
    recording of a 16-element add): every op's self time beyond it is kernel time, up to it is
    dispatch, i.e. host overhead. It matters for tiny ops only: for a 1 x 16 @ 16 x 16 matmul
    the floor is nearly all of it, for a millisecond matmul a rounding error.

    Exposed communication = collective time on the training thread (enqueueing, DDP's bucket
    copies) plus the time collectives ran while the training thread ran no op (it waited for
    them); the rest of the collectives' time overlapped the step's work."""
    w = _Walk(floor_ns)
    for c in step.children:
        w.visit(c, None, None, False, False)
    wall = step.dur_ns
    comm_iv = _intersect(_union([(c.start_ns, c.end_ns) for c in comm]), [(step.start_ns, step.end_ns)])
    waited = _length(_intersect(comm_iv, _gaps(step)))
    w.ns["communication"] += waited
    accounted = sum(w.ns.values())
    host = max(wall - accounted, 0)
    idle = 0
    if blocked_ns is not None:
        # sleeping not for data or peers (both already counted) is idle
        idle = min(max(blocked_ns - w.ns["data_loading"] - waited, 0), host)
    seconds = {c: w.ns.get(c, 0) / 1e9 for c in CATEGORIES}
    seconds["host_overhead"] = (host - idle) / 1e9
    seconds["idle"] = idle / 1e9
    return StepTimes(wall / 1e9, seconds, {k: v / 1e9 for k, v in w.modules.items()}, w.recompute_ns / 1e9,
                     w.optimizer_ns / 1e9, _length(comm_iv) / 1e9, max(_length(comm_iv) - waited, 0) / 1e9,
                     {k: v / 1e9 for k, v in w.paths.items() if v}, dict(w.events))


def kernel_class(name: str) -> str:
    """Op class of an accelerator kernel by its name (cuBLAS/CUTLASS GEMMs, cuDNN convolutions,
    flash/efficient attention, NCCL, PyTorch's own elementwise and reduction kernels)."""
    low = name.lower()
    if "nccl" in low:
        return "communication"
    if any(k in low for k in ("flash", "fmha", "attention", "attn")):
        return "attention"
    # cuBLAS 12.x/13 names its Hopper and Blackwell GEMMs nvjet_* (nvjet_tst_..., nvjet_hsh_...), its
    # CUDA-core fallbacks for thin shapes gemv*/gemmSN*/dot_kernel, and its split-K epilogue
    # splitKreduce_kernel: none says "gemm" where the GEMM is on the tensor cores
    if any(k in low for k in ("gemm", "cutlass", "cublas", "xmma", "wgmma", "conv", "cudnn", "matmul", "nvjet",
                              "gemv", "splitkreduce", "dot_kernel")):
        return "matmul_conv"
    if "norm" in low:
        return "normalization"
    if any(k in low for k in ("softmax", "nll_loss", "cross_entropy", "log_softmax")):
        return "softmax_loss"
    if any(k in low for k in ("adam", "multi_tensor", "foreach", "sgd")):
        return "optimizer"
    if any(k in low for k in ("memcpy", "copy", "cast", "cat", "index", "gather", "scatter", "embedding")):
        return "casts_copies"
    return "elementwise"


def gpu_step(step: Ev, kernels: list[Ev]) -> StepTimes:
    """The breakdown of one step on an accelerator, from the device timeline: kernel time by
    class (scaled to the union of busy time, since streams overlap), exposed communication =
    NCCL time not overlapped by compute kernels, data loading = the host's DataLoader time
    (the device starves while the host waits for a batch), host overhead = the rest of the wall
    time, when the device had nothing queued (launch- or Python-bound)."""
    w = _Walk()
    for c in step.children:
        w.visit(c, None, None, False, False)
    lo, hi = step.start_ns, step.end_ns
    inside = [k for k in kernels if k.end_ns > lo and k.start_ns < hi]
    by_class: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for k in inside:
        by_class[kernel_class(k.name)].append((max(k.start_ns, lo), min(k.end_ns, hi)))
    comm = _union(by_class.pop("communication", []))
    busy = _union([iv for ivs in by_class.values() for iv in ivs])
    raw = {c: _length(_union(ivs)) for c, ivs in by_class.items()}
    scale = _length(busy) / sum(raw.values()) if raw and sum(raw.values()) else 0.0
    exposed = _length(comm) - _length(_intersect(comm, busy))
    wall = step.dur_ns
    seconds = {c: 0.0 for c in CATEGORIES}
    for c, ns in raw.items():
        seconds[c] = ns * scale / 1e9
    seconds["communication"] = exposed / 1e9
    data = min(w.ns.get("data_loading", 0), max(wall - _length(busy) - exposed, 0))
    seconds["data_loading"] = data / 1e9
    seconds["host_overhead"] = max(wall - _length(busy) - exposed - data, 0) / 1e9
    # the kernel classes are device time, which the profiler's host-side recording does not stretch: its
    # cost is all in the host's share of the wall (see without_profiler); counting the host events per
    # class, as on a CPU, took it off the kernels and left an H200 step's GEMMs at 0 ms
    host_events = {"host_overhead": sum(w.events.values())}
    return StepTimes(wall / 1e9, seconds, {k: v / 1e9 for k, v in w.modules.items()}, w.recompute_ns / 1e9,
                     w.optimizer_ns / 1e9, _length(comm) / 1e9, max(_length(comm) - exposed, 0) / 1e9,
                     {k: v / 1e9 for k, v in w.paths.items() if v}, host_events)


def typical(steps: list[StepTimes]) -> StepTimes:
    """The typical step of several: the median of each category, scaled so that they sum to the
    median wall time. Medians, not means: on a shared machine one step descheduled for 500 ms
    would otherwise decide every share (the median is exact for a single step; for two it is
    their mean)."""
    from statistics import median

    def med(dicts):
        keys = {k for d in dicts for k in d}
        return {k: median(d.get(k, 0.0) for d in dicts) for k in keys}
    wall = median(s.wall_s for s in steps)
    seconds = med([s.seconds for s in steps])
    total = sum(seconds.values())
    scale = wall / total if total > 0 else 0.0
    return StepTimes(wall, {c: seconds.get(c, 0.0) * scale for c in CATEGORIES}, med([s.modules for s in steps]),
                     median(s.recompute_s for s in steps), median(s.optimizer_step_s for s in steps),
                     median(s.comm_total_s for s in steps),
                     median(s.comm_overlapped_s for s in steps), med([s.attention_paths for s in steps]),
                     med([s.events for s in steps]))


def without_profiler(step: StepTimes, unprofiled_wall_s: float, unprofiled_sleep_s: float | None = None) -> StepTimes:
    """Take the profiler's own cost -- the measured difference between the profiled and the
    unprofiled step -- off the categories where it was spent: in proportion to the events the
    profiler recorded in each (every event costs it about the same: two timestamps and a record;
    ``events``), host overhead when nothing was counted; never below zero (what a category cannot
    give comes off host overhead). The step then sums to about the unprofiled wall time.
    Idle time beyond what the unprofiled steps slept (``unprofiled_sleep_s``) is the profiler's
    too (its collection thread holds locks the training thread waits for): it goes first."""
    excess = max(step.wall_s - unprofiled_wall_s, 0.0)
    seconds = dict(step.seconds)
    if unprofiled_sleep_s is not None:
        extra = min(max(seconds["idle"] - unprofiled_sleep_s, 0.0), excess)
        seconds["idle"] -= extra
        excess -= extra
    total = sum(step.events.values())
    shares = {c: n / total for c, n in step.events.items()} if total else {"host_overhead": 1.0}
    left = excess
    for c, share in shares.items():
        if c != "host_overhead" and c in seconds:
            taken = min(excess * share, seconds[c])
            seconds[c] -= taken
            left -= taken
    seconds["host_overhead"] = max(seconds["host_overhead"] - left, 0.0)
    return StepTimes(sum(seconds.values()), seconds, step.modules, step.recompute_s, step.optimizer_step_s,
                     step.comm_total_s, step.comm_overlapped_s, step.attention_paths, step.events)


def top_modules(step: StepTimes, k: int) -> list[tuple[str, float]]:
    """The ``k`` modules (innermost, forward and backward together) with the most kernel time."""
    return sorted(step.modules.items(), key=lambda kv: -kv[1])[:k]
