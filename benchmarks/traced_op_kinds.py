"""The traffic and planned time of a traced step on a catalogued GPU, op by op kind: the figures
benchmarks/RESULTS.md sets beside a GPU profile (benchmarks/kernel_breakdown.py) of the same step.

    python benchmarks/traced_op_kinds.py resnet50 [--gpu h100-sxm] [--top 12]

``resnet50`` is a name of compiled_steps.MODELS (its factory, input and batch). Prints the step's
kernel count (non-view ops), then per (op, phase): count, GB moved (with the normalisations'
second pass, costs.second_pass_bytes) and planned ms; and what cuDNN's NCHW <-> NHWC transforms
around the 16-bit NCHW convolutions move (costs.nchw_transpose_bytes, included in the planned ms on
an NVIDIA part), at the catalog's bandwidth x MEMORY_BW_FRACTION.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> int:
    import torch

    from compiled_steps import MODELS
    from tensorpilot.hardware import catalog
    from tensorpilot.modelplan import planner, sources
    from tensorpilot.modelplan.costs import catalog_costs, nchw_transpose_bytes, second_pass_bytes
    from tensorpilot.observe.trace import VIEW
    from tensorpilot.plan import calibration as cal

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    factory, shape, dtype, batch = MODELS[args.model]
    acc = catalog.get(args.gpu)
    src = sources.load(f"user_models:{factory}")
    trace = planner.trace_source(src, batch_size=batch, precision="bf16", optimizer="adamw",
                                 input_shape=tuple(int(d) for d in shape.split(",")), input_dtype=getattr(torch, dtype),
                                 gpu_autocast=planner.autocasts_like_cuda(acc))
    costs = catalog_costs(acc)
    kinds: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    transposed = 0
    for op in trace.ops:
        if op.op_class == VIEW:
            continue
        row = kinds[(op.op, op.phase)]
        row[0] += 1
        row[1] += (op.bytes_read + op.bytes_written + second_pass_bytes(op)) / 1e9
        row[2] += costs.op_time_s(op) * 1e3
        transposed += nchw_transpose_bytes(op)[0]
    print(f"{args.model} on {acc.key}, batch {batch}: {sum(int(r[0]) for r in kinds.values())} kernels a step "
          f"(non-view ops), planned {sum(r[2] for r in kinds.values()):.2f} ms")
    print(f"{'op':46s} {'phase':9s} {'count':>5s} {'GB':>7s} {'ms':>7s}")
    for (name, phase), (n, gb, ms) in sorted(kinds.items(), key=lambda kv: -kv[1][2])[:args.top]:
        print(f"{name:46s} {phase:9s} {int(n):5d} {gb:7.2f} {ms:7.2f}")
    if transposed:
        bw = acc.mem_bw_gb_per_s * 1e9 * cal.MEMORY_BW_FRACTION
        print(f"cuDNN's NCHW <-> NHWC transforms around the 16-bit convolutions: {transposed / 1e9:.2f} GB, "
              f"{transposed / bw * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
