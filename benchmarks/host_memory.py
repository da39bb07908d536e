"""glibc malloc's defaults against ``engine.retain_freed_host_memory`` (issue 5, session 4).

One training step of the built-in gpt (bf16 autocast, blocked CPU attention, fused AdamW, two
micro-batches) in child processes that alternate: ``default`` leaves glibc as it is, ``retained``
calls ``retain_freed_host_memory()`` first. Each child times ``--steps`` steps after three warm-up
steps and counts the minor page faults (first touches of fresh pages) they took. Nothing else
differs: same seed, same batches, same code.

    python benchmarks/host_memory.py                 # gpt small, 8 x 256 tokens x 2: ~2 min
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(mode: str, size: str, micro: int, steps: int) -> None:
    import torch
    from torch.nn import functional as F

    from tensorpilot.training import engine
    from tensorpilot.workloads.gpt import GPT, SIZES, GPTConfig

    applied = engine.retain_freed_host_memory() if mode == "retained" else None
    torch.manual_seed(0)
    cfg = GPTConfig(**SIZES[size])
    model = GPT(cfg)
    from tensorpilot.attention import FastAttention

    attention = FastAttention("blocked")          # the blocked CPU attention the trainer measures fastest
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randint(0, cfg.vocab_size, (2, micro, cfg.seq_len))
    y = torch.randint(0, cfg.vocab_size, (2, micro, cfg.seq_len))

    def step() -> None:
        for i in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16), attention:
                loss = F.cross_entropy(model(x[i]).flatten(0, 1).float(), y[i].flatten()) / 2
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    times = []
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / steps
    print("RESULT " + json.dumps({"mode": mode, "applied": applied, "step_ms": sorted(times)[len(times) // 2] * 1e3,
                                  "faults_per_step": faults,
                                  "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child(argv[1], argv[2], int(argv[3]), int(argv[4]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="pairs of child processes, order alternating")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from benchutil import machine, median

    runs: dict[str, list[dict]] = {"default": [], "retained": []}
    for r in range(args.rounds):
        for mode in (("default", "retained") if r % 2 == 0 else ("retained", "default")):
            out = subprocess.run([sys.executable, __file__, "--child", mode, args.size, str(args.micro_batch),
                                  str(args.steps)], capture_output=True, text=True, check=True)
            res = json.loads(next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))[7:])
            runs[mode].append(res)
            print(f"round {r + 1} {mode:9s} step {res['step_ms']:6.1f} ms  page faults/step "
                  f"{res['faults_per_step']:8.0f}  peak RSS {res['max_rss_mib']:.0f} MiB", flush=True)
    ms = {m: median([r["step_ms"] for r in v]) for m, v in runs.items()}
    faults = {m: median([r["faults_per_step"] for r in v]) for m, v in runs.items()}
    ratio = ms["default"] / ms["retained"]
    print(f"\nmedian step: default {ms['default']:.1f} ms, retained {ms['retained']:.1f} ms -> {ratio:.2f}x; "
          f"page faults per step {faults['default']:.0f} -> {faults['retained']:.0f}")
    out_path = HERE / "results" / "host_memory.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({
        "benchmark": "host_memory", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/host_memory.py " + " ".join(argv), "machine": machine(),
        "size": args.size, "micro_batch": args.micro_batch, "runs": runs, "median_step_ms": ms,
        "median_faults_per_step": faults, "default_over_retained": ratio}, indent=1))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
