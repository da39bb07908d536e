"""Helpers of the reliability battery (imported as `battery`; a unique name, unlike conftest):
what a hostile-but-realistic user does to every command.

Each case runs the real CLI in a subprocess (``python -m tensorpilot ...``, forked from an
interpreter that has imported torch already: tests/warm_cli.py) in a temporary directory and
checks the contract of docs/reliability.md:

* bad input -> the documented exit code, the last line of stderr is one sentence
  ``tensorpilot <command>: error: ...`` (or argparse's ``<prog>: error: ...``), no traceback;
* weights are never lost: a run's summary names a checkpoint whose weights are that run's;
* nothing hangs: every subprocess has a timeout, and the tests that signal a run bound how
  long the stop takes.

Runs are tiny (a 2-layer, 64-wide gpt on 32-byte windows, fp32, eager) so the whole battery
fits in CI on two cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import warm_cli  # noqa: E402 - tests/warm_cli.py: each command a process forked from a warm interpreter

# a tiny gpt, fp32 and eager so two runs of it are bitwise comparable
TINY = ["--model.n_layer", "2", "--model.d_model", "64", "--model.n_head", "2", "--model.seq_len", "32",
        "--batch-size", "8", "--compile", "off", "--precision", "fp32", "--data.max_bytes", "200000",
        "--train.eval_batches", "1", "--train.eval_interval", "1000", "--logging.progress", "lines",
        "--no-logging.tensorboard"]


@dataclass
class Result:
    code: int
    out: str
    err: str

    def __str__(self) -> str:          # what a failing assertion shows
        return f"exit {self.code}\n--- stdout:\n{self.out[-3000:]}\n--- stderr:\n{self.err[-3000:]}"


def run(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None,
        stdin: str | None = None) -> Result:
    """``tensorpilot ARGS`` in a subprocess; a hang fails the test through ``timeout``."""
    proc = warm_cli.run(list(args), cwd=cwd, timeout=timeout, input=stdin,
                        env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {})))
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_clean_error(res: Result, code: int, *needles: str) -> str:
    """Exit ``code``; stderr ends in one line saying what is wrong; no traceback anywhere.
    Returns that line."""
    assert "Traceback" not in res.err and "Traceback" not in res.out, str(res)
    assert res.code == code, str(res)
    lines = [line for line in res.err.strip().splitlines() if line.strip()]
    assert lines, str(res)
    last = lines[-1]
    assert ": error: " in last, str(res)
    for needle in needles:
        assert needle.lower() in last.lower(), f"{needle!r} not in {last!r}\n{res}"
    return last


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
