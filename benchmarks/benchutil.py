"""Shared helpers of the benchmarks: machine facts, a foreign-load meter for shared machines,
robust statistics, a quiet Trainer (all from tensorpilot.bench.measure, the one copy that
`tensorpilot bench` uses too), and the peak a run's MFU is computed against. Benchmarks import
this as a sibling module (``python benchmarks/x.py`` puts ``benchmarks/`` on ``sys.path``)."""

from __future__ import annotations

from tensorpilot.bench.measure import (LoadMeter, Timed, machine, median, quartiles,  # noqa: F401 - re-exported
                                       quiet_trainer)


# tensorpilot's peak functions are moving (observe.peak -> hardware.peak/probe); accept both.
def matmul_ceiling(dtype: str, n: int = 2048) -> float:
    """tensorpilot's measured matmul FLOP/s (n x n, median of 5) at ``dtype``, measured now."""
    try:
        from tensorpilot.hardware.probe import matmul_flops
    except ImportError:
        from tensorpilot.observe.peak import measure_matmul_flops as matmul_flops
    return matmul_flops("cpu", dtype, n)


def tensorpilot_peak(dtype: str) -> tuple[float | None, str]:
    """The peak tensorpilot's own summary divides by (usually a cached measurement)."""
    try:
        from tensorpilot.hardware.peak import device_peak
    except ImportError:
        from tensorpilot.observe.peak import peak_flops

        peak = peak_flops("cpu", dtype)
        return peak.flops_per_s, peak.source
    return device_peak("cpu", dtype).mfu_basis
