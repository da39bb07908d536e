"""The run directory: which one a run writes to, and what happens to an earlier run found there.

A run directory holds one timeline of one run: its checkpoints, metrics and summary all belong
to the same sequence of steps. Two things would break that, and both used to lose weights:

* a fresh run started in a directory that already holds a run (``train --run-dir X`` twice);
* a resume from a checkpoint older than the directory's newest (``--resume X/checkpoints/step_20``
  when steps 30 and 40 exist): the old 30 and 40 belong to the abandoned future.

In both cases what contradicts the new timeline (checkpoints after the resume point, or all of
them for a fresh run, and the metrics, summary, config and TensorBoard files that go with them)
is moved into ``superseded/<time>/`` inside the run directory, and the console says so. Nothing
is deleted: the earlier run's weights stay on disk until the user removes them.

The directory is checked for writability before any data is loaded or model built.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path

from tensorpilot.errors import ConfigError
from tensorpilot.files import writable_dir, write_atomic
from tensorpilot.training import checkpoint as ckpt_io

__all__ = ["new_run_dir", "resolve", "prepare", "lock", "SUPERSEDED"]

SUPERSEDED = "superseded"
# files of a run besides its checkpoints (launch.toml is written by this run's launcher: kept)
RUN_FILES = ("metrics.jsonl", "summary.json", "config.toml", "tensorboard")


def new_run_dir(model_name: str, size: str) -> Path:
    """runs/<time>-<model>-<size>, made unique with a suffix and created here: two runs started
    in the same second claim different directories (mkdir either creates it or fails)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{stamp}-{model_name.split(':')[-1]}-{size}"
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            path, n = Path(f"{base}-{n}"), n + 1
        except OSError:                  # not writable: writable_dir says so in one sentence
            return path


def resolve(run_dir: str | None, resume: str | None, model_name: str, size: str) -> tuple[Path, Path | None]:
    """(the run directory, the checkpoint to resume or None). ``resume`` is a run directory, a
    checkpoint directory, or "latest" (the newest checkpoint of ``run_dir``). Without
    ``run_dir`` a resumed run continues in the directory its checkpoint lives in."""
    resume_from = None
    if resume:
        target = resume if resume != "latest" else run_dir
        if not target:
            raise ConfigError("--resume without a path needs --run-dir to say which run to continue.")
        resume_from = ckpt_io.find_checkpoint(target)
    if run_dir:
        path = Path(run_dir).expanduser()
    elif resume_from is not None and resume_from.parent.name == "checkpoints":
        path = resume_from.parent.parent             # RUN/checkpoints/step_N -> RUN
    else:
        path = new_run_dir(model_name, size)
    return writable_dir(path, "run directory"), resume_from


def _inside(ckpt: Path, run_dir: Path) -> bool:
    # the step directory's own parent (a symlinked step directory is still this run's entry)
    try:
        return ckpt.parent.resolve() == (run_dir / "checkpoints").resolve()
    except OSError:
        return False


LOCK_FILE = ".lock"
LOCK_ENV = "TENSORPILOT_RUN_LOCKED"     # the launcher holds the lock for its workers


class RunLock:
    """An exclusive ``flock`` on ``RUN/.lock`` for as long as a run writes to the directory:
    two runs in one directory would prune and replace each other's checkpoints. The kernel
    drops the lock when the process ends however it ends, so a crash leaves no stale lock.
    (flock is local to one machine: on a shared file system, nodes do not see each other's.)"""

    def __init__(self, run_dir: Path):
        self.fh = None
        if os.environ.get(LOCK_ENV) == str(run_dir.resolve()):
            return                               # a worker of the launcher that holds it
        try:
            import fcntl
        except ImportError:                      # no flock (Windows): unguarded
            return
        fh = open(run_dir / LOCK_FILE, "a+", encoding="ascii")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise ConfigError(f"run directory {str(run_dir)!r} is in use by another tensorpilot run "
                              f"(process {holder}); wait for it to end or use another --run-dir.") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self.fh = fh

    def release(self) -> None:
        if self.fh is not None:
            self.fh.close()                      # closing the file drops the flock
            self.fh = None


def lock(run_dir: Path) -> RunLock:
    return RunLock(run_dir)


def _aside_dir(run_dir: Path) -> Path:
    base = run_dir / SUPERSEDED / datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        path, n = Path(f"{base}-{n}"), n + 1
    return path


def _keep_metrics_until(src: Path, step: int, aside: Path) -> bool:
    """Cut metrics.jsonl back to records of steps <= ``step``; the whole file goes aside first.
    True when something was cut."""
    lines = src.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
            if int(record.get("step", 0)) > step:
                continue
        except (ValueError, TypeError, AttributeError):
            continue                                 # a torn last line of a killed run
        kept.append(line)
    if len(kept) == len(lines):
        return False
    aside.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, aside / src.name)
    write_atomic(src, "".join(kept), "metrics file")
    return True


def prepare(run_dir: Path, resume_from: Path | None) -> str | None:
    """Make ``run_dir`` hold only this run's timeline (rank 0 calls it before anything is
    written). Returns a sentence for the console when something was moved aside, else None."""
    ckpt_root = run_dir / "checkpoints"
    if ckpt_root.is_dir():
        ckpt_io.remove_stale(ckpt_root)
    resume_step = ckpt_io.step_of(resume_from) if resume_from is not None else None
    continuing = resume_from is not None and resume_step is not None and _inside(resume_from, run_dir)
    steps = [p for p in ckpt_root.iterdir() if ckpt_io.STEP_DIR.match(p.name)] if ckpt_root.is_dir() else []
    later = [p for p in steps if not continuing or ckpt_io.step_of(p) > resume_step]
    aside = _aside_dir(run_dir)
    moved: list[str] = []
    for ckpt in sorted(later):
        (aside / "checkpoints").mkdir(parents=True, exist_ok=True)
        os.replace(ckpt, aside / "checkpoints" / ckpt.name)
        moved.append(ckpt.name)
    if continuing:
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file() and _keep_metrics_until(metrics, resume_step, aside):
            moved.append("metrics after step " + str(resume_step))
        if later and (run_dir / "summary.json").is_file():   # it names a checkpoint moved aside
            aside.mkdir(parents=True, exist_ok=True)
            os.replace(run_dir / "summary.json", aside / "summary.json")
    else:
        for name in RUN_FILES:
            if (run_dir / name).exists():
                aside.mkdir(parents=True, exist_ok=True)
                os.replace(run_dir / name, aside / name)
                moved.append(name)
    if not moved:
        return None
    why = (f"they come after the resumed step {resume_step}" if continuing
           else "they belong to an earlier run in this directory")
    return f"moved {', '.join(moved)} to {aside} ({why}; nothing was deleted)"
