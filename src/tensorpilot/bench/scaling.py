"""Data-parallel scaling of `tensorpilot train` on this machine: the same tiny gpt trained by 1
and N processes through `tensorpilot train --nproc N` (torchrun; gloo over loopback on CPUs,
NCCL on GPUs), each run's summary.json read back, and the measured all-reduce bus bandwidth next
to what one step's gradient all-reduce needs. Shared by the `scaling` suite of `tensorpilot
bench` and benchmarks/scaling.py.

Weak scaling keeps the per-process batch (N processes do N times the work per step); strong
scaling keeps the global batch (each process gets 1/N of it). Both efficiencies are
``figures.scaling_efficiency``: throughput of N over N x throughput of one.

On one CPU the N processes share its cores (each gets cores / N threads, the 1-process run all
of them) and the all-reduce goes through loopback TCP: read the figure as "the cost of DDP
here", not as what N accelerators show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tensorpilot.errors import TensorpilotError, first_line

# tiny gpt, eager fp32, no evaluation or checkpoints: the step alone
TRAIN_ARGS = ["--size", "tiny", "--compile", "off", "--precision", "fp32", "--train.eval_interval", "100000",
              "--train.eval_batches", "1", "--no-checkpoint.enabled", "--logging.progress", "off",
              "--no-logging.tensorboard", "--data.max_bytes", "400000"]


def train_command(nproc: int, run_dir: Path, *, batch: int, steps: int, device: str = "cpu",
                  predict: bool = False) -> list[str]:
    """The exact command line of one run (bench.json records it); ``predict``: the planner's
    step time beside the measured one in summary.json (traces the step first: a few seconds)."""
    return [sys.executable, "-m", "tensorpilot", "train", *TRAIN_ARGS, "--steps", str(steps), "--batch-size",
            str(batch), "--device", device, "--nproc", str(nproc), "--run-dir", str(run_dir),
            "--train.predict" if predict else "--no-train.predict"]


def train(cmd: list[str], run_dir: Path, threads: int, timeout_s: float = 600) -> dict[str, Any]:
    """Run ``cmd`` with ``threads`` intra-op threads per process; its summary.json."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                          env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise TensorpilotError(f"`tensorpilot train --nproc` exited with code {proc.returncode}: "
                               f"{first_line(Exception(lines[-1])) if lines else 'no message'}.")
    return json.loads((run_dir / "summary.json").read_text())


def gradient_allreduce_s(n_params: int, nproc: int, bus_bytes_per_s: float, grad_bytes_per_param: int = 4) -> float:
    """Seconds one step's gradient all-reduce needs at a measured bus bandwidth: a ring
    all-reduce moves 2 (N - 1) / N of the buffer per rank (nccl-tests' bus-bandwidth convention)."""
    return n_params * grad_bytes_per_param * 2 * (nproc - 1) / nproc / bus_bytes_per_s


def allreduce_bandwidth(nproc: int, device: str = "cpu", size_bytes: int = 4 << 20) -> float | None:
    """The measured all-reduce bus bandwidth (hardware.probe), None when it cannot be measured."""
    from tensorpilot.hardware.probe import allreduce_bus_bandwidth

    try:
        return allreduce_bus_bandwidth(nproc, size_bytes, "cuda" if device.startswith("cuda") else "cpu")
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired):
        return None
