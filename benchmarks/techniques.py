"""Each training technique alone and together, on the gpt and cnn workloads (issue 5, benchmark 2).

For each workload, configurations of tensorpilot's own Trainer (same model, data and global
batch) are timed step by step in one process:

  baseline        fp32, eager, no recomputation, no accumulation, 0 DataLoader workers
  precision       bf16 autocast; fp16 autocast (emulated on CPUs: shows why 'auto' avoids it)
  compile         bf16 + torch.compile (first step = compilation, reported separately)
  checkpointing   bf16 + activation checkpointing: time lost vs activation memory saved
  accumulation    bf16, the same global batch as 4 micro-batches
  workers         bf16, 1 and 2 DataLoader worker processes
  all (auto)      what `--optimize auto` chose for this workload (a fresh tuning run)

Activation memory is measured, not estimated: the bytes of the tensors autograd saves for
backward in one forward pass (saved-tensor hooks; parameters excluded), which is what
checkpointing trades for recomputation. Steps of each configuration are interleaved with
baseline steps, and speed-ups are medians of those adjacent pairs (shared, noisy machine).

    pip install -e ".[bench]"
    python benchmarks/techniques.py                   # gpt small + cnn: ~6 min on 2 cores
    python benchmarks/techniques.py --quick           # gpt tiny + cnn, fewer steps
Writes benchmarks/results/techniques.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


@dataclass
class Config:
    name: str
    group: str
    precision: str = "fp32"
    compile: str = "off"
    ac: bool = False
    accum: int = 1
    workers: int = 0


CONFIGS = [
    Config("fp32 eager (baseline)", "baseline"),
    Config("bf16", "precision", "bf16"),
    Config("fp16 (emulated on CPU)", "precision", "fp16"),
    Config("bf16 + compile", "compile", "bf16", "on"),
    Config("bf16 + checkpointing", "checkpointing", "bf16", ac=True),
    Config("bf16 + 4 micro-batches", "accumulation", "bf16", accum=4),
    Config("bf16 + 1 worker", "workers", "bf16", workers=1),
    Config("bf16 + 2 workers", "workers", "bf16", workers=2),
]


def trainer_for(kind: str, size: str, batch: int, c: Config, run_dir: str):
    from benchutil import quiet_trainer

    return quiet_trainer(run_dir, model=kind, size=size, batch=batch // c.accum, accum=c.accum,
                         workers=c.workers, precision=c.precision, compile=c.compile, ac=c.ac)


def activation_bytes(t) -> int:
    """Bytes autograd saves for backward in one micro-batch forward (eager model, parameters
    excluded): the activation memory that checkpointing reduces."""
    from tensorpilot.training.autotune import ActivationBudget

    x, y = t._sample_batch()
    x, y = x[: t.cfg.data.batch_size], y[: t.cfg.data.batch_size]
    with ActivationBudget(2**62, t.model.parameters()) as b:
        with t.autocast():
            loss = t.workload.loss(t.model(x), y)
    del loss
    return b.saved_bytes


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_workload(kind: str, size: str, batch: int, steps: int, tmp: str) -> list[dict]:
    base = trainer_for(kind, size, batch, CONFIGS[0], f"{tmp}/{kind}-base")
    for _ in range(2):
        base.train_step()
    rows = []
    for c in CONFIGS:
        t = base if c.group == "baseline" else trainer_for(kind, size, batch, c, f"{tmp}/{kind}-{c.name}")
        first = timed(t.train_step)                       # warm-up / compilation
        timed(t.train_step)
        mine, pairs = [], []
        for i in range(steps):
            a = timed(t.train_step)
            b = timed(base.train_step)
            mine.append(a)
            pairs.append(b / a)
        eager_model_ok = c.compile == "off"
        row = {"workload": kind if kind != "gpt" else f"gpt {size}", "config": c.name, "group": c.group,
               "step_s": statistics.median(mine), "first_step_s": first,
               "speedup_vs_baseline": statistics.median(pairs),
               "activation_bytes": activation_bytes(t) if eager_model_ok else None}
        rows.append(row)
        print(f"{row['workload']:10s} {c.name:26s} step {row['step_s'] * 1e3:7.0f} ms  x{row['speedup_vs_baseline']:.2f}"
              + (f"  activations {row['activation_bytes'] / 2**20:7.1f} MiB" if row["activation_bytes"] else "")
              + (f"  first step {first:.1f} s" if c.compile == "on" else ""), flush=True)
        if t is not base:
            del t
    return rows


def autotuned(kind: str, size: str, batch: int, tmp: str) -> dict:
    """Run `--optimize auto` for a short job and report its choice and steady step time."""
    import subprocess

    run_dir = f"{tmp}/{kind}-auto"
    cmd = [sys.executable, "-m", "tensorpilot", "train", "--model", kind, "--batch-size", str(batch),
           "--steps", "400", "--optimize", "auto", "--run-dir", run_dir, "--train.eval_interval", "100000",
           "--no-checkpoint.enabled", "--logging.progress", "lines", "--no-logging.tensorboard",
           "--no-engine.tune_cache", "--tune-budget", "60"]
    if kind == "gpt":
        cmd += ["--size", size]
    # a 400-step job, stopped after the tuning and a few steady steps: SIGINT saves and exits 130
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_lines, t0 = [], time.perf_counter()
    import os
    import signal

    for line in proc.stdout:                    # type: ignore[union-attr]
        out_lines.append(line)
        if "autotune:" in line:
            t0 = time.perf_counter()
        if "autotune:" in "".join(out_lines) and time.perf_counter() - t0 > 20:
            os.kill(proc.pid, signal.SIGINT)
            break
    proc.wait(timeout=300)
    s = json.loads((Path(run_dir) / "summary.json").read_text())
    tuned = s.get("autotune") or {}
    return {"workload": kind if kind != "gpt" else f"gpt {size}", "config": f"all: --optimize auto "
            f"({(tuned.get('chosen') or {}).get('label')})", "group": "all",
            "step_s": batch / s["samples_per_s"] if s.get("samples_per_s") else None, "first_step_s": None,
            "tuning_s": tuned.get("tuning_s"), "activation_bytes": None}


def markdown(rows: list[dict]) -> str:
    lines = ["| workload | configuration | step | speed-up vs fp32 eager | activation memory |",
             "|---|---|---|---|---|"]
    for r in rows:
        sp = f"{r['speedup_vs_baseline']:.2f}x" if r.get("speedup_vs_baseline") else "-"
        act = f"{r['activation_bytes'] / 2**20:.1f} MiB" if r.get("activation_bytes") else "-"
        lines.append(f"| {r['workload']} | {r['config']} | {r['step_s'] * 1e3:.0f} ms | {sp} | {act} |"
                     if r.get("step_s") else f"| {r['workload']} | {r['config']} | - | - | - |")
    return "\n".join(lines)


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.5), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        rs = [r for r in rows if r["workload"] == w and r.get("speedup_vs_baseline")]
        ax.barh([r["config"] for r in rs], [r["speedup_vs_baseline"] for r in rs], color="#4c72b0")
        ax.axvline(1.0, color="grey", lw=0.8)
        ax.set_title(f"{w}: throughput vs fp32 eager")
        ax.set_xlabel("speed-up (median of paired steps)")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--steps", type=int, default=4, help="timed steps per configuration")
    p.add_argument("--out", default=str(HERE / "results" / "techniques"))
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    size = "tiny" if args.quick else "small"
    steps = 2 if args.quick else args.steps
    tmp = tempfile.mkdtemp(prefix="tp-techniques-")
    t_start = time.perf_counter()
    rows = bench_workload("gpt", size, 16, steps, tmp) + bench_workload("cnn", size, 64, steps, tmp)
    base_gpt = next(r for r in rows if r["workload"].startswith("gpt") and r["group"] == "baseline")
    base_cnn = next(r for r in rows if r["workload"] == "cnn" and r["group"] == "baseline")
    for kind, batch, base in (("gpt", 16, base_gpt), ("cnn", 64, base_cnn)):
        r = autotuned(kind, size, batch, tmp)
        r["speedup_vs_baseline"] = base["step_s"] / r["step_s"] if r["step_s"] else None
        rows.append(r)
        print(f"{r['workload']:10s} {r['config']}: step {r['step_s'] * 1e3:.0f} ms (vs baseline measured "
              "earlier in this run)", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    md = markdown(rows)
    res = {"benchmark": "techniques", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": "python benchmarks/techniques.py " + " ".join(argv or sys.argv[1:]),
           "rows": rows, "wall_s": time.perf_counter() - t_start}
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    out.with_suffix(".md").write_text(md + "\n")
    chart(rows, out.with_suffix(".png"))
    print("\n" + md)
    print(f"\nwrote {out}.json/.md/.png ({res['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
