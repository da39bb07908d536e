"""Shared helpers of the benchmarks: machine facts, a foreign-load meter for shared machines,
robust statistics. Benchmarks import this as a sibling module (``python benchmarks/x.py`` puts
``benchmarks/`` on ``sys.path``)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass

import torch

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_NCPU = os.cpu_count() or 1


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
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        dt = time.perf_counter() - self._t0
        busy, own = _busy_ticks(), _own_ticks()
        foreign = None
        if None not in (busy, own, self._busy, self._own) and dt > 0:
            other = (busy - self._busy) - (own - self._own)
            foreign = min(1.0, max(0.0, other / (dt * _HZ * _NCPU)))
        self.result = Timed(dt, foreign)


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


def machine() -> dict:
    from tensorpilot.hardware.device import cpu_name

    return {"cpu": cpu_name(), "logical_cpus": _NCPU, "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "platform": platform.platform()}


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def quartiles(xs: list[float]) -> tuple[float, float] | None:
    if len(xs) < 2:
        return None
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def quiet_trainer(run_dir: str, *, model: str = "gpt", size: str = "tiny", batch: int, accum: int = 1,
                  workers: int = 0, precision: str = "auto", compile: str = "off", ac: bool = False,
                  steps: int = 500):
    """A set-up tensorpilot Trainer for timing steps: no evaluation, checkpoints, TensorBoard or
    progress output. ``steps`` is the planned run length (compile=auto decides on it)."""
    from rich.console import Console

    from tensorpilot import RunConfig, Trainer

    cfg = RunConfig()
    cfg.model.name = model
    if model == "gpt":
        cfg.model.size = size
    cfg.data.batch_size, cfg.engine.grad_accum, cfg.data.num_workers = batch, accum, workers
    cfg.engine.precision, cfg.engine.compile, cfg.engine.activation_checkpointing = precision, compile, ac
    cfg.train.steps, cfg.train.eval_interval = steps, 10**9
    cfg.checkpoint.enabled, cfg.logging.tensorboard, cfg.logging.progress = False, False, "off"
    cfg.run_dir = run_dir
    t = Trainer(cfg, console=Console(quiet=True))
    t.setup()
    return t
