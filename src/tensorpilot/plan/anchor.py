"""One measured step of the user's own stack, carried to the layouts, sizes and parts not measured.

The planner's rates are those of a tuned stack (the GEMM and attention ceilings measured for each
part, fused kernels where the setup says so). A user's stack -- its framework and versions, data
loading, launch gaps, kernels the planner does not know -- reaches some share of them, and that
share, not the hardware, decides most of the planner's misses on published runs (benchmarks/
RESULTS.md, the blind sets). One measurement fixes it: the *stack efficiency* is the factor on
every kernel rate (GEMMs, attention, memory-bound ops: timing.kernel_share) at which the planned
step of the measured layout takes the measured time. Links, the host's dispatch and offload keep
their own rates -- they are not the kernels'. The factor then carries to another layout, batch,
model size or part run by the same stack (`plan --measured-step-s`, `plan validate --anchor`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tensorpilot.plan.limits import MAX_STACK_EFFICIENCY

__all__ = ["MIN_STACK_EFFICIENCY", "Anchor", "solve_efficiency", "stack_efficiency"]

# below 1% of a tuned stack's kernel rates a measurement says more about its setup (a CPU
# fallback, a debugger) than about a stack the planner can carry elsewhere
MIN_STACK_EFFICIENCY = 0.01
# the solve stops once the planned speed is within this relative distance of the measured one
TOLERANCE = 1e-3
MAX_STEPS = 12


@dataclass(frozen=True, slots=True)
class Anchor:
    efficiency: float       # the factor on kernel rates (TrainSetup.stack_efficiency)
    reached: bool           # False: no factor in [MIN, MAX] reproduces the measurement (it is clamped)


def solve_efficiency(speed_at: Callable[[float], float], measured: float) -> Anchor:
    """The factor e with ``speed_at(e) == measured``, for a ``speed_at`` that grows with e (a
    throughput, or the inverse of a step time). Secant steps on log speed against log e: a
    kernel-bound step scales as e (slope 1, found in one step), one with exposed communication
    more slowly, which the secant learns from the points it has."""
    if not (measured > 0 and math.isfinite(measured)):
        raise ValueError(f"a measured speed must be a positive number, not {measured!r}")
    def log_speed(e: float) -> float:
        v = speed_at(e)
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"the planned speed at stack efficiency {e:.3g} is {v!r}, not a positive number")
        return math.log(v)

    lo, hi = math.log(MIN_STACK_EFFICIENCY), math.log(MAX_STACK_EFFICIENCY)
    target = math.log(measured)
    x0, y0 = 0.0, log_speed(1.0)
    x1 = min(hi, max(lo, target - y0))           # slope 1: speed proportional to e
    if abs(y0 - target) <= TOLERANCE:
        return Anchor(1.0, True)
    y1 = log_speed(math.exp(x1))
    for _ in range(MAX_STEPS):
        if abs(y1 - target) <= TOLERANCE:
            return Anchor(math.exp(x1), True)
        slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
        if slope <= 0:                           # the kernels no longer set the speed here
            break
        x2 = min(hi, max(lo, x1 + (target - y1) / slope))
        if x2 == x1:                             # clamped at a bound that cannot reach it
            break
        x0, y0, x1 = x1, y1, x2
        y1 = log_speed(math.exp(x1))
    return Anchor(math.exp(x1), abs(y1 - target) <= 10 * TOLERANCE)


def stack_efficiency(spec, acc, layout, setup, measured_step_s: float) -> Anchor:
    """The stack efficiency at which ``layout`` of ``spec`` on ``acc`` steps in ``measured_step_s``."""
    from dataclasses import replace

    from tensorpilot.plan.predict import predict

    return solve_efficiency(
        lambda e: 1.0 / predict(spec, acc, layout, replace(setup, stack_efficiency=e)).step_time_s,
        1.0 / measured_step_s)
