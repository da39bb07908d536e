"""tensorpilot against the trainers people use, on the same workload (issue 5, benchmark 1).

Same model (the built-in gpt class), same data (the stdlib byte corpus, the same windows in the
same order: sample i of ByteWindows is a fixed window), same optimizer settings (AdamW, betas
0.9/0.95, weight decay 0.1 on matrices, warm-up then cosine, clip 1.0), same number of tokens:

  (a) tutorial     the plain fp32 eager loop of the popular tutorials
  (b) lightning    PyTorch Lightning Trainer, precision="bf16-mixed", torch.compile'd model
  (c) accelerate   Hugging Face Accelerate, mixed_precision="bf16"
  (d) tensorpilot  `tensorpilot train --optimize auto` (tuning included in its time)

Each arm runs in its own process, one after another, with an empty inductor cache (compiling
arms pay what a first run pays). Every arm then evaluates its final weights
with the same function, on the same 16 validation batches, in fp32 — so "validation loss after
equal tokens" compares the weights, not the evaluation code.

Reported per arm: `loop_s` (first step to last step, including compilation and tuning), whole
process `wall_s` (imports, model build, loop, evaluation), tokens/s = tokens / loop_s, the
validation loss, and the foreign load (share of the machine other processes used meanwhile).

    pip install -e ".[bench]"                       # lightning, accelerate (never package deps)
    python benchmarks/peers.py                      # gpt small, 32 x 256 tokens x 80 steps: ~12 min
    python benchmarks/peers.py --size tiny --steps 20 --arms tutorial,tensorpilot     # smoke test
    python benchmarks/peers.py --batch-size 16 --steps 320 --arms tensorpilot:16x1,tensorpilot:8x2
                                                    # rounding alone: same training, two groupings
    python benchmarks/peers.py --batch-size 16 --steps 320 --arms accelerate,tensorpilot --seed 1
                                                    # another initialisation
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARMS = ("tutorial", "lightning", "accelerate", "tensorpilot")
LR, WARMUP, MIN_RATIO, WD, CLIP, SEED = 2e-3, 10, 0.1, 0.1, 1.0, 1337
VAL_BATCHES = 16


# ------------------------------------------------------------------------- shared by all arms
def workload(size: str):
    from tensorpilot.config import RunConfig
    from tensorpilot.workloads import registry

    cfg = RunConfig()
    cfg.model.size = size
    return registry.build(cfg.model, cfg.data, SEED)


def batches(ds, batch: int, steps: int):
    """The same global batches for every arm: samples 0, 1, 2, ... of the dataset, in order
    (tensorpilot's own loader reads them in the same order)."""
    for s in range(steps):
        yield ds.__getitems__(list(range(s * batch, (s + 1) * batch)))


def param_groups(model):
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def lr_lambda(steps: int):
    def f(s):
        if s < WARMUP:
            return (s + 1) / WARMUP
        return MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - WARMUP) / max(1, steps - WARMUP))))
    return f


def evaluate(model, wl) -> float:
    """fp32, eval mode, the same 16 validation batches for every arm."""
    import torch

    model.eval()
    with torch.no_grad():
        losses = [wl.loss(model(x), y).item() for x, y in batches(wl.val_data, 16, VAL_BATCHES)]
    return sum(losses) / len(losses)


def loss_fn(logits, y):
    from torch.nn import functional as F

    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


# ------------------------------------------------------------------------------------- arms
def arm_tutorial(size, batch, steps, run_dir):
    import torch

    wl = workload(size)
    model = wl.model
    opt = torch.optim.AdamW(param_groups(model), lr=LR, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps))
    t0 = time.perf_counter()
    for x, y in batches(wl.train_data, batch, steps):
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
    return time.perf_counter() - t0, evaluate(model, wl), {}


def arm_lightning(size, batch, steps, run_dir):
    import lightning as L
    import torch

    wl = workload(size)

    class LitGPT(L.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def training_step(self, b, i):
            x, y = b
            return loss_fn(self.model(x), y)

        def configure_optimizers(self):
            # not fused: Lightning refuses gradient clipping with a fused optimizer under AMP
            opt = torch.optim.AdamW(param_groups(self.model), lr=LR, betas=(0.9, 0.95), foreach=True)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    class Batches(torch.utils.data.IterableDataset):
        def __iter__(self):
            return batches(wl.train_data, batch, steps)

    lit = LitGPT(wl.model)
    compiled = torch.compile(lit)           # Lightning's documented way: compile the LightningModule
    trainer = L.Trainer(accelerator="cpu", devices=1, precision="bf16-mixed", max_steps=steps,
                        gradient_clip_val=CLIP, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, default_root_dir=run_dir)
    t0 = time.perf_counter()
    trainer.fit(compiled, torch.utils.data.DataLoader(Batches(), batch_size=None))
    return time.perf_counter() - t0, evaluate(wl.model, wl), {"lightning": L.__version__}


def arm_accelerate(size, batch, steps, run_dir):
    import accelerate
    import torch
    from accelerate import Accelerator

    wl = workload(size)
    acc = Accelerator(mixed_precision="bf16", cpu=True)
    opt = torch.optim.AdamW(param_groups(wl.model), lr=LR, betas=(0.9, 0.95), fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps))
    model, opt, sched = acc.prepare(wl.model, opt, sched)
    t0 = time.perf_counter()
    for x, y in batches(wl.train_data, batch, steps):
        loss = loss_fn(model(x), y)
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        opt.zero_grad()
    loop = time.perf_counter() - t0
    return loop, evaluate(acc.unwrap_model(model), wl), {"accelerate": accelerate.__version__}


def arm_tensorpilot(size, batch, steps, run_dir, fixed: str | None = None):
    """The CLI as users run it; the loop time is the Trainer's fit (tuning, compilation and its
    own start/end evaluation included), the weights are read back from its final checkpoint.
    ``fixed`` ("MxA", arm name ``tensorpilot:MxA``): no tuning, bf16 eager, micro-batch M x A
    accumulation (A x M = the global batch): the same training as the other arms up to rounding,
    to measure how far rounding alone moves the validation loss."""
    from safetensors.torch import load_file

    from tensorpilot.training.checkpoint import find_checkpoint

    if fixed:
        micro, accum = (int(v) for v in fixed.split("x"))
        if micro * accum != batch:
            raise SystemExit(f"tensorpilot:{fixed}: {micro} x {accum} is not the global batch {batch}")
        how = ["--batch-size", str(micro), "--engine.grad_accum", str(accum), "--precision", "bf16", "--compile", "off"]
    else:
        how = ["--batch-size", str(batch), "--optimize", "auto"]
    cmd = [sys.executable, "-m", "tensorpilot", "train", "--size", size, *how,
           "--steps", str(steps), "--lr", str(LR), "--optim.warmup_steps", str(WARMUP),
           "--optim.min_lr_ratio", str(MIN_RATIO), "--seed", str(SEED), "--run-dir", run_dir,
           "--train.eval_interval", str(10**6), "--train.eval_batches", "1",
           "--checkpoint.interval", str(10**6), "--logging.progress", "lines", "--no-logging.tensorboard",
           "--no-engine.tune_cache"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"tensorpilot arm failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    s = json.loads((Path(run_dir) / "summary.json").read_text())
    wl = workload(size)
    ckpt = find_checkpoint(run_dir)
    state = load_file(str(next(ckpt.glob("*.safetensors"))))
    wl.model.load_state_dict(state, strict=False)
    tuned = s.get("autotune") or {}
    return s["train_s"], evaluate(wl.model, wl), {
        "chosen": (tuned.get("chosen") or {}).get("label"), "tuning_s": tuned.get("tuning_s"),
        "mfu_vs_measured": s.get("mfu_vs_measured"), "measured_peak_flops_per_s": s.get("measured_peak_flops_per_s"),
        "model_flops_per_step": s.get("model_flops_per_step"), "stdout_tail": out.stdout[-1500:]}


# ---------------------------------------------------------------------------------- driver
def child(arm: str, size: str, batch: int, steps: int, run_dir: str, seed: int) -> None:
    import torch

    global SEED
    SEED = seed                       # model initialisation (and the tensorpilot arm's --seed)
    torch.manual_seed(SEED)
    name, _, fixed = arm.partition(":")
    loop_s, val, extra = globals()[f"arm_{name}"](size, batch, steps, run_dir, *([fixed] if fixed else []))
    print("RESULT " + json.dumps({"arm": arm, "loop_s": loop_s, "val_loss": val, **extra}))


def busy_ticks() -> int:
    with open("/proc/stat") as fh:
        f = [int(v) for v in fh.readline().split()[1:9]]
    return f[0] + f[1] + f[2] + f[5] + f[6] + f[7]


def run_arm(arm: str, args, tmp: str) -> dict:
    hz, ncpu = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    b0, t0 = busy_ticks(), time.perf_counter()
    # an empty inductor cache per arm: compiling arms pay what a first run pays, and no arm
    # reuses kernels another arm (or an earlier benchmark) compiled
    slug = arm.replace(":", "-")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/{slug}-inductor-cache"}
    proc = subprocess.run([sys.executable, __file__, "--child", arm, args.size, str(args.batch_size),
                           str(args.steps), f"{tmp}/{slug}", str(args.seed)], capture_output=True, text=True,
                          cwd=HERE, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
        return {"arm": arm, "error": proc.stderr[-3000:]}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (after.ru_utime + after.ru_stime) - (before_children.ru_utime + before_children.ru_stime)
    other_s = (busy_ticks() - b0) / hz - own
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    r = json.loads(line[len("RESULT "):])
    r.update(wall_s=wall, foreign_load=max(0.0, min(1.0, other_s / (wall * ncpu))))
    return r


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child(argv[1], argv[2], int(argv[3]), int(argv[4]), argv[5], int(argv[6]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (sequences per step)")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seed", type=int, default=SEED, help="model initialisation seed, the same for every arm")
    p.add_argument("--out", default=str(HERE / "results" / "peers.json"))
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from benchutil import machine
    from tensorpilot.hardware.probe import matmul_flops

    tmp = tempfile.mkdtemp(prefix="tp-peers-")
    ceiling_before = matmul_flops("cpu", "bf16", 2048)
    rows = []
    for arm in args.arms.split(","):
        r = run_arm(arm, args, tmp)
        rows.append(r)
        if "error" in r:
            print(f"{arm}: FAILED\n{r['error']}", flush=True)
            continue
        print(f"{arm:12s} loop {r['loop_s']:7.1f} s  wall {r['wall_s']:7.1f} s  val loss {r['val_loss']:.4f}  "
              f"foreign load {r['foreign_load']:.0%}", flush=True)
    ceiling_after = matmul_flops("cpu", "bf16", 2048)
    tokens = args.batch_size * args.steps * workload(args.size).tokens_per_sample
    ok = {r["arm"]: r for r in rows if "error" not in r}
    for r in ok.values():
        r["tokens_per_s"] = tokens / r["loop_s"]
    res = {"benchmark": "peers", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": "python benchmarks/peers.py " + " ".join(argv), "machine": machine(),
           "size": args.size, "seed": args.seed, "global_batch": args.batch_size, "steps": args.steps, "tokens": tokens,
           "bf16_ceiling_flops_per_s": [ceiling_before, ceiling_after], "arms": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))

    print(f"\n{args.size} gpt, {tokens:,} tokens ({args.steps} steps x {args.batch_size} x "
          f"{tokens // args.steps // args.batch_size}); bf16 ceiling {ceiling_before / 1e9:.0f} / "
          f"{ceiling_after / 1e9:.0f} GFLOP/s before / after\n")
    print("| arm | loop time | tokens/s | vs tutorial | wall | val loss | foreign load |")
    print("|---|---|---|---|---|---|---|")
    base = ok.get("tutorial")
    for arm, r in ok.items():
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        print(f"| {arm} | {r['loop_s']:.1f} s | {r['tokens_per_s']:,.0f} | {ratio} | {r['wall_s']:.1f} s | "
              f"{r['val_loss']:.4f} | {r['foreign_load']:.0%} |")
    tp = ok.get("tensorpilot")
    peers = [ok[a] for a in ("lightning", "accelerate") if a in ok]
    if tp and peers:
        best = max(peers, key=lambda r: r["tokens_per_s"])
        print(f"\ntensorpilot / best peer ({best['arm']}): {tp['tokens_per_s'] / best['tokens_per_s']:.2f}x "
              f"(goal >= 1.10); val loss {tp['val_loss']:.4f} vs {best['val_loss']:.4f}")
    if tp and base:
        print(f"tensorpilot / tutorial: {tp['tokens_per_s'] / base['tokens_per_s']:.2f}x (goal >= 3.0)")
    if tp and tp.get("mfu_vs_measured"):
        print(f"tensorpilot chose {tp['chosen']}; steady-state model FLOP/s = {tp['mfu_vs_measured']:.0%} of "
              f"its measured bf16 ceiling (goal >= 60%); tuning {tp['tuning_s']:.1f} s")
    if len(ok) > 1:
        vals = [r["val_loss"] for r in ok.values()]
        print(f"val loss over the arms: {min(vals):.4f} - {max(vals):.4f} (spread {max(vals) - min(vals):.4f})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
