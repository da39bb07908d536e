"""One measured step of the user's own stack, carried to the layouts, sizes and parts not measured.

The planner's rates are those of a tuned stack (the GEMM and attention ceilings measured for each
part, fused kernels where the setup says so). A user's stack -- its framework and versions, data
loading, launch gaps, kernels the planner does not know -- reaches some share of them, and that
share, not the hardware, decides most of the planner's misses on published runs (benchmarks/
RESULTS.md, the blind sets). One measurement fixes one share, of whatever sets the measured step
(the roofline argument: a measurement informs the bound that is active):

- a step the planner sees bound by its kernels: the *stack efficiency*, the factor on every kernel
  rate (GEMMs, attention, memory-bound ops: timing.kernel_share) at which the planned step of the
  measured layout takes the measured time;
- a step the planner sees waiting for the host to dispatch eager ops (a small batch): the *host
  efficiency*, the factor on the ops a second the host dispatches (calibration.EAGER_SECONDS_PER_OP).
  Blaming such a step's time on the kernels would slow every larger run of the stack by it.

Links and offload keep their own rates -- they are not the stack's. The factor then carries to
another layout, batch, model size or part run by the same stack (`plan --measured-step-s`, `plan
validate --anchor`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tensorpilot.plan.limits import MAX_STACK_EFFICIENCY

__all__ = ["BLIND_MEDIAN_ABS_ERROR", "BLIND_RUNS", "BLIND_WITHIN_10", "BOUND", "MIN_STACK_EFFICIENCY", "PARTS", "RATES",
           "Anchor", "anchor_part", "expected_error_sentence", "sentence", "solve_efficiency", "solve_part",
           "stack_efficiency"]

# How far an unanchored plan lands from what a stack then measures: every blind pass of `plan
# validate` (published runs collected after the constants were fixed and validated before any
# change they prompted; benchmarks/results/holdout*_blind.md, one row per run, error column), memory
# rows included. tests/unit/test_plan_anchor.py recomputes these from those files.
BLIND_RUNS = 10168
BLIND_MEDIAN_ABS_ERROR = 0.225
BLIND_WITHIN_10 = 0.26

# below 1% of a tuned stack's kernel rates a measurement says more about its setup (a CPU
# fallback, a debugger) than about a stack the planner can carry elsewhere
MIN_STACK_EFFICIENCY = 0.01
# the solve stops once the planned speed is within this relative distance of the measured one
TOLERANCE = 1e-3
MAX_STEPS = 12


# what a solved factor multiplies: TrainSetup's field of that name
PARTS = ("stack_efficiency", "host_efficiency")
# the planner's rates each part is a share of, as messages name them
RATES = {"stack_efficiency": "kernel rates", "host_efficiency": "op-dispatch rate"}
# what sets a step that part is solved on, where the rates' name does not say it
BOUND = {"stack_efficiency": "", "host_efficiency": " (the step waits for the host)"}


@dataclass(frozen=True, slots=True)
class Anchor:
    efficiency: float       # the factor on kernel rates (TrainSetup.stack_efficiency) or the host's op rate
    reached: bool           # False: no factor in [MIN, MAX] reproduces the measurement (it is clamped)
    part: str = "stack_efficiency"      # which of PARTS it is


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
            raise ValueError(f"the planned speed at a factor of {e:.3g} is {v!r}, not a positive number")
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
        if slope <= 0:                           # the factor no longer sets the speed here
            break
        x2 = min(hi, max(lo, x1 + (target - y1) / slope))
        if x2 == x1:                             # clamped at a bound that cannot reach it
            break
        x0, y0, x1 = x1, y1, x2
        y1 = log_speed(math.exp(x1))
    return Anchor(math.exp(x1), abs(y1 - target) <= 10 * TOLERANCE)


def anchor_part(breakdown: dict[str, float]) -> str:
    """The factor a measured step informs, from its plan's time breakdown: the host's when the plan
    waits for the host to dispatch ops, else the kernels'."""
    return "host_efficiency" if breakdown.get("host_dispatch", 0.0) > 0 else "stack_efficiency"


def solve_part(speed_at: Callable[[str, float], float], part: str, measured: float) -> Anchor:
    """``solve_efficiency`` of ``part``; a host-bound step the host alone cannot reproduce (a
    measurement faster than the kernels allow) falls back to the kernels' factor."""
    found = solve_efficiency(lambda e: speed_at(part, e), measured)
    if found.reached or part == "stack_efficiency":
        return Anchor(found.efficiency, found.reached, part)
    found = solve_efficiency(lambda e: speed_at("stack_efficiency", e), measured)
    return Anchor(found.efficiency, found.reached, "stack_efficiency")


def stack_efficiency(spec, acc, layout, setup, measured_step_s: float) -> Anchor:
    """The factor at which ``layout`` of ``spec`` on ``acc`` steps in ``measured_step_s``: the
    kernels' or, for a step its plan sees host-bound, the host's (anchor_part)."""
    from dataclasses import replace

    from tensorpilot.plan.predict import predict

    plan = predict(spec, acc, layout, setup)

    def speed_at(part: str, e: float) -> float:
        if e == getattr(setup, part):            # the plan already made (the solve starts there)
            return 1.0 / plan.step_time_s
        return 1.0 / predict(spec, acc, layout, replace(setup, **{part: e})).step_time_s

    return solve_part(speed_at, anchor_part(plan.time_breakdown_s), 1.0 / measured_step_s)


def expected_error_sentence() -> str:
    """What an unanchored plan's figures are worth, and the flag that narrows them."""
    return (f"expect misses: of {BLIND_RUNS:,} published runs the planner was not tuned on, half were "
            f"predicted within {BLIND_MEDIAN_ABS_ERROR:.0%} ({BLIND_WITHIN_10:.0%} within 10%); measure one "
            "step of your stack and pass --measured-step-s SECONDS to plan from the share of these rates it "
            "reaches.")


def sentence(found: Anchor, subject: str, measured_step_s: float, clamped_because: str = "") -> str:
    """What a solved share says to the user: its value, the rates it is a share of, the step it
    reproduces (``subject`` steps in ``measured_step_s``) and the flag that carries it to other
    plans; a clamped one says so (``clamped_because``: why no share reproduces it)."""
    flag = "--" + found.part.replace("_", "-")
    said = (f"{found.part.replace('_', ' ')} {found.efficiency:.3g}: the share of the planner's {RATES[found.part]}"
            f"{BOUND[found.part]} "
            f"at which {subject} steps in the measured {measured_step_s:,.4g} s (pass {flag} {found.efficiency:.3g} "
            "to plan other runs of this stack)")
    if not found.reached:
        said += f"; no share reproduces the measurement{clamped_because}, so it is clamped"
    return said
