"""A stop signal at a step boundary, agreed by every rank, then one collective checkpoint: no hang,
no traceback, exit 130, and the run continues from that checkpoint.

Real processes: ``tensorpilot train --nproc 2`` starts torchrun's agent, which starts two
workers over gloo on loopback; the signal goes to one worker or to the launcher, as a
scheduler's preemption or a user's ``kill`` would send it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from battery import TINY, Result, assert_clean_error, run

STOP_BOUND_S = 60          # from the signal to the launcher's exit, checkpoint included


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:       # field 4: the parent's pid
                kids.append(int(entry.name))
    return sorted(kids)


def _start(run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tensorpilot", "train", *TINY, "--steps", "100000", "--run-dir", str(run_dir),
         "--checkpoint.interval", "100000", "--train.log_interval", "1", *extra],
        cwd=run_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"))


def _wait_for_steps(proc: subprocess.Popen, run_dir: Path, steps: int, timeout: float = 120) -> None:
    metrics, t0 = run_dir / "metrics.jsonl", time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.communicate()}")
        if metrics.exists() and metrics.read_text().count('"kind": "train"') >= steps:
            return
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the run did not reach its first steps in time")


def _stop(proc: subprocess.Popen, pid: int) -> tuple[Result, float]:
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"no stop within {STOP_BOUND_S} s of SIGTERM: a hang") from None
    return Result(proc.returncode, out, err), time.monotonic() - t0


def _saved_step(run_dir: Path) -> int:
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    assert ckpts, "no checkpoint after the stop"
    return int(ckpts[-1].name.split("_")[1])


@pytest.mark.parametrize("target", ["one worker", "the launcher"])
def test_sigterm_stops_a_two_process_run_together_with_a_checkpoint(tmp_path, target):
    run_dir = tmp_path / "D"
    proc = _start(run_dir, "--nproc", "2", "--parallel.sharding", "ddp")
    _wait_for_steps(proc, run_dir, 3)
    workers = _children(proc.pid)
    assert len(workers) >= 2, workers
    res, _ = _stop(proc, workers[-1] if target == "one worker" else proc.pid)
    line = assert_clean_error(res, 130, "interrupted", "--resume", "--nproc 2")
    step = _saved_step(run_dir)
    assert f"step_{step:08d}" in line
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] == "SIGTERM" and summary["steps"] == step
    # the suggested command works: without --run-dir it continues in the same directory
    res = run("train", "--resume", str(run_dir), "--nproc", "2", "--steps", str(step + 2),
              "--logging.progress", "off", cwd=tmp_path, timeout=180)
    assert res.code == 0, str(res)
    assert _saved_step(run_dir) == step + 2 and not (tmp_path / "runs").exists()


def test_sigterm_to_a_single_process_run(tmp_path):
    run_dir = tmp_path / "S"
    proc = _start(run_dir)
    _wait_for_steps(proc, run_dir, 2)
    res, _ = _stop(proc, proc.pid)
    assert_clean_error(res, 130, "interrupted by SIGTERM", "checkpoint saved")
    assert _saved_step(run_dir) >= 2


def test_sighup_stops_like_sigterm_and_a_second_run_cannot_share_the_directory(tmp_path):
    run_dir = tmp_path / "H"
    proc = _start(run_dir)
    _wait_for_steps(proc, run_dir, 2)
    # two runs in one directory would prune and replace each other's checkpoints: refused
    other = run("train", *TINY, "--steps", "3", "--run-dir", str(run_dir), cwd=tmp_path)
    assert_clean_error(other, 2, "in use by another tensorpilot run", f"process {proc.pid}")
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGHUP)                     # the terminal went away
    out, err = proc.communicate(timeout=STOP_BOUND_S)
    assert_clean_error(Result(proc.returncode, out, err), 130, "interrupted by SIGHUP", "checkpoint saved")
    assert time.monotonic() - t0 < STOP_BOUND_S and _saved_step(run_dir) >= 2
    # the lock went with the process: the directory is free again
    res = run("train", "--resume", str(run_dir), "--steps", str(_saved_step(run_dir) + 1), cwd=tmp_path)
    assert res.code == 0, str(res)


@pytest.mark.parametrize("delay_s", [0.3, 2.0], ids=["while importing", "while setting up"])
def test_a_stop_signal_before_training_starts_is_one_sentence(tmp_path, delay_s):
    proc = _start(tmp_path / "E")
    time.sleep(delay_s)
    res, _ = _stop(proc, proc.pid)
    assert_clean_error(res, 130, "interrupted by SIGTERM")
