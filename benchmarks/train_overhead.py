"""What tensorpilot's engine costs, and what its defaults buy — four training arms side by side in
one process on the same gpt config and the same data (the foundation issue's benchmark).

Arms (all on the built-in gpt, the same stdlib byte corpus, the same batch):
  tp        tensorpilot Trainer, precision=bf16, compile=on (explicit)
  hand      a minimal hand-written loop with the same techniques: bf16 autocast, torch.compile
            per block (PyTorch's regional-compilation recipe), the gpt's blocked CPU attention
            (``FastAttention("blocked")`` around the forward), AdamW (same implementation, decay groups,
            schedule), gradient clipping
  tp-auto   tensorpilot Trainer with its defaults: precision=auto, compile=auto
  tutorial  the plain fp32 eager loop of the popular tutorials (AdamW, zero_grad/backward/step)

Measured rounds alternate the order of arms so drifting machine load hits them alike; every step
is timed with a foreign-load meter (share of the machine other processes used meanwhile).

Reported:
  1. engine overhead    median over rounds of step(tp) / step(hand)          goal <= 1.03
  2. defaults vs tutorial  median of step(tutorial) / step(tp-auto)  (throughput ratio) and the
     MFU of tp-auto against the bf16 matmul ceiling measured in this same run.
     Reference to beat (the issue): a hand bf16+compile loop reaches ~2.5x and ~55% on a 6-layer,
     384-wide byte GPT (our "small" size).

    python benchmarks/train_overhead.py                      # small gpt, batch 16: ~4 min on 2 cores
    python benchmarks/train_overhead.py --size tiny --batch-size 32 --rounds 6   # ~1.5 min
    python benchmarks/train_overhead.py --model nanogpt --batch-size 8 --rounds 6  # a user's model:
                               # tensorpilot vs the hand loop, same precision, eager, SDPA as called
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.nn import functional as F

from benchutil import LoadMeter, machine, median, quiet_trainer

QUIET = 0.15          # a step is "quiet" when other processes used < 15% of the machine meanwhile


class HandLoop:
    """The loop a careful engineer writes by hand. Same model class and data as tensorpilot (the
    comparison is about the engine, not the model), nothing else borrowed."""

    def __init__(self, workload, batch: int, *, bf16: bool, compiled: bool, steps: int,
                 lr=3e-3, warmup=50, min_ratio=0.1, clip: float | None = 1.0, tutorial=False):
        self.model = workload.model
        # the tutorials' get_batch: random windows of the same corpus tensor tensorpilot samples
        ds = workload.train_data
        self.corpus, self.seq_len, self.batch = ds.data, ds.seq_len, batch
        params = list(self.model.parameters())
        if tutorial:     # the tutorials: AdamW over everything, default implementation, no schedule
            self.opt = torch.optim.AdamW(params, lr=lr)
            self.sched = None
        else:
            groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                      {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
            self.opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=True)
            cosine = lambda s: (s + 1) / warmup if s < warmup else min_ratio + (1 - min_ratio) * 0.5 * (
                1 + math.cos(math.pi * min(1.0, (s - warmup) / max(1, steps - warmup))))
            self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, cosine)
        self.fwd = self.model
        self.attention = contextlib.nullcontext()
        if compiled:     # the same choices tensorpilot makes on a CPU, written out by hand
            from tensorpilot.attention import FastAttention

            self.attention = FastAttention("blocked")      # blocked causal attention for SDPA calls
            for block in self.model.blocks:
                block.compile()
        self.bf16, self.clip = bf16, clip

    def step(self) -> float:
        starts = torch.randint(self.corpus.numel() - self.seq_len - 1, (self.batch,))
        w = torch.stack([self.corpus[i:i + self.seq_len + 1] for i in starts.tolist()]).long()
        x, y = w[:, :-1], w[:, 1:]                                          # (B, T), (B, T)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16), self.attention:
            logits = self.fwd(x)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.sched:
            self.sched.step()
        return loss.item()


class ArmTimer:
    """``timed(name)`` runs one step of arm ``name`` under a foreign-load meter and keeps
    (seconds, foreign load) in ``times[name]``."""

    def __init__(self, arms: dict):
        self.arms = arms
        self.times: dict[str, list[tuple[float, float | None]]] = {k: [] for k in arms}

    def __call__(self, name: str) -> float:
        with LoadMeter() as m:
            self.arms[name]()
        self.times[name].append((m.result.seconds, m.result.foreign))
        return m.result.seconds


class UserHandLoop:
    """The hand loop on a user's model (benchmarks/user_models.py): ``precision`` as asked, eager,
    SDPA as the model calls it, fused AdamW with the same groups and schedule, clipping."""

    def __init__(self, name: str, batch: int, precision: str, steps: int, seed: int = 0):
        import user_models

        torch.manual_seed(seed)
        self.model = user_models.build(name, 256)
        self.data, _ = user_models.datasets(name, seq_len=256, n_train=batch * 10_000, n_val=8)
        self.batch, self.bf16, self.i = batch, precision == "bf16", 0
        params = list(self.model.parameters())
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), fused=True)
        warmup, min_ratio = 50, 0.1
        cosine = lambda s: (s + 1) / warmup if s < warmup else min_ratio + (1 - min_ratio) * 0.5 * (
            1 + math.cos(math.pi * min(1.0, (s - warmup) / max(1, steps - warmup))))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, cosine)

    def step(self) -> float:
        import user_models

        b = [self.data[j] for j in range(self.i, self.i + self.batch)]
        self.i += self.batch
        x, y = torch.utils.data.default_collate(b)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss = user_models.loss_fn(self.model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        return loss.item()


def user_model_overhead(args) -> int:
    """tensorpilot and a hand loop with the same technique on a model tensorpilot did not write:
    alternating steps in one process, median ratio over rounds."""
    import user_models
    from rich.console import Console

    from tensorpilot import RunConfig, Trainer
    from tensorpilot.workloads.base import Workload

    precision = args.precision
    if precision == "auto":
        from tensorpilot.hardware.probe import quick_ceiling

        precision = "bf16" if quick_ceiling("cpu", "bf16")[0] > 1.1 * quick_ceiling("cpu", "fp32")[0] else "fp32"
    hand = UserHandLoop(args.model, args.batch_size, precision, args.steps)
    torch.manual_seed(0)
    model = user_models.build(args.model, 256)
    train, _ = user_models.datasets(args.model, seq_len=256, n_train=args.batch_size * 10_000, n_val=8)
    cfg = RunConfig()
    cfg.data.batch_size, cfg.engine.precision, cfg.engine.compile = args.batch_size, precision, "off"
    cfg.engine.attention = "sdpa"                          # the hand loop's kernels
    cfg.optim.lr, cfg.optim.betas = 1e-3, [0.9, 0.95]
    cfg.train.steps, cfg.train.eval_interval = args.steps, 10**9
    cfg.checkpoint.enabled, cfg.logging.tensorboard, cfg.logging.progress = False, False, "off"
    cfg.run_dir = tempfile.mkdtemp(prefix="tp-overhead-user-")
    tp = Trainer(cfg, Workload(model=model, train_data=train, loss_fn=user_models.loss_fn,
                               tokens_per_sample=user_models.tokens_per_sample(args.model, 256)),
                 console=Console(quiet=True))
    tp.setup()
    arms = {"tp": tp.train_step, "hand": hand.step}
    timed = ArmTimer(arms)
    times = timed.times

    for name in arms:
        for _ in range(3):
            timed(name)
    for k in times:
        times[k].clear()
    ratios, quiet = [], []
    for r in range(args.rounds):
        order = ("tp", "hand", "hand", "tp") if r % 2 == 0 else ("hand", "tp", "tp", "hand")
        s = dict.fromkeys(arms, 0.0)
        for name in order:
            s[name] += timed(name)
        ratios.append(s["tp"] / s["hand"])
        quiet.append(all(f is not None and f < QUIET for k in arms for _, f in times[k][-2:]))
        print(f"round {r + 1}: tp {s['tp'] / 2:.3f}s hand {s['hand'] / 2:.3f}s tp/hand {ratios[-1]:.3f}"
              + ("" if quiet[-1] else " (not quiet)"), flush=True)
    q = [o for o, ok in zip(ratios, quiet) if ok]
    res = {"benchmark": "train_overhead", "model": args.model, "precision": precision,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": "python " + " ".join(sys.argv), "machine": machine(), "batch_size": args.batch_size,
           "overhead_ratio_tp_over_hand": median(ratios),
           "overhead_ratio_quiet_rounds": median(q) if q else None, "quiet_rounds": sum(quiet),
           "median_step_s": {k: median([t for t, _ in v]) for k, v in times.items()}}
    out = Path(args.out.replace(".json", f"_{args.model}.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"\n{args.model}, {precision} eager, batch {args.batch_size}: engine overhead tp/hand "
          f"{res['overhead_ratio_tp_over_hand']:.3f} (goal <= 1.03; {sum(quiet)}/{args.rounds} quiet rounds"
          + (f", {res['overhead_ratio_quiet_rounds']:.3f} over them" if q else "") + f"); wrote {out}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt", help="gpt (the four arms below) or a model of "
                   "benchmarks/user_models.py (nanogpt, hf-gpt2, hf-llama, timm-resnet): tp vs hand only")
    p.add_argument("--precision", default="auto", help="user models: fp32, bf16, or auto (the faster "
                   "by this machine's measured matmul ceilings, as tensorpilot chooses)")
    p.add_argument("--size", default="small")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=500,
                   help="planned run length the arms are configured for (compile=auto decides on it)")
    p.add_argument("--out", default="benchmarks/results/train_overhead.json")
    args = p.parse_args(argv)
    if args.model != "gpt":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import user_models

        user_models._torchvision_importable()
        return user_model_overhead(args)
    torch.manual_seed(0)
    from tensorpilot.hardware.probe import matmul_flops
    from tensorpilot.workloads import registry
    from tensorpilot.config import RunConfig

    tmp = tempfile.mkdtemp(prefix="tp-overhead-")
    t_start = time.perf_counter()

    def fresh_workload():
        cfg = RunConfig()
        cfg.model.size, cfg.data.batch_size = args.size, args.batch_size
        return registry.build(cfg.model, cfg.data, 0)

    print(f"building arms: gpt {args.size}, batch {args.batch_size}", flush=True)
    tp = quiet_trainer(f"{tmp}/tp", size=args.size, batch=args.batch_size, precision="bf16", compile="on",
                       steps=args.steps)
    auto = quiet_trainer(f"{tmp}/auto", size=args.size, batch=args.batch_size, precision="auto",
                         compile="auto", steps=args.steps)
    hand = HandLoop(fresh_workload(), args.batch_size, bf16=True, compiled=True, steps=args.steps)
    tutorial = HandLoop(fresh_workload(), args.batch_size, bf16=False, compiled=False, steps=args.steps,
                        clip=None, tutorial=True)
    arms = {"tp": tp.train_step, "hand": hand.step, "tp-auto": None, "tutorial": tutorial.step}

    def auto_step():
        # the fit loop's steady-state path: time the step, let compile=auto decide after it
        t0 = time.perf_counter()
        auto.train_step()
        auto.step += 1
        if auto.step > 1:
            auto._maybe_compile(time.perf_counter() - t0)
    arms["tp-auto"] = auto_step

    timed = ArmTimer(arms)
    times = timed.times

    # warm-up: compilation of tp/hand, compile=auto's eager step + decision + compilation
    t_warm = time.perf_counter()
    for name in ("tp", "hand", "tutorial"):
        for _ in range(3):
            timed(name)
    for _ in range(5):
        timed("tp-auto")
    for k in times:
        times[k].clear()
    print(f"warm-up {time.perf_counter() - t_warm:.0f} s; tp-auto chose {auto.plan.precision}, "
          f"compiled={auto.plan.compiled} ({auto.plan.reason('compile')})", flush=True)

    ceil_bf16, ceil_fp32, overhead, speedup, quiet = [], [], [], [], []
    for r in range(args.rounds):
        order = ("tp", "hand", "hand", "tp") if r % 2 == 0 else ("hand", "tp", "tp", "hand")
        s = dict.fromkeys(arms, 0.0)
        for name in order:
            s[name] += timed(name)
        for name in (("tp-auto", "tutorial") if r % 2 == 0 else ("tutorial", "tp-auto")):
            s[name] += timed(name)
        ceil_bf16.append(matmul_flops("cpu", "bf16", 2048))
        if r % 2 == 0:
            ceil_fp32.append(matmul_flops("cpu", "fp32", 2048))
        overhead.append(s["tp"] / s["hand"])
        speedup.append(s["tutorial"] / s["tp-auto"])
        recent = [f for k in arms for _, f in times[k][-(2 if k in ("tp", "hand") else 1):]]
        quiet.append(all(f is not None and f < QUIET for f in recent))
        print(f"round {r + 1}: tp {s['tp'] / 2:.3f}s hand {s['hand'] / 2:.3f}s tp-auto {s['tp-auto']:.3f}s "
              f"tutorial {s['tutorial']:.3f}s | tp/hand {overhead[-1]:.3f} tutorial/tp-auto {speedup[-1]:.2f}"
              f" | bf16 ceiling {ceil_bf16[-1] / 1e9:.0f} GFLOP/s | foreign max "
              f"{max((f or 0) for f in recent):.0%}" + ("" if quiet[-1] else " (not quiet)"), flush=True)

    step_s = {k: median([t for t, _ in v]) for k, v in times.items()}
    flops = auto.flops_per_step
    bf16_ceiling = median(ceil_bf16)
    quiet_overhead = [o for o, q in zip(overhead, quiet) if q]
    res = {
        "benchmark": "train_overhead", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(), "size": args.size, "batch_size": args.batch_size, "rounds": args.rounds,
        "tp_auto_choice": {"precision": auto.plan.precision, "compiled": auto.plan.compiled,
                           "reason": auto.plan.reason("compile"), "execution_plan": auto.plan.to_dict()},
        "median_step_s": step_s,
        "overhead_ratio_tp_over_hand": median(overhead),
        "overhead_ratio_quiet_rounds": median(quiet_overhead) if quiet_overhead else None,
        "quiet_rounds": sum(quiet),
        "speedup_tp_auto_over_tutorial": median(speedup),
        "model_flops_per_step": flops,
        "tp_auto_flops_per_s": flops / step_s["tp-auto"],
        "hand_flops_per_s": flops / step_s["hand"],
        "bf16_ceiling_flops_per_s": bf16_ceiling, "fp32_ceiling_flops_per_s": median(ceil_fp32),
        "tp_auto_mfu_vs_bf16_ceiling": flops / step_s["tp-auto"] / bf16_ceiling,
        "hand_mfu_vs_bf16_ceiling": flops / step_s["hand"] / bf16_ceiling,
        "step_s": times, "wall_s": time.perf_counter() - t_start,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print()
    print(f"| arm | median step | tokens/s |\n|---|---|---|")
    tok = args.batch_size * auto.workload.tokens_per_sample
    for k, v in step_s.items():
        print(f"| {k} | {v * 1e3:.0f} ms | {tok / v:,.0f} |")
    print(f"\nengine overhead tp/hand: {res['overhead_ratio_tp_over_hand']:.3f} (goal <= 1.03; "
          f"{res['quiet_rounds']}/{args.rounds} quiet rounds"
          + (f", {res['overhead_ratio_quiet_rounds']:.3f} over them" if quiet_overhead else "") + ")")
    print(f"defaults vs fp32 eager tutorial: {res['speedup_tp_auto_over_tutorial']:.2f}x throughput; "
          f"tp-auto MFU {res['tp_auto_mfu_vs_bf16_ceiling']:.0%} of the measured bf16 matmul ceiling "
          f"({bf16_ceiling / 1e9:.0f} GFLOP/s), hand loop {res['hand_mfu_vs_bf16_ceiling']:.0%}")
    print(f"wrote {out} ({res['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
