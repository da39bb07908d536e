"""The roofline per op class: FLOPs and bytes of the step (from the traced step, observe/trace.py:
torch.utils.flop_counter's formulas and tensor sizes) over the time the profiler measured for
that class, against the device's ceilings and the planner's prediction for the same ops.

Roofline model (Williams, Waterman, Patterson, CACM 2009): a kernel of arithmetic intensity
I = FLOPs / bytes moved can reach at most min(peak FLOP/s, I x memory bytes/s); it is
compute-bound when I is above the ridge point peak / bandwidth, memory-bound below. The
fraction of ceiling is achieved / that attainable rate. Per class the numbers are sums over many
ops of different shapes: a class's intensity is its total FLOPs over its total bytes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tensorpilot.profiling.breakdown import COMPUTE, FRAMEWORK, classify


def trace_class(op: Any) -> str | None:
    """Op class of a traced op (observe.trace.OpRecord), as the profiler's ops are classified;
    None for views (no work)."""
    if op.op_class == "view":
        return None
    if op.phase == "optimizer":
        return "optimizer"
    if op.op_class == "attention":
        return "attention"
    cls = classify("aten::" + op.op.split(".", 1)[-1])
    return None if cls == FRAMEWORK else cls


def class_work(ops: list[Any], grad_accum: int = 1) -> dict[str, dict[str, float]]:
    """FLOPs and bytes (read + written) per op class of one step; forward and backward run once
    per micro-batch, the optimizer once per step."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"flops": 0.0, "bytes": 0.0})
    for op in ops:
        cls = trace_class(op)
        if cls is None:
            continue
        k = 1 if op.phase == "optimizer" else grad_accum
        out[cls]["flops"] += k * op.flops
        out[cls]["bytes"] += k * (op.bytes_read + op.bytes_written)
    return dict(out)


def predicted_times(ops: list[Any], costs: Any, factors: dict[str, float], grad_accum: int = 1) -> dict[str, float]:
    """The planner's seconds per op class for the same ops (modelplan: measured op costs on this
    device, scaled by this machine's calibration factors), and ``host_overhead``: its per-op host
    cost times the op count."""
    from tensorpilot.modelplan.predict import op_class_group

    out: dict[str, float] = defaultdict(float)
    n = 0
    for op in ops:
        k = 1 if op.phase == "optimizer" else grad_accum
        n += k
        cls = trace_class(op)
        if cls is None:
            continue
        out[cls] += k * costs.op_time_s(op) * factors.get(op_class_group(op.op_class), 1.0)
    host = n * getattr(costs, "host_per_op_s", 0.0) * factors.get("host", 1.0)
    if getattr(costs, "async_host", False):          # a GPU: host time overlaps the kernels
        host = max(host - sum(out.values()), 0.0)
    out["host_overhead"] = host
    return dict(out)


def ceilings(device: str, dtype: str) -> dict[str, Any]:
    """Peak FLOP/s for ``dtype`` and memory bytes/s of ``device``, each with where it comes from:
    the `hw --probe` cache, a quick measurement now (cached for next time), or a datasheet."""
    from tensorpilot.hardware import catalog
    from tensorpilot.hardware.device import detect
    from tensorpilot.hardware.peak import device_peak
    from tensorpilot.hardware.probe import copy_bandwidth, load_cached

    peak = device_peak(device, dtype)
    flops, flops_source = peak.measured_flops_per_s, peak.measured_source
    if not flops:
        flops, flops_source = peak.datasheet_flops_per_s, peak.datasheet_source
    cached = load_cached([device])
    probe = cached.device(device) if cached else None
    if probe is not None and probe.copy_bytes_per_s:
        bw, bw_source = probe.copy_bytes_per_s, "measured copy (tensorpilot hw --probe cache)"
    else:
        caps = detect(device)
        key = catalog.normalize_device_name(caps.name) if caps.kind != "cpu" else None
        acc = catalog.get(key) if key else None
        if acc is not None and acc.mem_bw_gb_per_s:
            bw, bw_source = acc.mem_bw_gb_per_s * 1e9, f"datasheet of {key}"
        else:
            bw = copy_bandwidth(device, 64 << 20)
            bw_source = "measured now: a 64 MiB copy (`tensorpilot hw --probe` caches a full probe)"
    return {"dtype": dtype, "peak_flops_per_s": flops, "peak_source": flops_source,
            "bandwidth_bytes_per_s": bw, "bandwidth_source": bw_source}


def rows(seconds: dict[str, float], work: dict[str, dict[str, float]], ceil: dict[str, Any],
         predicted: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One row per op class with measured time: achieved FLOP/s and bytes/s, intensity, bound,
    attainable rate and fraction of it, and the planner's predicted seconds."""
    peak, bw = ceil.get("peak_flops_per_s"), ceil.get("bandwidth_bytes_per_s")
    ridge = peak / bw if peak and bw else None
    out = []
    for cls in COMPUTE:
        t = seconds.get(cls, 0.0)
        w = work.get(cls, {"flops": 0.0, "bytes": 0.0})
        if t <= 0 and not w["flops"] and not w["bytes"]:
            continue
        flops, nbytes = w["flops"], w["bytes"]
        intensity = flops / nbytes if nbytes and flops else None      # no FLOPs counted: moves bytes
        row: dict[str, Any] = {"op_class": cls, "measured_s": t, "flops": flops, "bytes": nbytes,
                               "intensity_flop_per_byte": intensity,
                               "achieved_flops_per_s": flops / t if t > 0 and flops else None,
                               "achieved_bytes_per_s": nbytes / t if t > 0 and nbytes else None,
                               "predicted_s": (predicted or {}).get(cls)}
        if intensity is not None and ridge is not None:
            row["bound"] = "compute" if intensity >= ridge else "memory"
            attainable = min(peak, intensity * bw)
            row["attainable_flops_per_s"] = attainable
            achieved = row["achieved_flops_per_s"]
            row["fraction_of_ceiling"] = achieved / attainable if achieved and attainable else None
        elif nbytes and bw and t > 0:
            row["bound"] = "memory"                  # no FLOPs: moves bytes only
            row["fraction_of_ceiling"] = nbytes / t / bw
        out.append(row)
    return out
