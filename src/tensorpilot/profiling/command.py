"""`tensorpilot profile`: train's options (the same run) plus what a profile needs. Registered
from cli.COMPONENT_COMMANDS; argparse only at import, torch loads when the command runs."""

from __future__ import annotations

import argparse
import time

from tensorpilot import argtypes
from tensorpilot.errors import ConfigError

MAX_STEPS = 1000          # profiled steps hold every event in memory: a few suffice


def register(sub) -> dict[str, argparse.ArgumentParser]:
    from tensorpilot.profiling.run import DEFAULT_STEPS, DEFAULT_WARMUP
    from tensorpilot.trainargs import add_train_arguments

    p = sub.add_parser(
        "profile", help="Profile a few training steps and say where the time goes and which flag fixes it.",
        description="Run the training `tensorpilot train` would run (same options) for a few warm-up and "
        "measured steps under torch.profiler, and report the step's wall time split into data loading, host "
        "overhead, compute per op class, communication and idle; a roofline per op class against this "
        "device's ceilings and the planner's prediction; ranked findings, each with the train flag that "
        "addresses it. Writes profile.json, trace.json.gz (Chrome/Perfetto) and profile.png to --out. "
        "See docs/profile.md.")
    add_train_arguments(p)
    for action in p._actions:                   # --steps means measured steps here
        if action.dest == "set:train.steps":
            action.help = (f"Measured steps: this many timed without the profiler, then this many profiled "
                           f"(default: {DEFAULT_STEPS}, at most {MAX_STEPS}).")
    g = p.add_argument_group("profile options")
    g.add_argument("--warmup", type=argtypes.integer(0, 10_000), default=DEFAULT_WARMUP, metavar="N",
                   help=f"Steps run before measuring: allocator, attention timing, compilation (default: {DEFAULT_WARMUP}).")
    g.add_argument("--out", metavar="DIR", default=None,
                   help="Directory for profile.json, trace.json.gz and profile.png (default: runs/profile-<time>).")
    g.add_argument("--json", action="store_true", help="Print profile.json's content instead of the tables.")
    g.add_argument("--apply", action="store_true",
                   help="Measure again with the top finding's flag and print the step time before and after.")
    g.add_argument("--top-k", type=argtypes.integer(1, 10_000), default=10, metavar="K",
                   help="Modules to list (default: 10).")
    g.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)   # a torchrun worker: files only
    p.set_defaults(func=cmd_profile)
    return {"profile": p}


def cmd_profile(args: argparse.Namespace) -> int:
    from tensorpilot.profiling.run import DEFAULT_STEPS, ProfileOptions
    from tensorpilot.trainargs import build_config

    cfg = build_config(args)                    # bad settings: one sentence, before anything heavy
    if args.print_config:
        from tensorpilot.config import to_toml

        print(to_toml(cfg), end="")
        return 0
    steps = cfg.train.steps if "set:train.steps" in vars(args) else DEFAULT_STEPS
    if steps > MAX_STEPS:
        raise ConfigError(f"--steps for profile must be at most {MAX_STEPS:,}, got {steps:,}.")
    opts = ProfileOptions(steps=steps, warmup=args.warmup, top_k=args.top_k, apply=args.apply,
                          out=args.out or f"runs/profile-{time.strftime('%Y%m%d-%H%M%S')}")
    import json

    from rich.console import Console

    from tensorpilot.profiling.report import print_report
    from tensorpilot.files import finite
    from tensorpilot.profiling.run import profile

    quiet = args.json or args.worker
    console = Console(highlight=False, quiet=quiet)
    result = profile(cfg, None, opts, console)
    if result is None or args.worker:
        return 0
    if args.json:
        print(json.dumps(finite(result), indent=1))
    else:
        print_report(result, console)
    return 0
