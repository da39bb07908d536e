"""How `tensorpilot bench` and the scripts in benchmarks/ time things: a foreign-load meter for
shared machines, robust statistics, the machine's facts, and a quiet tensorpilot Trainer for
timing steps. benchmarks/benchutil.py re-exports these (one copy)."""

from __future__ import annotations

import platform
import statistics
from dataclasses import dataclass
from typing import Any

from tensorpilot.hardware.load import _NCPU, LoadMeter, Timed  # noqa: F401 - re-exported

__all__ = ["LoadMeter", "Timed", "StepTimes", "machine", "median", "quartiles", "quiet_trainer", "timed_steps",
           "sync"]


def machine() -> dict:
    import torch

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
                  steps: int = 500, overrides: dict[str, Any] | None = None):
    """A set-up tensorpilot Trainer for timing steps: no evaluation, checkpoints, TensorBoard or
    progress output. ``steps`` is the planned run length (compile=auto decides on it);
    ``overrides``: further dotted settings ({"train.device": "cuda:0", "train.predict": False})."""
    from rich.console import Console

    from tensorpilot.config import RunConfig, apply_mapping, overrides_to_mapping
    from tensorpilot.training.trainer import Trainer

    cfg = RunConfig()
    cfg.model.name = model
    if model == "gpt":
        cfg.model.size = size
    cfg.data.batch_size, cfg.engine.grad_accum, cfg.data.num_workers = batch, accum, workers
    cfg.engine.precision, cfg.engine.compile, cfg.engine.activation_checkpointing = precision, compile, ac
    cfg.train.steps, cfg.train.eval_interval = steps, 10**9
    cfg.checkpoint.enabled, cfg.logging.tensorboard, cfg.logging.progress = False, False, "off"
    cfg.run_dir = run_dir
    if overrides:
        apply_mapping(cfg, overrides_to_mapping(overrides))
    t = Trainer(cfg, console=Console(quiet=True))
    t.setup()
    return t


def sync(device) -> None:
    from tensorpilot.hardware.probe import sync as device_sync

    device_sync(str(device))


@dataclass(slots=True)
class StepTimes:
    seconds: list[float]           # wall time of each timed step
    foreign: list[float | None]    # other processes' share of the machine during each
    losses: list[float]            # the training loss each step reported

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def max_foreign(self) -> float | None:
        return max((f for f in self.foreign if f is not None), default=None)


def timed_steps(trainer, n: int, warmup: int = 1) -> StepTimes:
    """``warmup`` untimed steps, then ``n`` steps each timed to the device's completion."""
    for _ in range(warmup):
        trainer.train_step()
    out = StepTimes([], [], [])
    for _ in range(n):
        sync(trainer.device)
        with LoadMeter() as m:
            loss, _, _ = trainer.train_step()
            sync(trainer.device)
        out.seconds.append(m.result.seconds)
        out.foreign.append(m.result.foreign)
        out.losses.append(loss)
    return out
