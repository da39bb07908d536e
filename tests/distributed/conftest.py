"""Multi-process tier: real process groups (gloo over loopback) of 2 CPU processes, a tiny gpt,
fp32, deterministic. Each run is a subprocess of the real CLI, so what is tested is what users run
(the launcher forked from an interpreter that has imported torch already, tests/warm_cli.py; the
workers are the fresh interpreters torchrun starts).

The machine of record has 2 cores: runs are tiny (2 layers, width 64, 32-byte context, 5 steps)
and each worker uses one thread.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import warm_cli  # noqa: E402 - tests/warm_cli.py: the launcher forked from a warm interpreter

# the same tiny gpt as tests/integration, fp32, every step logged, no evaluation in between
TINY = ["--model.n_layer", "2", "--model.d_model", "64", "--model.n_head", "2", "--model.seq_len", "32",
        "--compile", "off", "--precision", "fp32", "--data.max_bytes", "400000", "--train.eval_batches", "1",
        "--train.eval_interval", "1000", "--train.log_interval", "1", "--logging.progress", "lines",
        "--no-logging.tensorboard"]


@pytest.fixture(scope="session", autouse=True)
def distributed_env():
    """One thread per worker, loopback for gloo (the cache directory: tests/conftest.py)."""
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")}
    os.environ.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def run(*args: str, cwd: Path | None = None, timeout: float = 180, module: str = "tensorpilot", check=True):
    proc = warm_cli.run(list(args), module=module, cwd=cwd, timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}")
    return proc


def train_losses(run_dir: Path) -> dict[int, float]:
    """step -> logged training loss (the all-reduced loss of the global batch)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}
