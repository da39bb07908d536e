"""Predict, then verify, on every run: the traced plan of this run's step (any model) before the
loop, the measured step time and allocator peak after it, both in summary.json, and the ratios
recorded in this machine's planner calibration (modelplan/calibration.py).

The prediction is made for the run as configured: its model (a meta copy; nothing allocated),
one micro-batch shaped like the run's, its loss, optimizer, autocast dtype and gradient
accumulation, on this device's measured op costs with the calibration of earlier runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from tensorpilot.errors import TensorpilotError, first_line


@dataclass
class RunPrediction:
    plan: Any = None                         # modelplan.predict.ModelPlan
    known: dict[str, str] = field(default_factory=dict)    # "aten::addmm" -> calibration class
    raw: dict[str, float] = field(default_factory=dict)    # class seconds before calibration
    why_not: str | None = None
    # the same step under torch.compile (modelplan/fusion.py), planned when a run that compiles asks
    compiled_plan: Callable[[], Any] | None = None


def _fake_like(batch: Any, device: str = "cpu") -> Callable[[], tuple[Any, Any]]:
    """A function making (inputs, targets) with the shapes and dtypes of the real ``batch``,
    as the tracer's fake tensors (called inside its fake mode) on ``device``, where the traced
    model's fake parameters are: the loader's batch is still on the host, and an op mixing a
    host input with cuda parameters (an embedding's index) fails to trace."""
    def make_one(t):
        if not isinstance(t, torch.Tensor):
            return t
        if t.is_floating_point():
            return torch.randn(t.shape, dtype=t.dtype, device=device)
        return torch.zeros(t.shape, dtype=t.dtype, device=device)

    def walk(obj):
        if isinstance(obj, (tuple, list)):
            return type(obj)(walk(o) for o in obj)
        if isinstance(obj, dict):
            return {k: walk(v) for k, v in obj.items()}
        return make_one(obj)
    return lambda: walk(batch)


def trace_run_step(model: nn.Module, batch: Any, loss_fn: Callable, *, optimizer: str, device: str,
                   autocast: str | None, clip_grad_norm: bool):
    """One step of the run as configured, traced on fake tensors (observe/trace.py: no memory, no
    compute): ``batch`` is one of the run's (inputs, targets) micro-batches, of which only shapes and
    dtypes are used; ``autocast`` a torch dtype name. Raises TraceError, or what an op raised."""
    from tensorpilot.modelplan.planner import optimizer_factory
    from tensorpilot.observe.trace import trace_step

    x, y = batch
    inputs = x if isinstance(x, (tuple, list, dict)) else (x,)
    return trace_step(model, _fake_like((inputs, y), device), loss_fn, optimizer_factory(optimizer, device),
                      device=device, autocast_dtype=getattr(torch, autocast) if autocast else None,
                      clip_grad_norm=clip_grad_norm)


def predict_run(model: nn.Module, batch: Any, loss_fn: Callable, *, name: str, optimizer: str, device: torch.device,
                autocast: str | None, micro_batch: int, grad_accum: int, n_devices: int, sharding: str,
                tokens_per_sample: int | None, clip_grad_norm: bool = True) -> RunPrediction:
    """The traced plan of one step of this run; ``why_not`` says why there is none (an op the
    fake tensors cannot run, a device without measured costs)."""
    from tensorpilot.modelplan import planner
    from tensorpilot.modelplan.costs import local_costs
    from tensorpilot.modelplan.fusion import fuse
    from tensorpilot.modelplan.predict import class_times, op_class_group
    from tensorpilot.observe.trace import TraceError

    precision = {"bfloat16": "bf16", "float16": "fp16"}.get(autocast or "", "fp32")
    try:
        trace = trace_run_step(model, batch, loss_fn, optimizer=optimizer, device=device.type, autocast=autocast,
                               clip_grad_norm=clip_grad_norm)
        def plan_of(steps):
            return planner.plan_local(steps, None, batch_size=micro_batch, precision=precision, optimizer=optimizer,
                                      device=str(device), n_devices=n_devices, sharding=sharding,
                                      grad_accum=grad_accum, name=name, tokens_per_sample=tokens_per_sample,
                                      module_types=planner.trace_types(model), budget_s=20.0)
        plan = plan_of(trace)
    except TraceError as exc:
        return RunPrediction(why_not=f"the step could not be traced ({first_line(exc, 160)})")
    except (TensorpilotError, RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        return RunPrediction(why_not=f"no prediction ({type(exc).__name__}: {first_line(exc, 160)})")
    from tensorpilot.hardware.device import detect

    costs = local_costs(detect(str(device)), trace.ops, budget_s=0.0)        # all measured above: cached
    known = {"aten::" + o.op.split(".", 1)[1]: op_class_group(o.op_class) for o in trace.ops}
    return RunPrediction(plan, known, class_times(trace, costs, grad_accum), compiled_plan=lambda: plan_of(fuse(trace)))


def compare(pred: RunPrediction, *, measured_step_s: float | None, measured_peak: int | None,
            peak_method: str | None, compiled: bool = False) -> dict[str, Any]:
    """summary.json's "predicted": the plan's step time and peak beside the measured ones;
    ``compiled``: the run's step ran under torch.compile, so the compiled plan is the prediction."""
    if pred.plan is None:
        return {"error": pred.why_not}
    p = pred.compiled_plan() if compiled and pred.compiled_plan is not None else pred.plan
    mem = p.memory_bytes["total"]
    how = "traced step (modelplan): measured op costs on this device"
    if p is not pred.plan:
        how += "; compiled: the memory-bound ops between compute ops fused (modelplan/fusion.py)"
    return {"hardware": p.hardware, "method": how,
            "step_time_s": p.step_time_s, "time_breakdown_s": p.time_breakdown_s,
            "measured_step_time_s": measured_step_s,
            "measured_over_predicted": measured_step_s / p.step_time_s if measured_step_s else None,
            "memory_bytes": mem, "memory_breakdown_bytes": p.memory_bytes,
            "measured_memory_bytes": measured_peak, "measured_memory_method": peak_method,
            "memory_measured_over_predicted": measured_peak / mem if measured_peak and mem else None,
            "fits": p.fits, "calibration": p.calibration, "layout": f"{p.n_devices} x {p.sharding}",
            "power_w_per_device": p.power_w_per_device, "energy_per_step_j": p.energy_per_step_j}


def record(pred: RunPrediction, device: str, model: str, op_times: list[tuple[str, float]], wall_s: float):
    """Refit this machine's calibration with one measured run; returns the new factors (None
    when there is nothing to compare)."""
    from tensorpilot.modelplan import calibration

    if pred.plan is None or not op_times or not wall_s:
        return None
    measured = calibration.measured_classes(op_times, pred.known, wall_s)
    return calibration.observe(device, model, measured, pred.raw)
