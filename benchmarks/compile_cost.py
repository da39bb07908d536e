"""The one-off cost of torch.compile and what it saves per step, for the numbers behind
``engine.COMPILE_WORTH_S`` (compile=auto compiles when the rest of the run, eager, would last
longer than that).

For each gpt size and precision, one fresh process with an empty inductor cache ("cold": what a
first run pays) and then one more process on the now-filled cache ("warm": what re-running the
same model pays) each build two tensorpilot Trainers on the same config, one compile=off and one
compile=on, then:

    compile_s   = first compiled step - median compiled step   (tracing + inductor + C++ build)
    saving_s    = median over rounds of (eager step - compiled step), steps run alternately
    break-even  = compile_s / saving_s steps, i.e. compile_s / (saving_s / eager_s) seconds of
                  eager training: the quantity COMPILE_WORTH_S stands for

    python benchmarks/compile_cost.py                 # tiny + small, bf16 + fp32: ~6-8 min on 2 cores
    python benchmarks/compile_cost.py --quick         # tiny, bf16, cold only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(size: str, precision: str, batch_size: int, rounds: int) -> dict:
    """Runs inside the child process (its inductor cache dir is set by the parent)."""
    from benchutil import LoadMeter, median, quiet_trainer

    def trainer(compile: str, run_dir: str):
        return quiet_trainer(run_dir, size=size, batch=batch_size, precision=precision, compile=compile)

    def step(t) -> tuple[float, float | None]:
        with LoadMeter() as m:
            t.train_step()
        return m.result.seconds, m.result.foreign

    tmp = tempfile.mkdtemp(prefix="tp-compile-cost-")
    eager, compiled = trainer("off", f"{tmp}/eager"), trainer("on", f"{tmp}/compiled")
    for _ in range(2):
        step(eager)
    first_s, first_foreign = step(compiled)               # compilation happens here
    for _ in range(2):
        step(compiled)
    times = {"eager": [], "compiled": []}
    foreign = []
    pairs = []
    for r in range(rounds):
        s = {"eager": 0.0, "compiled": 0.0}
        for name in (("eager", "compiled", "compiled", "eager") if r % 2 == 0
                     else ("compiled", "eager", "eager", "compiled")):
            dt, f = step(eager if name == "eager" else compiled)
            times[name].append(dt)
            foreign.append(f)
            s[name] += dt
        pairs.append((s["eager"] - s["compiled"]) / 2)
    eager_s, compiled_s = median(times["eager"]), median(times["compiled"])
    saving_s = median(pairs)
    compile_s = first_s - compiled_s
    return {"size": size, "precision": precision, "batch_size": batch_size, "rounds": rounds,
            "first_compiled_step_s": first_s, "first_step_foreign_load": first_foreign,
            "compile_s": compile_s, "eager_step_s": eager_s, "compiled_step_s": compiled_s,
            "saving_s_per_step": saving_s, "saving_fraction": saving_s / eager_s,
            "break_even_steps": compile_s / saving_s if saving_s > 0 else None,
            "break_even_eager_s": compile_s / (saving_s / eager_s) if saving_s > 0 else None,
            "max_foreign_load": max((f for f in foreign if f is not None), default=None),
            "step_s": times}


def run_child(size: str, precision: str, batch_size: int, rounds: int, cache: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", size, precision,
           str(batch_size), str(rounds)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=HERE)
    if out.returncode != 0:
        raise SystemExit(f"worker {size}/{precision} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = time.perf_counter() - t0
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        size, precision, batch, rounds = argv[1], argv[2], int(argv[3]), int(argv[4])
        print(json.dumps(worker(size, precision, batch, rounds)))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny gpt, bf16, cold cache only, 2 rounds")
    p.add_argument("--sizes", default="tiny,small")
    p.add_argument("--precisions", default="bf16,fp32")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results/compile_cost.json")
    args = p.parse_args(argv)
    sizes, precisions = args.sizes.split(","), args.precisions.split(",")
    if args.quick:
        sizes, precisions, args.rounds = ["tiny"], ["bf16"], 2
    t_start = time.perf_counter()
    rows = []
    for size in sizes:
        for precision in precisions:
            with tempfile.TemporaryDirectory(prefix="tp-inductor-") as cache:
                for state in (("cold",) if args.quick else ("cold", "warm")):
                    r = run_child(size, precision, args.batch_size, args.rounds, cache)
                    r["cache"] = state
                    rows.append(r)
                    print(f"{size:6s} {precision} {state}: compile {r['compile_s']:5.1f} s, eager "
                          f"{r['eager_step_s']:.3f} s, compiled {r['compiled_step_s']:.3f} s "
                          f"(saves {r['saving_fraction']:.0%}), break-even "
                          + (f"{r['break_even_steps']:.0f} steps = {r['break_even_eager_s']:.0f} s eager"
                             if r["break_even_steps"] else "never")
                          + f"; foreign load max {r['max_foreign_load'] or 0:.0%}", flush=True)
    sys.path.insert(0, str(HERE))
    from benchutil import machine

    results = {"benchmark": "compile_cost", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "command": "python " + " ".join([sys.argv[0], *argv]), "machine": machine(),
               "batch_size": args.batch_size, "rows": rows, "wall_s": time.perf_counter() - t_start}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print()
    print(report(results))
    print(f"\nwrote {out} ({results['wall_s']:.0f} s)")
    return 0


def report(r: dict) -> str:
    lines = [f"batch {r['batch_size']}, tensorpilot Trainer.train_step, compile=off vs on in one process",
             "",
             "| gpt | precision | inductor cache | compile cost | eager step | compiled step | saving/step | break-even | = eager time | foreign load max |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for x in r["rows"]:
        be = (f"{x['break_even_steps']:.0f} steps | {x['break_even_eager_s']:.0f} s"
              if x["break_even_steps"] else "never | never")
        lines.append(f"| {x['size']} | {x['precision']} | {x['cache']} | {x['compile_s']:.1f} s | "
                     f"{x['eager_step_s']:.3f} s | {x['compiled_step_s']:.3f} s | "
                     f"{x['saving_s_per_step'] * 1e3:.0f} ms ({x['saving_fraction']:.0%}) | {be} | "
                     f"{x['max_foreign_load'] or 0:.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
