"""The arithmetic of `tensorpilot bench`: pure functions from measured numbers to the figures a
report states and the verdict on each claim. No torch, no clock: every branch is tested with
hand-computed numbers (tests/unit/test_bench.py).

Verdicts are one of three words, always with the figure and, when it is not "holds", the why:

    holds                  the measured figure is inside the claim's range (or beyond it in the
                           claimed direction: "above the claimed range" is said)
    does not hold          it is outside
    not measurable here    this machine cannot measure it (no accelerator, one device, ...)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["HOLDS", "FAILS", "UNMEASURABLE", "Claim", "verdict", "unmeasurable", "saturation_batch",
           "scaling_efficiency", "break_even_steps", "speedup", "ratio", "finite_positive"]

HOLDS, FAILS, UNMEASURABLE = "holds", "does not hold", "not measurable here"

# a batch "saturates" throughput once it reaches this share of the best throughput measured
SATURATION_SHARE = 0.90


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim as articles state it, what was measured for it here, and the verdict."""

    claim: str                 # as stated, e.g. "accelerators are 10-100x faster than CPUs"
    figure: str                # the measured figure in words, e.g. "bf16 is 0.74x fp32's speed"
    verdict: str               # HOLDS, FAILS or UNMEASURABLE
    why: str = ""              # the reason for the verdict (always given when not HOLDS)
    value: float | None = None # the number the verdict was decided on

    def to_dict(self) -> dict:
        return {"claim": self.claim, "figure": self.figure, "verdict": self.verdict, "why": self.why,
                "value": self.value}


def verdict(claim: str, figure: str, value: float | None, low: float, high: float | None = None,
            why: str = "") -> Claim:
    """The claim holds when ``low <= value`` (and ``value <= high`` for a range, where a value
    above the range still holds in the claimed direction, and says so). ``value`` None or not
    finite: not measurable (``why`` says why)."""
    if value is None or not math.isfinite(value):
        return unmeasurable(claim, why or "nothing was measured")
    if value < low:
        return Claim(claim, figure, FAILS, why or f"{value:.3g} is below the claim's {low:.3g}", value)
    if high is not None and value > high:
        return Claim(claim, figure, HOLDS, (why + "; " if why else "") + f"above the claimed range ({value:.3g} > {high:g})",
                     value)
    return Claim(claim, figure, HOLDS, why, value)


def unmeasurable(claim: str, why: str) -> Claim:
    return Claim(claim, "-", UNMEASURABLE, why, None)


def speedup(base_s: float | None, other_s: float | None) -> float | None:
    """How many times faster ``other`` is than ``base`` from their times (2.0: half the time)."""
    if not base_s or not other_s:
        return None
    return base_s / other_s


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return num / den


def saturation_batch(throughput: dict[int, float], share: float = SATURATION_SHARE) -> int | None:
    """The smallest batch whose throughput is within ``1 - share`` of the best one measured:
    past it, a larger batch buys little more (it only adds latency and memory).

    >>> saturation_batch({1: 100.0, 2: 180.0, 4: 300.0, 8: 330.0, 16: 335.0})
    4
    """
    if not throughput:
        return None
    best = max(throughput.values())
    return min(b for b, t in throughput.items() if t >= share * best)


def scaling_efficiency(throughput_1: float | None, throughput_n: float | None, n: int) -> float | None:
    """Throughput of ``n`` processes over ``n`` times one's: 1.0 is linear.

    Weak scaling (the per-process batch fixed, so ``n`` processes do ``n`` times the work per
    step) and strong scaling (the global batch fixed, split ``n`` ways) both read as throughput
    ratios; in step times the first is t1 / tn and the second t1 / (n tn)."""
    if not throughput_1 or not throughput_n or n < 1:
        return None
    return throughput_n / (n * throughput_1)


def break_even_steps(compile_s: float | None, eager_step_s: float | None,
                     compiled_step_s: float | None) -> float | None:
    """Steps after which compiling has paid for itself: compile time / time saved per step;
    None ("never") when the compiled step saves nothing."""
    if compile_s is None or eager_step_s is None or compiled_step_s is None:
        return None
    saving = eager_step_s - compiled_step_s
    if saving <= 0:
        return None
    return max(compile_s, 0.0) / saving


def finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
