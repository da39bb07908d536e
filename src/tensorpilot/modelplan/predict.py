"""Memory and step time of one training step of any model, from its trace.

step time = sum over ops of the op's cost (``costs``), each op class scaled by its calibration
factor (1 until this machine has measured runs: ``calibration``) and by the user's stack (the
share of the op rates it reaches, solved from one measured step: ``planner.anchor``), plus the
exposed part of the layout's data-parallel communication. Memory = MemTracker's peak of the
traced step, with model states divided over the data-parallel group as the sharding says.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from tensorpilot.observe.trace import ATTENTION, COMPUTE_CLASSES, CONV, MATMUL, StepTrace

# calibration classes: what the profiler can measure separately on a real step
CLASSES = ("compute", "memory", "host")
# DDP's gradient buckets are 25 MiB (torch DistributedDataParallel bucket_cap_mb): the last one
# is reduced after backward ends, whatever the overlap
BUCKET_BYTES = 25 * 2**20


def op_class_group(op_class: str) -> str:
    return "compute" if op_class in COMPUTE_CLASSES else "memory"


@dataclass
class ModelPlan:
    model: str
    hardware: str
    n_devices: int
    sharding: str
    batch_size: int
    precision: str
    optimizer: str
    params: int
    trainable_params: int
    memory_bytes: dict[str, float]            # MemTracker categories at the peak + "total", one device
    memory_method: str
    memory_accounting: dict[str, float]       # our own accounting of the same step (a cross-check)
    memory_limit_bytes: float | None
    device_memory_bytes: float | None
    fits: bool | None
    step_time_s: float
    time_breakdown_s: dict[str, float]        # compute / memory / host / communication
    model_flops_per_step: float
    samples_per_s: float
    tokens_per_s: float | None
    mfu: float | None
    peak_flops_per_s: float | None
    peak_source: str
    calibration: dict[str, float]             # factor per class used (1.0 = none)
    modules: list[dict[str, Any]] = field(default_factory=list)
    ops: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    anchor: dict[str, Any] | None = None     # the measured step the stack's share was solved from (planner.anchor)
    power_w_per_device: float | None = None   # board power at this step's utilisation (catalogued TDP)
    energy_per_step_j: float | None = None    # power x devices x step time

    def with_power(self, acc: Any, compute_dtype: str) -> ModelPlan:
        """The plan with its board power and energy per step on the catalogued ``acc``
        (plan.predict.board_power_w: the formula planner's power model); unchanged without a TDP.
        The traced FLOPs are the ones executed (recomputation included): the utilisation is HFU."""
        from tensorpilot.plan.predict import board_power_w

        peak = acc.peak_flops_per_s(compute_dtype)
        hfu = self.model_flops_per_step / self.n_devices / self.step_time_s / peak if peak and self.step_time_s else None
        self.power_w_per_device = board_power_w(acc, hfu, compute_dtype)
        if self.power_w_per_device is not None:
            self.energy_per_step_j = self.power_w_per_device * self.n_devices * self.step_time_s
        return self

    def to_dict(self) -> dict:
        return asdict(self)


def class_times(trace: StepTrace, costs: Any, grad_accum: int = 1) -> dict[str, float]:
    """Predicted seconds per calibration class, before calibration; with ``grad_accum``
    micro-batches the forward and backward run that many times, the optimizer once."""
    out = {c: 0.0 for c in CLASSES}
    n = 0
    for op in trace.ops:
        k = 1 if op.phase == "optimizer" else grad_accum
        out[op_class_group(op.op_class)] += k * costs.op_time_s(op)
        n += k
    out["host"] = n * getattr(costs, "host_per_op_s", 0.0)
    return out


def module_table(trace: StepTrace, costs: Any, factors: dict[str, float],
                 types: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Per leaf module (forward and backward together; the optimizer as one row): FLOPs, bytes
    moved, activation bytes (outputs its forward ops wrote), predicted seconds."""
    rows: dict[str, dict[str, float]] = defaultdict(lambda: {"flops": 0, "bytes": 0, "activation_bytes": 0,
                                                             "time_s": 0.0, "ops": 0})
    for op in trace.ops:
        r = rows[op.module or "(model)"]
        r["flops"] += op.flops
        r["bytes"] += op.bytes_read + op.bytes_written
        if op.phase == "forward":
            r["activation_bytes"] += op.bytes_written
        r["time_s"] += costs.op_time_s(op) * factors.get(op_class_group(op.op_class), 1.0)
        r["ops"] += 1
    types = types or {}
    return sorted(({"module": k, "type": types.get("" if k == "(model)" else k, ""), **v} for k, v in rows.items()), key=lambda r: -r["time_s"])


def comm_time_s(grad_bytes: float, param_bytes: float, n: int, sharding: str, link_bytes_per_s: float,
                alpha_s: float, overlappable_s: float) -> tuple[float, float]:
    """(total, exposed) seconds of the data-parallel collectives of one step.

    DDP all-reduces the gradients; ZeRO-1/2 reduce-scatter them and all-gather the updated
    parameters; FSDP / ZeRO-3 also gather the parameters again for backward. Collectives overlap
    the backward (DDP buckets) or the forward and backward (FSDP prefetch): what exceeds that
    compute is exposed, and never less than the last 25 MiB bucket."""
    from tensorpilot.plan.timing import allgather_time_s, allreduce_time_s, reducescatter_time_s

    if n <= 1:
        return 0.0, 0.0
    if sharding == "none":
        total = allreduce_time_s(grad_bytes, n, link_bytes_per_s, alpha_s)
    elif sharding in ("zero1", "zero2"):
        total = reducescatter_time_s(grad_bytes, n, link_bytes_per_s, alpha_s) + \
            allgather_time_s(param_bytes, n, link_bytes_per_s, alpha_s)
    else:
        total = reducescatter_time_s(grad_bytes, n, link_bytes_per_s, alpha_s) + \
            2 * allgather_time_s(param_bytes, n, link_bytes_per_s, alpha_s)
    tail = total * min(1.0, BUCKET_BYTES / max(grad_bytes, 1.0))
    return total, max(total - overlappable_s, tail)


def sharded_memory(memory: dict[str, float], n: int, sharding: str) -> dict[str, float]:
    """Model states per device under the sharding (ZeRO, Rajbhandari et al. 2020, figure 1):
    zero1 splits optimizer state, zero2 also gradients, zero3/fsdp also parameters."""
    if n <= 1 or sharding == "none":
        return dict(memory)
    split = {"zero1": ("optimizer",), "zero2": ("optimizer", "gradients"),
             "zero3": ("optimizer", "gradients", "parameters"), "fsdp": ("optimizer", "gradients", "parameters")}
    out = {k: (v / n if k in split.get(sharding, ()) else v) for k, v in memory.items() if k != "total"}
    out["total"] = sum(out.values())
    return out


def predict_step(trace: StepTrace, costs: Any, *, model: str, batch_size: int, precision: str, optimizer: str,
                 factors: dict[str, float] | None = None, n_devices: int = 1, sharding: str = "none",
                 link_bytes_per_s: float | None = None, alpha_s: float = 10e-6,
                 device_memory_bytes: float | None = None, peak_flops_per_s: float | None = None,
                 peak_source: str = "", tokens_per_sample: int | None = None, top: int = 10,
                 module_types: dict[str, str] | None = None, grad_accum: int = 1,
                 cpu_buffers: bool = False, stack_efficiency: float = 1.0,
                 host_efficiency: float = 1.0) -> ModelPlan:
    """The plan of the traced step on ``costs``' device (per device of ``n_devices`` data-parallel
    replicas, each with ``batch_size`` samples). ``cpu_buffers``: add the transient buffers of
    CPU convolutions to the peak (a CPU device). ``stack_efficiency`` / ``host_efficiency``: the
    share of the op rates (compute and memory classes) / of the host's ops a second the user's
    stack reaches (plan.anchor); links keep their rates."""
    from tensorpilot.plan import calibration as cal

    factors = {c: (factors or {}).get(c, 1.0) for c in CLASSES}
    # time multipliers per class: calibration over the stack's share
    scale = {"compute": factors["compute"] / stack_efficiency, "memory": factors["memory"] / stack_efficiency,
             "host": factors["host"] / host_efficiency}
    raw = class_times(trace, costs, grad_accum)
    compute = raw["compute"] * scale["compute"]
    memory_s = raw["memory"] * scale["memory"]
    ops_s = compute + memory_s
    # host: what a step costs between its ops (Python module calls, autograd, the optimizer's
    # Python), per op as measured on the device; on a GPU it overlaps the kernels it queues
    host = raw["host"] * scale["host"]
    if getattr(costs, "async_host", False):
        host = max(host - ops_s, 0.0)
    back = {"compute": 0.0, "memory": 0.0}        # the last micro-batch's backward, per class
    for o in trace.ops:
        if o.phase == "backward":
            back[op_class_group(o.op_class)] += costs.op_time_s(o)
    backward = scale["compute"] * back["compute"] + scale["memory"] * back["memory"]
    grad_bytes = float(trace.memory.get("gradients") or 0.0)
    param_bytes = float(trace.memory.get("parameters") or 0.0)
    grad_bytes = max(grad_bytes, trace.trainable_params * 4.0)
    comm, exposed = comm_time_s(grad_bytes, param_bytes, n_devices, sharding, link_bytes_per_s or 1e10, alpha_s,
                                backward if sharding == "none" else ops_s)
    step = ops_s + host + exposed
    memory = sharded_memory(trace.memory, n_devices, sharding)
    if cpu_buffers and trace.cpu_peak > trace.memory["total"]:     # oneDNN's convolution buffers
        memory["conv_buffers"] = trace.cpu_peak - trace.memory["total"]
        memory["total"] += memory["conv_buffers"]
    limit = device_memory_bytes * (1 - cal.SAFETY_MARGIN_FRACTION) if device_memory_bytes else None
    flops = float(trace.flops)
    mfu = flops * grad_accum / step / peak_flops_per_s if peak_flops_per_s and step > 0 else None
    notes = list(trace.notes)
    if n_devices > 1:
        notes.append(f"data-parallel communication {comm * 1e3:,.1f} ms per step, {exposed * 1e3:,.1f} ms of it "
                     "not hidden behind compute")
    op_rows = sorted(({"op": o.op, "module": o.module, "phase": o.phase, "class": o.op_class, "flops": o.flops,
                       "bytes": o.bytes_read + o.bytes_written, "time_s": costs.op_time_s(o)} for o in trace.ops
                      if o.op_class != "view"), key=lambda r: -r["time_s"])[:top]
    return ModelPlan(
        model=model, hardware=costs.name, n_devices=n_devices, sharding=sharding, batch_size=batch_size,
        precision=precision, optimizer=optimizer, params=trace.params, trainable_params=trace.trainable_params,
        memory_bytes=memory, memory_method=trace.memory_method, memory_accounting=dict(trace.accounting),
        memory_limit_bytes=limit,
        device_memory_bytes=device_memory_bytes, fits=None if limit is None else memory["total"] <= limit,
        step_time_s=step, time_breakdown_s={"compute": compute, "memory": memory_s, "host": host,
                                            "communication": exposed},
        model_flops_per_step=flops * n_devices * grad_accum, samples_per_s=batch_size * grad_accum * n_devices / step,
        tokens_per_s=batch_size * grad_accum * n_devices * tokens_per_sample / step if tokens_per_sample else None,
        mfu=mfu, peak_flops_per_s=peak_flops_per_s, peak_source=peak_source, calibration=factors,
        modules=module_table(trace, costs, scale, module_types), ops=op_rows, notes=notes)


__all__ = ["ATTENTION", "CONV", "MATMUL", "CLASSES", "ModelPlan", "class_times", "comm_time_s", "module_table",
           "predict_step", "sharded_memory"]
