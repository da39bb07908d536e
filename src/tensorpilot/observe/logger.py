"""Metric sinks: JSON lines (one object per record) and TensorBoard event files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Appends to ``metrics.jsonl`` (a resumed run's file was cut back to its resume step, see
    training/rundir.py) and TensorBoard; ``purge_step``: TensorBoard hides events of that step
    and later left by a run that went further before it was resumed from an earlier step."""

    def __init__(self, run_dir: Path, tensorboard: bool, purge_step: int | None = None):
        self.jsonl = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter   # lazy: pulls in tensorboard

            self.tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge_step)

    def log(self, step: int, kind: str, values: dict[str, Any]) -> None:
        record = {"step": step, "kind": kind, **values}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self.tb.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        self.jsonl.close()
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()
