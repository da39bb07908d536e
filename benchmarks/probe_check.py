"""Does `tensorpilot hw --probe` measure honestly? Its fp32 and bf16 matmul ceilings against an
independent, plainly written `torch.matmul` timing, interleaved in the same run.

Goal (hardware issue): within 10% of each other on this CPU.

    python benchmarks/probe_check.py [--rounds 7] [--out benchmarks/results/probe_check.json]

The independent side shares no code with the probe: fresh tensors from torch.rand, no input
rotation, `torch.matmul` (not torch.mm with out=), a fixed 20-iteration loop per sample, best of
the round's samples' median. Both sides use the same size (the probe's largest CPU size, 2048).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchutil import LoadMeter
from tensorpilot.hardware import probe


def independent(dtype: torch.dtype, n: int, iters: int = 20, samples: int = 5) -> float:
    a = torch.rand(n, n).to(dtype) - 0.5
    b = torch.rand(n, n).to(dtype) - 0.5
    for _ in range(3):
        torch.matmul(a, b)
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b)
        times.append((time.perf_counter() - t0) / iters)
    return 2 * n**3 / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--out", default="benchmarks/results/probe_check.json")
    args = ap.parse_args()
    rows = []
    for dtype_name, tdtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        probe_vals, indep_vals, ratios, foreign = [], [], [], []
        for r in range(args.rounds):      # interleaved, order alternating: drift hits both sides
            for side in (("probe", "indep") if r % 2 == 0 else ("indep", "probe")):
                with LoadMeter() as m:
                    if side == "probe":
                        probe_vals.append(probe.matmul_flops("cpu", dtype_name, args.n))
                    else:
                        indep_vals.append(independent(tdtype, args.n))
                foreign.append(m.result.foreign)
            ratios.append(probe_vals[-1] / indep_vals[-1])   # adjacent pair, same load
        p, i, ratio = statistics.median(probe_vals), statistics.median(indep_vals), statistics.median(ratios)
        rows.append({"dtype": dtype_name, "n": args.n, "probe_flops": p, "independent_flops": i,
                     "ratio": ratio, "within_10pct": abs(ratio - 1) <= 0.10,
                     "max_foreign_load": max((f for f in foreign if f is not None), default=None),
                     "probe_rounds": probe_vals, "independent_rounds": indep_vals, "ratios": ratios})
    print("| dtype | n | probe GFLOP/s | independent GFLOP/s | probe / independent (median of pairs) "
          "| within 10% | foreign load max |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {r['n']} | {r['probe_flops'] / 1e9:,.1f} | {r['independent_flops'] / 1e9:,.1f} "
              f"| {r['ratio']:.3f} | {'yes' if r['within_10pct'] else 'NO'} | {r['max_foreign_load'] or 0:.0%} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
