"""Shared helpers for the end-to-end tier: run the real CLI in a subprocess, in a temp dir (a
process of its own, forked from an interpreter that has imported torch already: tests/warm_cli.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import warm_cli  # noqa: E402 - tests/warm_cli.py: each command a process forked from a warm interpreter


# tiny, fast settings: a 2-layer 64-wide gpt, 32-byte context, no compilation
FAST = ["--model.n_layer", "2", "--model.d_model", "64", "--model.n_head", "2", "--model.seq_len", "32",
        "--batch-size", "8", "--compile", "off", "--data.max_bytes", "400000",
        "--train.eval_batches", "2", "--logging.progress", "lines"]


def run_cli(*args: str, cwd: Path | None = None, check: bool = False, timeout: float = 300,
            env: dict[str, str] | None = None):
    proc = warm_cli.run(list(args), cwd=cwd, timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def trained_gpt(tmp_path_factory) -> Path:
    """A run directory of the FAST gpt trained 2 steps by the real CLI, shared by the tests that
    only read it or are refused before writing to it; a test that changes it works on a copy."""
    run = tmp_path_factory.mktemp("trained-gpt") / "run"
    run_cli("train", *FAST, "--steps", "2", "--run-dir", str(run), check=True)
    return run
