"""How busy the machine is with other processes while this one measures: on a shared 2-core box
a colleague's test run can double a step's time, so benchmarks flag (and the planner does not
cache) what was timed under load. Linux /proc counters; elsewhere the load is unknown (None)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_NCPU = os.cpu_count() or 1

__all__ = ["LoadMeter", "Timed"]


def _busy_ticks() -> int | None:
    """Busy clock ticks of the whole machine (user+nice+system+irq+softirq+steal), Linux only."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            f = [int(v) for v in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = f
    return user + nice + system + irq + softirq + steal


def _own_ticks() -> int | None:
    """utime + stime of this process (all its threads), Linux only."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[11]) + int(rest[12])              # fields 14 and 15 of proc(5)


@dataclass(slots=True)
class Timed:
    seconds: float
    foreign: float | None      # share of all CPUs busy with *other* processes (or stolen) meanwhile


class LoadMeter:
    """Time a block and measure how much of the machine other processes used meanwhile.

    On a shared 2-core box a colleague's test run can double a step's time; the meter lets a
    benchmark flag those steps (``foreign`` > a threshold) instead of silently averaging them in.
    """

    def __enter__(self) -> LoadMeter:
        self._busy, self._own = _busy_ticks(), _own_ticks()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        dt = time.perf_counter() - self.t0
        busy, own = _busy_ticks(), _own_ticks()
        foreign = None
        if None not in (busy, own, self._busy, self._own) and dt > 0:
            other = (busy - self._busy) - (own - self._own)
            foreign = min(1.0, max(0.0, other / (dt * _HZ * _NCPU)))
        self.result = Timed(dt, foreign)
