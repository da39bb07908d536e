"""`tensorpilot bench [SUITE...] [--quick] [--out DIR] [--json]`. Registered from
cli.COMPONENT_COMMANDS; argparse only at import, torch loads when the command runs."""

from __future__ import annotations

import argparse
import sys
import time

from tensorpilot import argtypes
from tensorpilot.errors import ConfigError

SUITE_NAMES = ("devices", "precision", "compile", "checkpointing", "batch", "scaling", "energy")  # = suites.SUITES (tested)
HELP = "Check the field's performance claims on this machine, suite by suite."
DESCRIPTION = ("Measure this machine against the claims articles make -- accelerators vs CPUs, low precision, "
               "compilation, activation checkpointing, batching, multi-process scaling, energy -- through "
               "tensorpilot's own trainer, probe, planner and energy meters. Each suite prints a table and a "
               "verdict per claim (holds / does not hold / not measurable here); --out gets bench.json (machine "
               "fingerprint, the command re-running each suite), a PNG per suite and a one-page report.md. "
               "See docs/bench.md.")


def register(sub) -> dict[str, argparse.ArgumentParser]:
    p = sub.add_parser("bench", help=HELP, description=DESCRIPTION)
    p.add_argument("suites", nargs="*", metavar="SUITE",
                   help=f"Suites to run, in order (default: all): {', '.join(SUITE_NAMES)}.")
    p.add_argument("--quick", action="store_true",
                   help="Small models, few steps, short sweeps: all suites in about two minutes on a 2-core CPU.")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="Directory for bench.json, report.md and the PNGs (default: runs/bench-<time>).")
    p.add_argument("--json", action="store_true", help="Print bench.json's content instead of the tables.")
    p.add_argument("--device", default="auto",
                   help="Device of the precision, compile, checkpointing, batch and energy suites (default: auto; "
                        "devices measures every local device, scaling the CPU or all GPUs).")
    p.add_argument("--precisions", metavar="A,B,...", default=None,
                   help="Precision ladder of the precision and energy suites, from fp32, tf32, bf16, fp16, fp8 "
                        "(default: every one the device supports; one it does not is an error).")
    p.add_argument("--threads", type=argtypes.integer(1, 4096), default=None, metavar="N",
                   help="Intra-op threads of this process's suites (default: torch's, one per core); 1 is steadier "
                        "on a machine other processes share.")
    p.set_defaults(func=cmd_bench)
    return {"bench": p}


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from tensorpilot.bench.run import BenchOptions, run
    from tensorpilot.config import check_device_name

    check_device_name(args.device)
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()] if args.precisions else None
    if args.precisions is not None and not precisions:
        raise ConfigError("--precisions needs at least one of fp32, tf32, bf16, fp16, fp8.")
    opts = BenchOptions(suites=list(dict.fromkeys(args.suites)) or list(SUITE_NAMES), quick=args.quick,
                        out=args.out or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}", device=args.device,
                        precisions=precisions)
    console = Console(highlight=False, quiet=args.json)
    import torch

    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        result = run(opts, console)
    finally:
        torch.set_num_threads(threads)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    for name, msg in result["errors"].items():
        print(f"tensorpilot bench: error: {name}: {msg}", file=sys.stderr)
    return 1 if result["errors"] else 0
