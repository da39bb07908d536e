"""Closing the loop: what this machine's measured runs say about the planner's op costs.

After a run, one profiled step's op times are summed per class (compute: matmul, convolution,
attention; memory: every other op; host: the step's wall time less its ops -- Python module
calls, autograd, the optimizer's Python). Each class's ratio measured / predicted
(uncalibrated) moves that class's factor a step toward it:

    factor <- clamp(factor^(1 - WEIGHT) x ratio^WEIGHT, BOUNDS)

a geometric moving average, so one odd run moves a factor only part of the way, and no run can
push it outside ``BOUNDS`` -- a planner that is off by more than 4x on a class has a modelling
error to fix, not a constant to fit. Factors are kept per machine fingerprint (devices, driver,
torch, CPU, threads: ``hardware.probe.fingerprint``) in the cache directory, with the last runs'
observations; ``tensorpilot plan calibration`` shows them, ``--reset`` deletes them, and
``tensorpilot plan --no-calibration`` plans without them.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

CLASSES = ("compute", "memory", "host")
BOUNDS = {"compute": (0.25, 4.0), "memory": (0.25, 4.0), "host": (0.25, 4.0)}
WEIGHT = 0.5
KEEP = 50                                   # observations kept per machine


def path(device: str) -> Path:
    from tensorpilot.hardware.probe import cache_dir, fingerprint

    return cache_dir() / f"calibration-{fingerprint([device])}.json"


def load(device: str) -> dict[str, Any]:
    """The stored calibration (factors and observations); an absent or malformed file is none."""
    try:
        data = json.loads(path(device).read_text())
    except (OSError, ValueError):
        return {"factors": {}, "observations": []}
    if not isinstance(data, dict) or not isinstance(data.get("factors"), dict):
        return {"factors": {}, "observations": []}
    data["factors"] = {c: clamp(c, v) for c, v in data["factors"].items()
                       if c in CLASSES and isinstance(v, (int, float)) and math.isfinite(v) and v > 0}
    data.setdefault("observations", [])
    return data


def factors(device: str) -> dict[str, float]:
    return load(device)["factors"]


def clamp(cls: str, value: float) -> float:
    lo, hi = BOUNDS[cls]
    return min(max(value, lo), hi)


def refit(old: dict[str, float], ratios: dict[str, float]) -> dict[str, float]:
    """Each class's factor moved toward its measured ratio (``ratios``: measured / predicted)."""
    new = dict(old)
    for cls, r in ratios.items():
        if cls not in CLASSES or not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
            continue
        f = old.get(cls, 1.0)
        new[cls] = clamp(cls, math.exp((1 - WEIGHT) * math.log(f) + WEIGHT * math.log(r)))
    return new


def measured_classes(op_times: list[tuple[str, float]], op_classes: dict[str, str], wall_s: float) -> dict[str, float]:
    """Seconds per class of one measured step: the profiled times of the ops the trace recorded
    (``op_classes``: "aten::addmm" -> "compute"), and host = the step's wall time less those."""
    out = {"compute": 0.0, "memory": 0.0}
    for name, seconds in op_times:
        cls = op_classes.get(name)
        if cls is not None:
            out[cls] += seconds
    out["host"] = max(wall_s - out["compute"] - out["memory"], 0.0)
    return out


def observe(device: str, model: str, measured: dict[str, float], predicted: dict[str, float]) -> dict[str, float]:
    """Record one run (seconds per class: measured, and predicted without calibration) and
    refit; returns the new factors."""
    from tensorpilot.errors import TensorpilotError
    from tensorpilot.files import write_atomic

    ratios = {c: measured[c] / predicted[c] for c in CLASSES
              if predicted.get(c) and measured.get(c) and math.isfinite(measured[c])}
    data = load(device)
    data["factors"] = refit(data["factors"], ratios)
    data["observations"] = (data["observations"] + [{
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": model, "ratios": ratios}])[-KEEP:]
    p = path(device)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(p, json.dumps(data, indent=1), "planner calibration")
    except (OSError, TensorpilotError):
        pass                                  # a read-only cache: the run is still measured
    return data["factors"]


def reset(device: str) -> bool:
    try:
        path(device).unlink()
        return True
    except FileNotFoundError:
        return False
