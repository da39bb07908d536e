"""Live progress: a rich bar (loss, throughput, ETA) on a terminal, periodic lines otherwise."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)


class TrainProgress:
    def __init__(self, console: Console, total: int, start: int, mode: str, every: int):
        self.console, self.every = console, every
        self.mode = ("bar" if console.is_terminal else "lines") if mode == "auto" else mode
        self.bar = None
        if self.mode == "bar":
            self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                TextColumn("ETA"), TimeRemainingColumn(), console=console)
            self.task = self.bar.add_task("train", total=total, completed=start, info="")
            self.bar.start()
        self.total = total

    def update(self, step: int, info: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=info)
        elif self.mode == "lines" and (step % self.every == 0 or step == self.total):
            self.console.print(f"step {step}/{self.total}  {info}", highlight=False)

    def note(self, text: str) -> None:
        if self.mode != "off":
            self.console.print(text, highlight=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
