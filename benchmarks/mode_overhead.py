"""What the attention routing mode (tensorpilot.attention.FastAttention, a TorchFunctionMode) costs
every torch call made while it is entered: the reason engine.attention=auto enters it on CPUs only
(tensorpilot.attention.router).

Small tensors, so the call's dispatch, not its arithmetic, is timed: three torch calls (an add, a
relu, a view) per iteration, without and with the mode, alternating over rounds; the median per
call of each is reported with their difference.

    python benchmarks/mode_overhead.py [--rounds 5] [--iters 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tensorpilot.attention import FastAttention

CALLS_PER_ITER = 3


def per_call_s(iters: int, mode: FastAttention | None) -> float:
    x = torch.ones(4)
    ctx = mode if mode is not None else torch.no_grad()
    with ctx:
        t0 = time.perf_counter()
        for _ in range(iters):
            y = torch.relu(x + 1)
            y.view(2, 2)
        return (time.perf_counter() - t0) / (iters * CALLS_PER_ITER)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20000)
    args = p.parse_args()
    plain, routed = [], []
    for _ in range(args.rounds):
        plain.append(per_call_s(args.iters, None))
        routed.append(per_call_s(args.iters, FastAttention("auto")))
    a, b = statistics.median(plain), statistics.median(routed)
    print(f"per torch call, median of {args.rounds} alternating rounds: without the mode {a * 1e6:.2f} us, "
          f"with it {b * 1e6:.2f} us: +{(b - a) * 1e6:.2f} us ({b / a:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
