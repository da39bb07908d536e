"""What each traced op costs on a device.

On this machine (``--gpu local``) the costs are measured: every distinct matmul, convolution and
attention op of the trace (same op, shapes, strides, dtypes and arguments), every memory-bound op
moving >= 256 KiB and every multi-tensor optimizer op is run on random data of its shapes and
timed -- the device's throughput *by shape and dtype*, which on a CPU varies several-fold between
a 64-wide and a 2048-wide GEMM and between oneDNN's convolution algorithms. Each timed run starts
with the op's operands out of the core's L2 (as in a step, where other ops ran since they were
written); an op whose operands the trace shows were last touched longer ago than the caches hold
(its reuse distance, ``OpRecord.reads``, against a capacity measured from the copy bandwidth
curve) is also timed with the last-level cache emptied, and costs between the two by the share of
its bytes that come from memory. Smaller memory-bound ops cost their bytes over the copy bandwidth
measured at their size plus the per-op cost of a tiny op, also measured. Measurements are cached
per machine fingerprint, so a second plan of the same shapes measures nothing.

On a catalogued accelerator the same ops are timed from its datasheet: FLOPs over the peak of the
op's dtype x the achievable fractions of ``plan/calibration.py`` (GEMM size efficiency, fused
attention), bytes over HBM bandwidth, never under the kernel floor.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from tensorpilot.hardware.hostmem import MMAP_CEILING
from tensorpilot.observe.trace import COMPUTE_CLASSES, MATMUL, VIEW, ATTENTION, OpRecord, TensorSpec

DTYPE_KEYS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "": "fp32"}
BANDWIDTH_SIZES = (256 << 10, 4 << 20, 64 << 20)     # L2-, L3- and DRAM-sized working sets
MEASURE_BUDGET_S = 60.0                               # at most this long per pass measuring op shapes
REPLAY_MAX_BYTES = 1 << 30                            # ops with larger operands are not replayed
# memory-bound ops smaller than this are timed by bandwidth + dispatch; larger ones are replayed
# too on this machine (a CPU's elementwise kernels run from far below copy bandwidth -- erf,
# exp, bf16 conversion -- to above it in cache)
REPLAY_MIN_BYTES = 256 << 10
# A catalogued GPU's host: eager PyTorch spends ~10 us of Python, dispatcher and launch per op
# (ASSUMED, order of magnitude of public eager-overhead measurements); it overlaps the kernels,
# so it shows only when a model's ops are too small to keep the GPU busy. ``--gpu local``
# measures it instead.
CATALOG_HOST_PER_OP_S = 10e-6
# cuDNN's tensor-core convolution kernels take NHWC (channels_last) tensors: a 16-bit convolution given NCHW
# ones is run between layout transforms, its input (and, backward, grad_output) transposed to NHWC and
# its result back (nchwToNhwcKernel / nhwcToNchwKernel in a profile), each a read and a write of the
# tensor (NVIDIA Deep Learning Performance Guide, "Convolutional Layers: Tensor Layouts in Memory:
# NCHW vs NHWC"). Depthwise convolutions are not routed through them (PyTorch's own depthwise kernels
# take either layout). `plan --memory-format channels_last` traces the model in NHWC: none.
NCHW_TRANSPOSED_DTYPES = ("float16", "bfloat16")
# Normalisations whose statistics reduce over more than one row read their operands twice: the
# reduction must finish before any element is normalised, and a tensor larger than the chip's
# cache comes from memory both times. PyTorch's CUDA kernels: batch norm's statistics then its
# elementwise pass (aten/src/ATen/native/cuda/Normalization.cu: batch_norm_stats / _elemt, and
# backward_reduce / backward_elemt), group norm's moments then its pass (group_norm_kernel.cu),
# layer norm's backward the input's gradient row by row then gamma's and beta's over the rows in a
# second kernel (layer_norm_kernel.cu, GammaBetaBackward). The trace counts one read.
# op -> positions of the arguments read twice; a catalogued device's cost adds them
SECOND_PASS = {"aten.native_batch_norm": (0,), "aten._native_batch_norm_legit": (0,),
               "aten._native_batch_norm_legit_functional": (0,), "aten.native_batch_norm_backward": (0, 1),
               "aten.native_group_norm": (0,), "aten.native_group_norm_backward": (0, 1),
               "aten.native_layer_norm_backward": (0, 1)}


@dataclass
class DeviceCosts:
    """Per-op costs on one device: measured (local) or from a catalog entry."""

    name: str
    local: bool
    compute_flops_per_s: dict[str, float]          # dtype key -> sustained matmul rate
    bandwidth: list[tuple[float, float]]           # (working-set bytes, bytes read+written per s)
    op_overhead_s: float                           # one small op: launch or dispatch
    view_overhead_s: float                         # one view/reshape: host only
    host_per_op_s: float = 0.0                     # training step's host time per op beyond dispatch
    async_host: bool = False                       # kernels run while the host queues the next (GPU)
    attention_flops_per_s: dict[str, float] = field(default_factory=dict)
    measured_s: dict[str, float] = field(default_factory=dict)     # signature -> seconds
    # catalog: dtype key -> reduction depth of half the large-GEMM rate (efficiency k / (k + half))
    gemm_half_depth: dict[str, float] = field(default_factory=dict)
    measured_cold_s: dict[str, float] = field(default_factory=dict)   # signature -> seconds, operands in memory
    cache_bytes: float = 0.0                       # traffic after which an operand has left the caches
    nchw_transposes: bool = False                  # NCHW 16-bit convolutions pay cuDNN's layout transforms
    # catalog: share of its rate a 16-bit GEMM keeps with a row not 16-byte aligned (calibration.py)
    misaligned_gemm_speed: float = 1.0

    def bytes_per_s(self, nbytes: float) -> float:
        """Bandwidth for a working set of ``nbytes``: log-linear between the measured sizes."""
        pts = sorted(self.bandwidth)
        if nbytes <= pts[0][0] or len(pts) == 1:
            return pts[0][1]
        for (s0, b0), (s1, b1) in zip(pts, pts[1:]):
            if nbytes <= s1:
                w = (math.log(nbytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
                return b0 + w * (b1 - b0)
        return pts[-1][1]

    def op_time_s(self, op: OpRecord) -> float:
        """The op's own time: its kernel and one dispatch (a view: dispatch only)."""
        if op.op_class == VIEW:
            return self.view_overhead_s
        if op.signature in self.measured_s:
            warm = self.measured_s[op.signature]
            if op.signature not in self.measured_cold_s or not op.bytes_read:
                return warm
            # between the two timings by the share of its operand bytes that come from memory
            share = cold_bytes(op, self.cache_bytes) / op.bytes_read
            return warm + min(share, 1.0) * max(self.measured_cold_s[op.signature] - warm, 0.0)
        moved = op.bytes_read + op.bytes_written + (0 if self.local else second_pass_bytes(op))
        memory = moved / self.bytes_per_s(moved) if moved else 0.0
        if op.op_class not in COMPUTE_CLASSES:
            return memory + self.op_overhead_s
        key = DTYPE_KEYS.get(op.dtype, "fp32")
        table = self.attention_flops_per_s if op.op_class == ATTENTION and self.attention_flops_per_s \
            else self.compute_flops_per_s
        rate = table.get(key) or table.get("fp32") or 1.0
        half = self.gemm_half_depth.get(key) or self.gemm_half_depth.get("fp32")
        if half and op.op_class != ATTENTION:
            depth = _reduction_depth(op)
            rate *= depth / (depth + half)
        if self.misaligned_gemm_speed < 1 and op.op_class == MATMUL and gemm_misaligned(op):
            rate *= self.misaligned_gemm_speed
        own = max(op.flops / rate, memory) + self.op_overhead_s
        if self.nchw_transposes:
            moved, kernels = nchw_transpose_bytes(op)
            if moved:
                own += moved / self.bytes_per_s(moved) + kernels * self.op_overhead_s
        return own


def second_pass_bytes(op: OpRecord) -> int:
    """Bytes a normalisation reads a second time (``SECOND_PASS``); 0 for any other op, for batch
    norm in eval (running statistics: one pass) and for a layer norm backward without weights."""
    at = SECOND_PASS.get(op.op)
    if at is None or op.replay is None:
        return 0
    args = op.replay[1]
    if op.op == "aten.native_layer_norm_backward" and not any(args[7][1:]):
        return 0                                   # output_mask: no gamma / beta gradient
    if "batch_norm" in op.op and not op.op.endswith("_backward") and not args[5]:
        return 0                                   # training=False
    return sum(spec_bytes(args[i]) for i in at if isinstance(args[i], TensorSpec))


def nchw_transpose_bytes(op: OpRecord) -> tuple[int, int]:
    """(bytes, kernels) of the layout transforms around a 16-bit convolution on NCHW tensors
    (``NCHW_TRANSPOSED_DTYPES``): forward, the input to NHWC and the output back; backward, for each
    of the data- and the weight-gradient kernels, grad_output and the input (or the input's gradient)
    -- each tensor moved twice (read and written). (0, 0) for another op, a
    depthwise convolution, or channels_last operands. Weights (small) are left out."""
    if op.op not in ("aten.convolution", "aten.convolution_backward") or op.replay is None \
            or op.dtype not in NCHW_TRANSPOSED_DTYPES:
        return 0, 0
    args = op.replay[1]
    forward = op.op == "aten.convolution"
    x, w = (args[0], args[1]) if forward else (args[1], args[2])
    groups = args[8] if forward else args[9]
    if not isinstance(x, TensorSpec) or len(x.shape) != 4 or x.shape[1] < 2 or x.stride[1] == 1:
        return 0, 0                                  # channels_last (NHWC): the kernels' own layout
    if groups > 1 and groups == x.shape[1]:
        return 0, 0                                  # depthwise
    # a 1x1 weight's strides read alike in both layouts (PyTorch takes such a weight as NCHW and lets the
    # input decide); a k x k one with unit channel stride is channels_last
    if isinstance(w, TensorSpec) and len(w.shape) == 4 and w.shape[1] > 1 and w.shape[2] * w.shape[3] > 1 \
            and w.stride[1] == 1:
        # channels_last weights (train's channels_last moves the weights, not the batch): PyTorch runs
        # the convolution in NHWC and converts only the NCHW input, for the forward and the weight gradient
        return (2 * spec_bytes(x), 1) if forward or args[-1][1] else (0, 0)
    if forward:
        return 2 * (spec_bytes(x) + op.bytes_written), 2
    grad_out, mask = args[0], args[-1]
    kernels = bool(mask[0]) + bool(mask[1])          # data gradient: grad_out in, grad_input out; weight
    return 2 * kernels * (spec_bytes(grad_out) + spec_bytes(x)), 2 * kernels   # gradient: grad_out and input in


def gemm_misaligned(op: OpRecord) -> bool:
    """Whether a 16-bit GEMM has an operand or output whose rows do not start on 16-byte boundaries
    (calibration.unaligned): a leading dimension (the stride of a matrix's non-contiguous
    dimension), a storage offset, or the output's width (its last operand's last dimension: mm,
    addmm, bmm, baddbmm write (..., m, n)) that is not a multiple of 8 elements. cuBLAS then runs
    kernels without the tensor cores' aligned loads: a language model's output layer over a vocabulary
    such as GPT-2's 50,257 (calibration.MISALIGNED_GEMM_SPEED)."""
    from tensorpilot.plan.calibration import unaligned

    if op.replay is None:
        return False
    mats = [s for s in _flat_specs(op.replay[1:]) if len(s.shape) >= 2 and s.dtype.is_floating_point
            and s.dtype.itemsize == 2]
    if not mats:
        return False
    for s in mats:
        (rows, cols), (rs, cs) = s.shape[-2:], s.stride[-2:]
        if rows <= 1 or cols <= 1:
            continue
        ld = rs if cs == 1 else cs if rs == 1 else None     # neither: cuBLAS is given a copy
        if ld is not None and (unaligned(ld, 2) or unaligned(s.offset, 2)):
            return True
    n = mats[-1].shape[-1]
    return n > 1 and unaligned(n, 2)


def _reduction_depth(op: OpRecord) -> float:
    """Reduction depth K of a GEMM-like op (matmul, convolution, their backward): its FLOPs
    (2 x outputs x K) over twice the elements it writes; large where the op writes nothing."""
    dtype = getattr(torch, op.dtype, None) if op.dtype else None
    outputs = op.bytes_written / (dtype.itemsize if isinstance(dtype, torch.dtype) else 4)
    return op.flops / (2 * outputs) if outputs > 0 and op.flops > 0 else 1e9


def _flat_specs(args: Any) -> list[TensorSpec]:
    from torch.utils._pytree import tree_flatten

    return [a for a in tree_flatten(args, is_leaf=lambda x: isinstance(x, TensorSpec))[0]
            if isinstance(a, TensorSpec)]


# ---------------------------------------------------------------------------- catalogued devices

def catalog_costs(acc: Any) -> DeviceCosts:
    """``acc``: a hardware.catalog.Accelerator. Its datasheet x the planner's fractions."""
    from tensorpilot.plan import calibration as cal

    sustained = cal.SUSTAINED_COMPUTE_FRACTION
    compute, attention, half = {}, {}, {}
    for key in ("fp32", "tf32", "bf16", "fp16"):
        peak = acc.peak_flops_per_s(key)
        if peak:
            compute[key] = peak * sustained * cal.mamf_fraction(cal.calibration_key(acc), key)
            attention[key] = peak * sustained * cal.flash_attention_fraction(cal.calibration_key(acc))
            half[key] = cal.gemm_half_depth(peak, acc.mem_bw_gb_per_s, cal.calibration_key(acc))
    bw = cal.streaming_bytes_per_s(acc)
    return DeviceCosts(acc.key, False, compute, [(1.0, bw)], op_overhead_s=cal.KERNEL_FLOOR_S, view_overhead_s=0.0,
                       host_per_op_s=CATALOG_HOST_PER_OP_S, async_host=True, attention_flops_per_s=attention,
                       gemm_half_depth=half, nchw_transposes=acc.vendor == "NVIDIA",
                       misaligned_gemm_speed=cal.MISALIGNED_GEMM_SPEED.get(cal.calibration_key(acc), 1.0))


# ---------------------------------------------------------------------------- this machine

def _materialize(spec: Any, device: str, gen: torch.Generator) -> Any:
    if not isinstance(spec, TensorSpec):
        return spec
    extent = 1 + sum((s - 1) * st for s, st in zip(spec.shape, spec.stride) if s > 0)
    n = spec.offset + (extent if all(s > 0 for s in spec.shape) else 0)
    if spec.dtype.is_floating_point:
        base = torch.randn(max(n, 1), generator=gen, dtype=torch.float32).to(device=device, dtype=spec.dtype)
    elif spec.dtype == torch.bool:
        base = torch.ones(max(n, 1), dtype=torch.bool, device=device)
    else:
        base = torch.zeros(max(n, 1), dtype=spec.dtype, device=device)
    return base.as_strided(spec.shape, spec.stride, spec.offset)


def spec_bytes(spec: TensorSpec) -> int:
    return math.prod(spec.shape) * spec.dtype.itemsize


def _spec_bytes(replay: Any) -> int:
    return sum(spec_bytes(t) for t in _flat_specs((replay[1], replay[2])))


@functools.lru_cache(maxsize=None)
def _cpu_cache_bytes(level: int) -> int | None:
    """Size of one CPU cache of ``level`` (2: a core's L2, 3: the last level) from sysfs."""
    from pathlib import Path

    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if int((index / "level").read_text()) != level or (index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip().upper()
            return int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0)
        except (OSError, ValueError):
            continue
    return None


def flush_bytes(device: str) -> int:
    """Bytes to write between two timed runs of an op so that its operands are no longer in the
    cache closest to the cores: twice a core's L2 on a CPU (2 MiB if sysfs does not say), 256 MiB
    on a GPU (more than any GPU's L2; the size Triton's ``do_bench`` clears). A step runs other
    ops between an activation's write and its reads, so its operands are at best in the last-level
    cache, not in L2 as in a tight replay loop."""
    if device.split(":")[0] != "cpu":
        return 256 << 20
    return 2 * (_cpu_cache_bytes(2) or 2 << 20)


def cache_capacity(device: str) -> tuple[int, int]:
    """(bytes of other traffic after which an operand has left the caches, bytes to write to empty
    them) on a CPU: copy bandwidth at working sets doubling from 8 MiB to four times the last-level
    cache (sysfs; 64 MiB if it does not say); the capacity is the largest working set still copied
    at >= 1.3x the largest one's bandwidth. The nominal size overstates it: a cache shared with
    other cores or virtual machines, and conflict misses, keep less. (0, 0) on a GPU: its replays
    already run cold (``flush_bytes``)."""
    from tensorpilot.hardware.probe import copy_bandwidth

    if device.split(":")[0] != "cpu":
        return 0, 0
    llc = _cpu_cache_bytes(3) or 64 << 20
    sizes, size = [], 4 << 20
    while size <= 2 * llc:
        sizes.append(size)
        size *= 2
    bw = [copy_bandwidth(device, s) for s in sizes]          # a copy of s bytes touches 2 s
    hot = [s for s, b in zip(sizes, bw) if b >= 1.3 * bw[-1]]
    return 2 * (max(hot) if hot else sizes[0]), 2 * llc


def cold_bytes(op: OpRecord, capacity: float) -> int:
    """Bytes of the op's operands last touched more than ``capacity`` bytes of traffic ago."""
    return sum(n for n, distance in op.reads if distance > capacity)


def _operands(replay: Any, device: str, gen: torch.Generator, promote: bool) -> tuple[Any, Any]:
    """Random tensors for a recorded op's arguments. ``promote``: small floating operands (a
    parameter's size, not an activation's) in fp32 -- under CPU autocast the fake kernels give
    batch norm's saved statistics the input's dtype where the real kernel keeps them in fp32."""
    _, args, kwargs = replay
    made = tree_map(lambda s: _materialize(s, device, gen), (args, kwargs))
    if promote:
        tensors = [t for t in tree_flatten(made)[0] if isinstance(t, torch.Tensor)]
        big = max((t.numel() for t in tensors), default=0)
        made = tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point()
                        and t.numel() < big else t, made)
    return made


_FLUSH: dict[tuple[str, int], torch.Tensor] = {}


def _flush_buffer(device: str, nbytes: int) -> torch.Tensor:
    """One buffer per size while ops are measured (``local_costs`` frees them): a fresh one per
    replay would page-fault hundreds of MiB each time, and the kernel be busy with it while the
    op is timed."""
    if (device, nbytes) not in _FLUSH:
        _FLUSH[(device, nbytes)] = torch.empty(nbytes // 4, device=device)
    return _FLUSH[(device, nbytes)]


def _maps_fresh_pages(out: Any, device: str) -> bool:
    """Whether the op's output has a CPU block above glibc's mmap ceiling. Its page faults cost
    several times more in some runs than in others on a virtual machine (the host backs the
    pages lazily; benchmarks/RESULTS.md, plan any model), while a training step repeating the
    same allocations settles in the fast mode: such an op is timed more often and its fastest
    run kept, as noise only ever adds time."""
    if device.split(":")[0] != "cpu":
        return False
    return any(isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > MMAP_CEILING
               for t in tree_flatten(out)[0])


def replay_time_s(replay: Any, device: str, repeats: int = 3, flush: int | None = None) -> float | None:
    """Median seconds of one run of a recorded op on random data of its shapes (the fastest of
    at least five where its output maps fresh pages: ``_maps_fresh_pages``), each run after
    ``flush`` bytes were written (default ``flush_bytes``: out of the core's cache). None when it
    cannot run: a shape it rejects, not enough memory."""
    from tensorpilot.hardware.probe import sync

    func = replay[0]
    gen = torch.Generator().manual_seed(0)
    flush = _flush_buffer(device, flush or flush_bytes(device))
    for promote in (False, True):
        try:
            a, k = _operands(replay, device, gen, promote)
            with torch.no_grad():
                mapped = _maps_fresh_pages(func(*a, **k), device)   # warm-up: oneDNN picks its kernel
                if device.split(":")[0] != "cpu" and hasattr(torch, "Event"):
                    try:
                        return device_time_s(lambda: func(*a, **k), device, flush, repeats)
                    except RuntimeError:           # a backend without timing events: the host's timer
                        pass
                samples = []
                for _ in range(max(repeats, 5) if mapped else repeats):
                    flush.fill_(1.0)
                    sync(device)
                    t0 = time.perf_counter()
                    func(*a, **k)
                    sync(device)
                    samples.append(time.perf_counter() - t0)
            return min(samples) if mapped else statistics.median(samples)
        except (RuntimeError, ValueError, TypeError, IndexError, MemoryError):
            continue
    return None


def device_time_s(run: Any, device: str, flush: torch.Tensor, repeats: int, event: Any = None) -> float:
    """Median seconds ``run()`` keeps an accelerator busy, timed by events on its stream as
    Triton's ``do_bench`` times a kernel: each repeat queues the flush, a start event, the op and an
    end event back to back, and the host waits once at the end. The op's launch then waits behind
    the flush's kernel, so the host's dispatch and launch latency -- which an eager step overlaps
    with the kernels before it (``DeviceCosts.async_host``), and a timer around a synchronised call
    would add to every op -- is not counted. ``event``: the event class (torch.Event)."""
    from tensorpilot.hardware.probe import sync

    event = event or torch.Event
    pairs = []
    for _ in range(repeats):
        flush.fill_(1.0)
        start, end = event(device=device, enable_timing=True), event(device=device, enable_timing=True)
        start.record()
        run()
        end.record()
        pairs.append((start, end))
    sync(device)
    return statistics.median(start.elapsed_time(end) for start, end in pairs) / 1e3     # ms -> s


def host_per_op(device: str) -> float:
    """Seconds a training step spends per op beyond the op's own dispatch (Python module calls,
    autograd bookkeeping, the optimizer's Python): a step of 24 tiny Linear + ReLU layers, whose
    kernels take next to nothing, divided by its traced op count, less one dispatch."""
    from torch import nn

    from tensorpilot.observe.trace import trace_step

    def build():
        return nn.Sequential(*[m for _ in range(24) for m in (nn.Linear(16, 16), nn.ReLU())])
    model = build().to(device)
    opt = torch.optim.AdamW(model.parameters(), fused=device.split(":")[0] in ("cpu", "cuda"))
    x = torch.randn(4, 16, device=device)

    def step():
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    from tensorpilot.hardware.probe import sync

    for _ in range(5):
        step()
    times = []
    for _ in range(30):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    with torch.device("meta"):
        shadow = build()
    ops = trace_step(shadow, lambda: (torch.randn(4, 16), None), lambda out, y: out.sum(),
                     lambda ps: torch.optim.AdamW(ps, fused=True), device="cpu").ops
    add, view = tiny_op_overheads(device)
    n_view = sum(o.op_class == VIEW for o in ops)
    own = n_view * view + (len(ops) - n_view) * add
    return max(statistics.median(times) - own, 0.0) / len(ops)


def tiny_op_overheads(device: str) -> tuple[float, float]:
    """(seconds of one small elementwise op, of one view), each the median over many calls."""
    from tensorpilot.hardware.probe import sync

    a = torch.ones(16, device=device)
    b = torch.ones(16, device=device)

    def loop(fn, n=2000):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync(device)
        return (time.perf_counter() - t0) / n
    add = statistics.median(loop(lambda: torch.add(a, b)) for _ in range(5))
    view = statistics.median(loop(lambda: a.view(4, 4)) for _ in range(5))
    return add, view


def _cache_path(device: str):
    from tensorpilot.hardware.probe import cache_dir, fingerprint

    return cache_dir() / f"opcosts-{fingerprint([device])}.json"


def _load(device: str) -> dict[str, Any]:
    try:
        data = json.loads(_cache_path(device).read_text())
        if isinstance(data, dict) and isinstance(data.get("ops"), dict):
            return data
    except (OSError, ValueError):
        pass
    return {"ops": {}}


def _save(device: str, data: dict[str, Any]) -> None:
    from tensorpilot.errors import TensorpilotError
    from tensorpilot.files import write_atomic

    path = _cache_path(device)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(data), "op cost cache")
    except (OSError, TensorpilotError):
        pass                                     # not remembered: measured again next time


# share of the CPUs other processes used while ops were replayed above which the new timings are
# not cached (on 2 cores: one busy core elsewhere is 50%)
LOADED_SHARE = 0.25
LOAD_WINDOW_S = 0.5                      # the shortest window the load is judged over


def local_costs(caps: Any, ops: list[OpRecord], *, budget_s: float = MEASURE_BUDGET_S) -> DeviceCosts:
    """Costs on this machine's device ``caps`` (hardware.device.DeviceCaps) for the trace ``ops``:
    their compute ops replayed (cached), bandwidth by size and per-op overheads measured once."""
    from tensorpilot.hardware.load import LoadMeter
    from tensorpilot.hardware.hostmem import retain_freed_host_memory
    from tensorpilot.hardware.peak import device_peak
    from tensorpilot.hardware.probe import copy_bandwidth

    device = caps.torch_device
    if caps.kind == "cpu":
        # a CPU training step runs with freed host memory kept for reuse (train's default,
        # engine.retain_host_memory); replays without it pay page faults the step does not
        retain_freed_host_memory()
    data = _load(device)
    if "bandwidth" not in data:
        data["bandwidth"] = [[s, copy_bandwidth(device, s)] for s in BANDWIDTH_SIZES]
        data["op_overhead_s"], data["view_overhead_s"] = tiny_op_overheads(device)
    if "host_per_op_s" not in data:
        data["host_per_op_s"] = host_per_op(device)
    compute = {}
    for key in ("fp32", "bf16") + (("fp16", "tf32") if caps.kind == "cuda" else ()):
        measured = device_peak(device, key).measured_flops_per_s
        if measured:
            compute[key] = measured
    if "cache_bytes" not in data:
        data["cache_bytes"], data["cold_flush_bytes"] = cache_capacity(device)
    capacity, cold_flush = data["cache_bytes"], data["cold_flush_bytes"]
    data.setdefault("cold", {})
    # Replayed: compute ops, memory ops of >= REPLAY_MIN_BYTES, multi-tensor ops (the optimizer's
    # foreach/fused kernels cost per tensor, not per byte) -- hot (operands in the last-level
    # cache), and cold too where the trace says operands of more than an L2 come from memory
    hot, cold = {}, {}
    for op in ops:
        big = op.op_class in COMPUTE_CLASSES or op.bytes_read + op.bytes_written >= REPLAY_MIN_BYTES \
            or op.op.startswith(("aten._foreach", "aten._fused"))
        if op.replay is None or not big or _spec_bytes(op.replay) > REPLAY_MAX_BYTES:
            continue
        if op.signature not in data["ops"]:
            hot.setdefault(op.signature, op)
        if cold_flush and op.signature not in data["cold"] and cold_bytes(op, capacity) >= flush_bytes(device):
            cold.setdefault(op.signature, op)
    # The largest ops first: if the budget runs out, the small ones fall back to the roofline.
    # Two passes, the lowest median kept: a burst of load from another process that spoils one
    # op's timing rarely lasts from the first pass to the second.
    spent = 0.0
    cached = {"ops": dict(data["ops"]), "cold": dict(data["cold"])}

    def size(kv):
        return -(kv[1].flops + 100 * (kv[1].bytes_read + kv[1].bytes_written))
    with LoadMeter() as meter:
        for limit in (budget_s, 2 * budget_s):         # the second pass has a budget of its own
            for table, todo, flush in ((data["ops"], hot, None), (data["cold"], cold, cold_flush)):
                for sig, op in sorted(todo.items(), key=size):
                    if spent > limit:
                        break
                    t0 = time.perf_counter()
                    seconds = replay_time_s(op.replay, device, flush=flush)
                    spent += time.perf_counter() - t0
                    if seconds is not None:
                        table[sig] = min(seconds, table.get(sig, math.inf))
        if hot or cold:                  # /proc/stat counts 10 ms ticks: a few ms of replays say nothing
            time.sleep(max(LOAD_WINDOW_S - (time.perf_counter() - meter.t0), 0.0))
    _FLUSH.clear()
    name = f"{caps.name} (measured)"
    foreign = meter.result.foreign if caps.kind == "cpu" and (hot or cold) else None
    if foreign is not None and foreign >= LOADED_SHARE:
        # other processes slowed these replays: this plan uses them, the cache does not keep them
        # (a cached cost is never measured again), so the next plan on a quieter machine re-times
        _save(device, {**data, **cached})
        name = (f"{caps.name} (measured while other processes used {foreign:.0%} of the CPUs: new op "
                "timings not cached, plan again on a quieter machine)")
    else:
        _save(device, data)
    wanted = {op.signature for op in ops}
    return DeviceCosts(name, True, compute, [tuple(b) for b in data["bandwidth"]],
                       data["op_overhead_s"], data["view_overhead_s"], data["host_per_op_s"], caps.kind != "cpu",
                       measured_s={s: v for s, v in data["ops"].items() if s in wanted},
                       measured_cold_s={s: v for s, v in data["cold"].items() if s in wanted},
                       cache_bytes=capacity)
