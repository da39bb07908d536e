"""The typical stack's share of a tuned recipe's rates (calibration.TYPICAL_STACK_EFFICIENCY), measured.

The planner's rates reproduce a tuned recipe: published runs from the performance tables of the
teams that tuned them (validate.row_stack "recipe": NeMo / Megatron-Bridge tables, DGX Cloud
benchmarking, Megatron-LM's papers, MLPerf, llm-foundry, torchtitan's and MaxText's docs) centre on
them. Every other stack runs slower. This script takes the
speed rows (throughput, TFLOP/s, MFU, step time, totals) outside the reference split and prints:

1. by kind of stack, the median signed error on speed (a step time planned 10% long is a speed
   planned 9.1% slow) at the full rates, overall and by the pass the rows were collected in
   (early: split holdout < --cut, late: the rest) -- is the gap one level, or does it drift?
2. the stack efficiency at which the typical rows' median speed error is zero (secant steps; the
   factor multiplies every kernel rate, as `plan --stack-efficiency` does), fitted on all of them
   and on the early passes alone, and what each does to the late passes' median |error|.

    python benchmarks/stack_prior.py [tests/unit/data/published_runs.csv] [--hardware-file FILE.toml] [--cut 55]
    python benchmarks/stack_prior.py --group 'maxtext' --group 'deepspeed.*blogs'     # 1. and groups only

``--group REGEX`` (repeatable) also prints the median speed error at full rates of the rows whose
source column matches REGEX (lower-case), tracker threads (issues, pull requests) apart, and skips 2.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
from pathlib import Path

from tensorpilot.hardware import catalog
from tensorpilot.plan import calibration as cal
from tensorpilot.plan.validate import _TRACKER, _speed, load_rows, predict_row, row_stack

ROOT = Path(__file__).resolve().parent.parent
SPEED_KINDS = ("throughput", "step_time", "totals")


def pass_number(split: str) -> int | None:
    m = re.match(r"holdout(\d+)", split)
    return int(m.group(1)) if m else None


def log_speed_error(result) -> float:
    """log(planned speed / published speed) of a predicted row."""
    return math.log(_speed(result.metric, result.predicted) / _speed(result.metric, result.published))


def errors_at(rows, efficiency: float) -> list[float]:
    """Each row's log speed error with the typical stack at ``efficiency`` (None where not modelled)."""
    saved = cal.TYPICAL_STACK_EFFICIENCY
    cal.TYPICAL_STACK_EFFICIENCY = efficiency
    try:
        out = []
        for n, row in enumerate(rows, 1):
            r = predict_row(row, n)
            out.append(log_speed_error(r) if r.predicted and r.published and r.kind in SPEED_KINDS else None)
        return out
    finally:
        cal.TYPICAL_STACK_EFFICIENCY = saved


def pct(log_error: float) -> str:
    return f"{math.expm1(log_error) * 100:+.1f}%"


def median_abs(errors) -> float:
    return statistics.median(abs(math.expm1(e)) for e in errors) * 100


def centre(rows, steps: int = 4) -> float:
    """The typical stack efficiency at which ``rows``' median log speed error is zero: secant steps
    on log efficiency, from 1 and from the guess a kernel-bound speed (proportional to it) makes."""
    def median_at(e: float) -> float:
        return statistics.median(x for x in errors_at(rows, e) if x is not None)

    a, fa = 0.0, median_at(1.0)
    b = -fa
    for _ in range(steps):
        fb = median_at(math.exp(b))
        if abs(fb) < 1e-4 or fb == fa:
            break
        a, fa, b = b, fb, b - fb * (b - a) / (fb - fa)
    return round(math.exp(b), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="?", default=str(ROOT / "tests/unit/data/published_runs.csv"))
    ap.add_argument("--hardware-file", default=str(ROOT / "tests/unit/data/published_runs_hardware.toml"))
    ap.add_argument("--cut", type=int, default=55, help="first holdout pass counted as late (default 55)")
    ap.add_argument("--group", action="append", default=[], metavar="REGEX",
                    help="also print the rows whose source matches REGEX, and skip the fit")
    args = ap.parse_args()
    catalog.load_hardware_file(args.hardware_file)
    rows = [r for r in load_rows(args.csv) if r.get("split", "") != "reference"]
    kinds = {id(r): row_stack(r) for r in rows}
    full = errors_at(rows, 1.0)
    speed = [(r, e) for r, e in zip(rows, full) if e is not None]
    print(f"speed rows outside the reference split: {len(speed):,} of {len(rows):,}")
    for kind in cal.STACKS:
        mine = [(r, e) for r, e in speed if kinds[id(r)] == kind]
        early = [e for r, e in mine if (pass_number(r.get("split", "")) or 0) < args.cut]
        late = [e for r, e in mine if (pass_number(r.get("split", "")) or 0) >= args.cut]
        sources = len({r.get("source", "") for r, _ in mine})
        print(f"  {kind:8s} {len(mine):6,d} rows of {sources:5,d} sources: median speed error at full rates "
              f"{pct(statistics.median(e for _, e in mine))} (early {pct(statistics.median(early))}, "
              f"{len(early):,}; late {pct(statistics.median(late))}, {len(late):,})")
    for pattern in args.group:
        for label, tracker in (("published", False), ("tracker threads", True)):
            errs = [e for r, e in speed if re.search(pattern, r.get("source", "").lower())
                    and bool(_TRACKER.search(r.get("source", "").lower())) == tracker]
            if errs:
                print(f"  /{pattern}/ {label}: {len(errs):,} rows, median speed error at full rates "
                      f"{pct(statistics.median(errs))}")
    if args.group:
        return
    typical = [r for r, _ in speed if kinds[id(r)] == "typical"]
    early_rows = [r for r in typical if (pass_number(r.get("split", "")) or 0) < args.cut]
    late_rows = [r for r in typical if (pass_number(r.get("split", "")) or 0) >= args.cut]
    e_all, e_early = centre(typical), centre(early_rows)
    print(f"typical stack efficiency centring all typical rows: {e_all:g}; the early passes' alone: {e_early:g}")
    for label, e in (("full rates", 1.0), (f"early-fitted {e_early:g}", e_early), (f"all-fitted {e_all:g}", e_all)):
        errs = [x for x in errors_at(late_rows, e) if x is not None]
        print(f"  late passes ({len(errs):,} typical speed rows) at {label}: median |error| {median_abs(errs):.1f}%, "
              f"signed {pct(statistics.median(errs))}")


if __name__ == "__main__":
    main()
