"""What each traced op costs on a device.

On this machine (``--gpu local``) the costs are measured: every distinct matmul, convolution and
attention op of the trace (same op, shapes, strides, dtypes and arguments) is run once on random
data of its shapes and timed -- the device's matmul throughput *by shape and dtype*, which on a
CPU varies several-fold between a 64-wide and a 2048-wide GEMM and between oneDNN's convolution
algorithms; a memory-bound op costs its bytes over the copy bandwidth measured at its size (cache
or DRAM) plus the per-op host cost of a tiny op, also measured. Measurements are cached per
machine fingerprint, so a second plan of the same shapes measures nothing.

On a catalogued accelerator the same ops are timed from its datasheet: FLOPs over the peak of the
op's dtype x the achievable fractions of ``plan/calibration.py`` (GEMM size efficiency, fused
attention), bytes over HBM bandwidth, never under the kernel floor.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_map

from tensorpilot.observe.trace import COMPUTE_CLASSES, VIEW, ATTENTION, OpRecord, TensorSpec

DTYPE_KEYS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "": "fp32"}
BANDWIDTH_SIZES = (256 << 10, 4 << 20, 64 << 20)     # L2-, L3- and DRAM-sized working sets
MEASURE_BUDGET_S = 60.0                               # at most this long measuring op shapes
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
    gemm_half_dim: float = 0.0                     # catalog: size efficiency e / (e + half)

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
            return self.measured_s[op.signature]
        moved = op.bytes_read + op.bytes_written
        memory = moved / self.bytes_per_s(moved) if moved else 0.0
        if op.op_class not in COMPUTE_CLASSES:
            return memory + self.op_overhead_s
        key = DTYPE_KEYS.get(op.dtype, "fp32")
        table = self.attention_flops_per_s if op.op_class == ATTENTION and self.attention_flops_per_s \
            else self.compute_flops_per_s
        rate = table.get(key) or table.get("fp32") or 1.0
        if self.gemm_half_dim and op.op_class != ATTENTION:
            smallest = _smallest_dim(op)
            rate *= smallest / (smallest + self.gemm_half_dim)
        return max(op.flops / rate, memory) + self.op_overhead_s


def _smallest_dim(op: OpRecord) -> float:
    """Smallest matrix dimension of a GEMM-like op (M, K or N), from its operands' last two dims."""
    if op.replay is None:
        return 1e9
    dims = [d for t in _flat_specs(op.replay[1]) for d in t.shape[-2:] if len(t.shape) >= 2]
    return float(min(dims)) if dims else 1e9


def _flat_specs(args: Any) -> list[TensorSpec]:
    from torch.utils._pytree import tree_flatten

    return [a for a in tree_flatten(args, is_leaf=lambda x: isinstance(x, TensorSpec))[0]
            if isinstance(a, TensorSpec)]


# ---------------------------------------------------------------------------- catalogued devices

def catalog_costs(acc: Any) -> DeviceCosts:
    """``acc``: a hardware.catalog.Accelerator. Its datasheet x the planner's fractions."""
    from tensorpilot.plan import calibration as cal

    sustained = cal.SUSTAINED_COMPUTE_FRACTION
    compute, attention = {}, {}
    for key in ("fp32", "tf32", "bf16", "fp16"):
        peak = acc.peak_flops_per_s(key)
        if peak:
            compute[key] = peak * sustained * cal.mamf_fraction(acc.key)
            attention[key] = peak * sustained * cal.flash_attention_fraction(acc.key)
    bw = (acc.mem_bw_gb_per_s or 1000) * 1e9 * cal.MEMORY_BW_FRACTION
    return DeviceCosts(acc.key, False, compute, [(1.0, bw)], op_overhead_s=cal.KERNEL_FLOOR_S, view_overhead_s=0.0,
                       host_per_op_s=CATALOG_HOST_PER_OP_S, async_host=True, attention_flops_per_s=attention,
                       gemm_half_dim=cal.GEMM_HALF_SATURATION_DIM)


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


def _spec_bytes(replay: Any) -> int:
    return sum(math.prod(t.shape) * t.dtype.itemsize for t in _flat_specs((replay[1], replay[2])))


def replay_time_s(replay: Any, device: str, repeats: int = 3) -> float | None:
    """Median seconds of one run of a recorded op on random data of its shapes (None when it
    cannot run: a shape it rejects, not enough memory)."""
    from tensorpilot.hardware.probe import sync

    func, args, kwargs = replay
    gen = torch.Generator().manual_seed(0)
    try:
        a = tree_map(lambda s: _materialize(s, device, gen), args)
        k = tree_map(lambda s: _materialize(s, device, gen), kwargs)
        with torch.no_grad():
            func(*a, **k)                                    # warm-up: oneDNN picks its kernel here
            sync(device)
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                func(*a, **k)
                sync(device)
                samples.append(time.perf_counter() - t0)
        return statistics.median(samples)
    except (RuntimeError, ValueError, TypeError, IndexError, MemoryError):
        return None


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


def local_costs(caps: Any, ops: list[OpRecord], *, budget_s: float = MEASURE_BUDGET_S) -> DeviceCosts:
    """Costs on this machine's device ``caps`` (hardware.device.DeviceCaps) for the trace ``ops``:
    their compute ops replayed (cached), bandwidth by size and per-op overheads measured once."""
    from tensorpilot.hardware.peak import device_peak
    from tensorpilot.hardware.probe import copy_bandwidth

    device = caps.torch_device
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
    spent, todo = 0.0, {}
    for op in ops:
        big = op.op_class in COMPUTE_CLASSES or op.bytes_read + op.bytes_written >= REPLAY_MIN_BYTES
        if op.replay is not None and big and op.signature not in data["ops"]:
            todo.setdefault(op.signature, op)
    # the largest ops first: if the budget runs out, the small ones fall back to the roofline
    for sig, op in sorted(todo.items(), key=lambda kv: -(kv[1].flops + 100 * (kv[1].bytes_read + kv[1].bytes_written))):
        if spent > budget_s or _spec_bytes(op.replay) > REPLAY_MAX_BYTES:
            continue
        t0 = time.perf_counter()
        seconds = replay_time_s(op.replay, device)
        spent += time.perf_counter() - t0
        if seconds is not None:
            data["ops"][sig] = seconds
    _save(device, data)
    wanted = {op.signature for op in ops}
    return DeviceCosts(f"{caps.name} (measured)", True, compute, [tuple(b) for b in data["bandwidth"]],
                       data["op_overhead_s"], data["view_overhead_s"], data["host_per_op_s"], caps.kind != "cpu",
                       measured_s={s: v for s, v in data["ops"].items() if s in wanted})
