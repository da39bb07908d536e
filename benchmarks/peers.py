"""tensorpilot against the ways people train, on models tensorpilot did not write (issue 15).

Models (benchmarks/user_models.py, built without downloads): ``nanogpt`` (a tutorial-style GPT
written there), ``hf-gpt2`` and ``hf-llama`` (transformers, from config objects), ``timm-resnet``
(timm's resnet18), and ``gpt`` (tensorpilot's built-in GPT class, handed over as a plain module
like the others).

Arms, each in its own process, one after another, with an empty inductor cache (a compiling arm
pays what a first run pays):

  fp32         the plain fp32 eager loop of the tutorials
  bf16         the same loop plus the two lines: torch.autocast("cpu", torch.bfloat16)
  accelerate   Hugging Face Accelerate, mixed_precision="bf16"
  lightning    PyTorch Lightning, precision="bf16-mixed", the LightningModule torch.compile'd
               (its documented way; compiled being its best setting for long runs)
  tensorpilot  tensorpilot.train(model, dataset, loss_fn, overrides={"engine.optimize": "auto"})
  tp-fp32, tp-bf16  (optional) tensorpilot with the fp32 / bf16 loop's technique: no tuning,
               eager, SDPA as called -- the engine's own cost over a whole loop

Same model initialisation (seed), the same batches in the same order (one epoch of a map-style
dataset, in the seeded order tensorpilot's loader reads it; the peers iterate the same loader), AdamW (lr 1e-3, betas 0.9/0.95, weight
decay 0.1 on matrices), warm-up 10 steps then cosine, gradient clipping 1.0.

Reported per arm: ``loop_s`` = the whole loop, from model construction to the end of the last
step (tensorpilot: to the return of train(), its setup, tuning and one-batch evaluations
included); ``steady_s`` = median step time over the second half of the run; the validation loss of
the final weights, computed by the same fp32 eager function for every arm on the same batches;
the foreign load (share of the machine other processes used meanwhile).

    pip install -e ".[bench]"                 # lightning, accelerate, transformers, timm
    python benchmarks/peers.py --model nanogpt --steps 80
    python benchmarks/peers.py --model hf-gpt2,hf-llama,timm-resnet,gpt --steps 80,300
    python benchmarks/peers.py --device cuda --model nanogpt,hf-llama --steps 200   # GPU_SHAPES:
        # GPT-2-small-shaped models, every arm on the GPU (autocast, Accelerate and Lightning on cuda)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARMS = ("fp32", "bf16", "accelerate", "lightning", "tensorpilot")
PEERS = ("fp32", "bf16", "accelerate", "lightning")
LR, BETAS, WD, WARMUP, MIN_RATIO, CLIP = 1e-3, (0.9, 0.95), 0.1, 10, 0.1, 1.0
SEED = 1337            # model initialisation and data order (tensorpilot's train.seed default)
VAL_BATCHES = 8
# per model: (global batch, sequence length); sized so a step takes a fraction of a second here
SHAPES = {"nanogpt": (8, 128), "gpt": (8, 128), "hf-gpt2": (8, 256), "hf-llama": (8, 256),
          "timm-resnet": (32, None)}
# --device cuda: GPT-2-small-shaped language models (user_models.build(size="gpu")) at a batch
# that keeps an H100-class GPU busy (~8-20 TFLOP per step), so the loop is not host-bound
GPU_SHAPES = {"nanogpt": (16, 1024), "gpt": (16, 1024), "hf-gpt2": (16, 1024), "hf-llama": (16, 1024),
              "timm-resnet": (128, None)}
DEVICE = "cpu"          # set by --device; the child reads it from its command line


def shape(name: str) -> tuple[int, int | None]:
    return (GPU_SHAPES if DEVICE != "cpu" else SHAPES)[name]


def to_device(b):
    x, y = b
    return x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)


# ------------------------------------------------------------------------------ shared parts
def build_model(name: str, seq_len: int | None):
    if name == "gpt":
        from tensorpilot.plan.models import GPT_SIZES
        from tensorpilot.workloads.gpt import GPT, GPTConfig

        dims = {k: v for k, v in GPT_SIZES["small"].items() if k in ("n_layer", "n_head", "d_model")}
        if DEVICE != "cpu":
            dims = {"n_layer": 12, "n_head": 12, "d_model": 768}
        return GPT(GPTConfig(**dims, seq_len=seq_len, tie_head=False))
    import user_models

    return user_models.build(name, seq_len or 256, size="gpu" if DEVICE != "cpu" else "cpu")


def data(name: str, seq_len: int | None, steps: int, batch: int):
    import user_models

    return user_models.datasets("nanogpt" if name == "gpt" else name, seq_len=seq_len or 256,
                                n_train=steps * batch, n_val=VAL_BATCHES * batch,
                                image_size=112 if DEVICE != "cpu" else 64)


def loss_fn(out, y):
    import user_models

    return user_models.loss_fn(out, y)


def batches(ds, batch: int, steps: int, seed: int | None = None):
    """``steps`` batches of ``batch`` samples; ``seed``: the order tensorpilot's loader reads them
    in at that seed (a seeded permutation per epoch), so every arm sees the same batches in
    the same order; None: samples 0, 1, 2, ... (evaluation)."""
    import torch

    if seed is not None:
        from tensorpilot.training.loader import make_loader

        it = iter(make_loader(ds, batch, 0, 0, False, seed))
        for _ in range(steps):
            yield next(it)
        return
    for s in range(steps):
        yield torch.utils.data.default_collate([ds[i] for i in range(s * batch, (s + 1) * batch)])


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


def evaluate(model, val, batch: int) -> float:
    """fp32, eval mode, eager (compiled regions run their Python), the same batches for every arm."""
    import torch

    model.eval().to(DEVICE)                # Lightning's teardown moves the model back to the CPU
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        losses = [loss_fn(model(x), y).item() for x, y in map(to_device, batches(val, batch, VAL_BATCHES))]
    return sum(losses) / len(losses)


class Clock:
    """Per-step wall times of a loop (on a GPU, each tick waits for the step's kernels)."""

    def __init__(self):
        self.steps: list[float] = []
        self._t = time.perf_counter()

    def tick(self):
        if DEVICE != "cpu":
            import torch

            torch.cuda.synchronize()
        now = time.perf_counter()
        self.steps.append(now - self._t)
        self._t = now

    def steady(self) -> float:
        half = self.steps[len(self.steps) // 2:]
        return statistics.median(half) if half else float("nan")


# -------------------------------------------------------------------------------------- arms
def hand_loop(name, batch, seq, steps, bf16: bool):
    import torch

    t0 = time.perf_counter()
    model = build_model(name, seq).to(DEVICE)
    train, val = data(name, seq, steps, batch)
    opt = torch.optim.AdamW(param_groups(model), lr=LR, betas=BETAS)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps))
    clock = Clock()
    for x, y in map(to_device, batches(train, batch, steps, SEED)):
        with torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        clock.tick()
    return time.perf_counter() - t0, clock.steady(), evaluate(model, val, batch), {}


def arm_fp32(name, batch, seq, steps, run_dir):
    return hand_loop(name, batch, seq, steps, bf16=False)


def arm_bf16(name, batch, seq, steps, run_dir):
    return hand_loop(name, batch, seq, steps, bf16=True)


def arm_accelerate(name, batch, seq, steps, run_dir):
    import accelerate
    import torch
    from accelerate import Accelerator

    t0 = time.perf_counter()
    model = build_model(name, seq)
    train, val = data(name, seq, steps, batch)
    acc = Accelerator(mixed_precision="bf16", cpu=DEVICE == "cpu")
    opt = torch.optim.AdamW(param_groups(model), lr=LR, betas=BETAS, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps))
    model, opt, sched = acc.prepare(model, opt, sched)
    clock = Clock()
    for x, y in map(to_device, batches(train, batch, steps, SEED)):
        loss = loss_fn(model(x), y)
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        opt.zero_grad()
        clock.tick()
    loop = time.perf_counter() - t0
    return loop, clock.steady(), evaluate(acc.unwrap_model(model), val, batch), {"accelerate": accelerate.__version__}


def arm_lightning(name, batch, seq, steps, run_dir):
    import lightning as L
    import torch

    t0 = time.perf_counter()
    model = build_model(name, seq)
    train, val = data(name, seq, steps, batch)
    clock = Clock()

    class Lit(L.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def training_step(self, b, i):
            x, y = b
            return loss_fn(self.model(x), y)

        def on_train_batch_end(self, *args):
            clock.tick()

        def configure_optimizers(self):
            # not fused: Lightning refuses gradient clipping with a fused optimizer under AMP
            opt = torch.optim.AdamW(param_groups(self.model), lr=LR, betas=BETAS, foreach=True)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    class Batches(torch.utils.data.IterableDataset):
        def __iter__(self):
            return batches(train, batch, steps, SEED)

    lit = torch.compile(Lit(model))        # Lightning's documented way: compile the LightningModule
    trainer = L.Trainer(accelerator="cpu" if DEVICE == "cpu" else "gpu", devices=1, precision="bf16-mixed", max_steps=steps,
                        gradient_clip_val=CLIP, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, default_root_dir=run_dir)
    trainer.fit(lit, torch.utils.data.DataLoader(Batches(), batch_size=None))
    loop = time.perf_counter() - t0
    return loop, clock.steady(), evaluate(model, val, batch), {"lightning": L.__version__}


def arm_tensorpilot(name, batch, seq, steps, run_dir, fixed: str | None = None):
    """``fixed`` (arms tp-fp32, tp-bf16): no tuning, that precision, eager, SDPA as the model calls
    it -- the technique of the fp32 / bf16 hand loops, to measure what the engine itself costs."""
    import tensorpilot

    t0 = time.perf_counter()
    model = build_model(name, seq)
    train, val = data(name, seq, steps, batch)
    how = ({"engine.precision": fixed, "engine.compile": "off", "engine.attention": "sdpa"} if fixed
           else {"engine.optimize": "auto", "engine.tune_cache": False})
    s = tensorpilot.train(model, train, loss_fn, val_data=val, tokens_per_sample=seq, overrides={
        **how, "train.steps": steps, "data.batch_size": batch,
        "optim.lr": LR, "optim.betas": list(BETAS), "optim.weight_decay": WD, "optim.warmup_steps": WARMUP,
        "optim.min_lr_ratio": MIN_RATIO, "optim.grad_clip": CLIP, "checkpoint.enabled": False, "train.seed": SEED,
        "train.eval_interval": 10**6, "train.eval_batches": 1, "logging.progress": "off", "train.device": DEVICE,
        "logging.tensorboard": False, "run_dir": run_dir})
    loop = time.perf_counter() - t0
    steady = batch / s["samples_per_s"] if s.get("samples_per_s") else float("nan")
    tuned = s.get("autotune") or {}
    return loop, steady, evaluate(model, val, batch), {
        "chosen": (tuned.get("chosen") or {}).get("label"), "tuning_s": tuned.get("tuning_s"),
        "setup_s": s.get("setup_s"), "attention": s.get("attention"), "precision": s.get("precision"),
        "compile": s.get("compile_reason"), "mfu_vs_measured": s.get("mfu_vs_measured"),
        "measured_peak_flops_per_s": s.get("measured_peak_flops_per_s"),
        "model_flops_per_step": s.get("model_flops_per_step"), "mfu": s.get("mfu"),
        "predicted": s.get("predicted"), "peak_memory_bytes": s.get("peak_memory_bytes")}


# ---------------------------------------------------------------------------------- driver
def child(arm: str, name: str, steps: int, run_dir: str, seed: int) -> None:
    import logging

    import torch

    import user_models

    logging.getLogger("torchao").setLevel(logging.ERROR)
    user_models._torchvision_importable()        # lightning, transformers and timm import it
    global SEED
    SEED = seed
    torch.manual_seed(seed)
    batch, seq = shape(name)
    if arm in ("tp-fp32", "tp-bf16"):
        loop_s, steady_s, val, extra = arm_tensorpilot(name, batch, seq, steps, run_dir, fixed=arm[3:])
    else:
        loop_s, steady_s, val, extra = globals()[f"arm_{arm}"](name, batch, seq, steps, run_dir)
    print("RESULT " + json.dumps({"arm": arm, "loop_s": loop_s, "steady_s": steady_s, "val_loss": val, **extra}))


def busy_ticks() -> int:
    with open("/proc/stat") as fh:
        f = [int(v) for v in fh.readline().split()[1:9]]
    return f[0] + f[1] + f[2] + f[5] + f[6] + f[7]


def run_arm(arm: str, name: str, steps: int, seed: int, tmp: str) -> dict:
    hz, ncpu = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    b0, t0 = busy_ticks(), time.perf_counter()
    slug = f"{name}-{steps}-{arm}"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/{slug}-inductor-cache",
           "TENSORPILOT_CACHE": f"{tmp}/{slug}-tp-cache", "PYTHONWARNINGS": "ignore"}
    # the hardware probe's ceilings are per machine, not per run: share them with the arm
    from tensorpilot.hardware.probe import cache_dir

    Path(env["TENSORPILOT_CACHE"]).mkdir(parents=True)
    for f in cache_dir().glob("probe-*.json"):
        (Path(env["TENSORPILOT_CACHE"]) / f.name).write_bytes(f.read_bytes())
    proc = subprocess.run([sys.executable, __file__, "--child", arm, name, str(steps), f"{tmp}/{slug}", str(seed), DEVICE],
                          capture_output=True, text=True, cwd=HERE, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
        return {"arm": arm, "error": proc.stderr[-3000:]}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    other_s = (busy_ticks() - b0) / hz - own
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    r = json.loads(line[len("RESULT "):])
    r.update(wall_s=wall, foreign_load=max(0.0, min(1.0, other_s / (wall * ncpu))))
    return r


def report(name: str, steps: int, rows: list[dict]) -> dict:
    batch, seq = shape(name)
    unit = "tokens" if seq else "samples"
    n = batch * steps * (seq or 1)
    ok = {r["arm"]: r for r in rows if "error" not in r}
    for r in ok.values():
        r["rate"] = n / r["loop_s"]
        r["steady_rate"] = batch * (seq or 1) / r["steady_s"]
    print(f"\n{name}, {steps} steps x {batch}" + (f" x {seq} tokens" if seq else " images") + "\n")
    print(f"| arm | whole loop | {unit}/s whole loop | {unit}/s steady | val loss | foreign load |")
    print("|---|---|---|---|---|---|")
    for arm, r in ok.items():
        print(f"| {arm} | {r['loop_s']:.1f} s | {r['rate']:,.0f} | {r['steady_rate']:,.0f} | {r['val_loss']:.4f} | "
              f"{r['foreign_load']:.0%} |")
    for r in rows:
        if "error" in r:
            print(f"| {r['arm']} | failed: {r['error'].strip().splitlines()[-1][:120]} |")
    out = {"model": name, "steps": steps, "global_batch": batch, "seq_len": seq, "arms": rows}
    for same, hand in (("tp-fp32", "fp32"), ("tp-bf16", "bf16")):
        if same in ok and hand in ok:
            out[f"{same}_over_{hand}"] = ok[same]["rate"] / ok[hand]["rate"]
            print(f"\n{same} / {hand} (same technique), whole loop: {out[f'{same}_over_{hand}']:.3f}x; "
                  f"steady {ok[same]['steady_rate'] / ok[hand]['steady_rate']:.3f}x (goal >= 0.97)")
    tp = ok.get("tensorpilot")
    peers = [ok[a] for a in PEERS if a in ok]
    if tp and peers:
        best = max(peers, key=lambda r: r["rate"])
        out["tp_over_best_peer"] = tp["rate"] / best["rate"]
        out["best_peer"] = best["arm"]
        print(f"\ntensorpilot / best peer ({best['arm']}), whole loop: {out['tp_over_best_peer']:.2f}x; "
              f"steady state {tp['steady_rate'] / max(p['steady_rate'] for p in peers):.2f}x; chose "
              f"{tp.get('chosen')} ({tp.get('precision')}), attention: {tp.get('attention')}")
        if tp.get("mfu_vs_measured"):
            print(f"tensorpilot steady-state model FLOP/s: {tp['mfu_vs_measured']:.0%} of the measured "
                  f"{tp.get('precision')} matmul ceiling")
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    global DEVICE
    if argv and argv[0] == "--child":
        sys.path.insert(0, str(HERE))
        DEVICE = argv[6]
        child(argv[1], argv[2], int(argv[3]), argv[4], int(argv[5]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="nanogpt", help=f"comma-separated: {', '.join(SHAPES)}")
    p.add_argument("--steps", default="80", help="comma-separated run lengths, e.g. 80,300")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="cpu", help="cpu, or cuda: GPU-sized models (GPU_SHAPES), every arm on the GPU")
    p.add_argument("--out", default=str(HERE / "results" / "peers.json"))
    args = p.parse_args(argv)
    DEVICE = args.device
    sys.path.insert(0, str(HERE))
    from benchutil import machine
    from tensorpilot.hardware.probe import matmul_flops

    tmp = tempfile.mkdtemp(prefix="tp-peers-")
    ceilings = {dt: matmul_flops(DEVICE, dt, 2048 if DEVICE == "cpu" else 8192) for dt in ("bf16", "fp32")}
    runs = []
    for name in args.model.split(","):
        for steps in (int(s) for s in args.steps.split(",")):
            rows = []
            for arm in args.arms.split(","):
                r = run_arm(arm, name, steps, args.seed, tmp)
                rows.append(r)
                print(f"{name} {steps} {arm}: " + (f"FAILED\n{r['error']}" if "error" in r else
                      f"loop {r['loop_s']:.1f} s, steady {r['steady_s'] * 1e3:.0f} ms, val {r['val_loss']:.4f}"),
                      flush=True)
            runs.append(report(name, steps, rows))
            res = {"benchmark": "peers", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "command": "python benchmarks/peers.py " + " ".join(argv), "machine": machine(),
                   "ceilings_at_start_flops_per_s": ceilings, "runs": runs}
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"\nmatmul ceilings at the start: bf16 {ceilings['bf16'] / 1e9:.0f}, fp32 {ceilings['fp32'] / 1e9:.0f} GFLOP/s")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
