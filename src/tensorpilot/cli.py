"""Command line: parse, call the public API, print. Errors a user can cause end in one sentence
on stderr and a non-zero exit (2 for usage errors, like argparse); bugs keep their traceback."""

from __future__ import annotations

import argparse
import importlib
import sys

from tensorpilot import argtypes
from tensorpilot.version import __version__
from tensorpilot.errors import ConfigError, TensorpilotError, exit_at_once
from tensorpilot.trainargs import add_train_arguments, build_config

MAX_GENERATE_TOKENS = 1_000_000      # one forward pass per byte: more would run for hours

# Subcommands that live with their component. Each module defines
# ``register(sub) -> dict[name, ArgumentParser]`` (argparse only; heavy imports stay inside the
# command functions so `tensorpilot --help` stays fast). One line per component.
COMPONENT_COMMANDS = (
    "tensorpilot.serve.command",
    "tensorpilot.launch.command",
    "tensorpilot.modelplan.command",
    "tensorpilot.profiling.command",
    "tensorpilot.bench.command",
)

def cmd_train(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    if args.print_config:
        from tensorpilot.config import to_toml

        print(to_toml(cfg), end="")
        return 0
    from tensorpilot.launch.torchrun import launch_train, wants_launch

    if wants_launch(cfg):                       # --nproc N / --nnodes: start the workers via torchrun
        return launch_train(cfg)
    from tensorpilot.training.trainer import Trainer

    Trainer(cfg).fit()
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from tensorpilot.api import generate

    text = generate(args.run, args.prompt, args.tokens, args.temperature, args.top_k or None,
                    args.seed, args.device)
    print(text)
    return 0


def cmd_hw(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from tensorpilot.hardware import report

    console = Console(highlight=False)
    if args.gpu is not None:
        entry = report.catalog_entry(args.gpu)
        print(json.dumps(entry, indent=1, default=list)) if args.json else report.print_entry(console, entry)
        return 0
    from tensorpilot.hardware import probe as pr

    devices = report.local_devices()
    result = None if args.refresh else pr.load_cached(devices)
    if args.probe and (result is None or not result.complete(devices)):
        log = (lambda *_: None) if args.json else (lambda m: console.print(m, highlight=False))
        log("measuring (matmul per dtype and size, memory copy, all-reduce) ...")
        sizes = {"sizes": [256, 512], "copy_bytes": 16 << 20, "allreduce_bytes": 4 << 20} if args.quick else {}
        result = pr.run_probe(devices, allreduce_nproc=args.allreduce_procs, log=log, **sizes)
    from tensorpilot.observe import energy

    described = [report.describe(d, result) for d in devices]
    for d in described:                         # how a run's energy is measured (or estimated) here
        d["energy"] = energy.choose(energy.probe(d["device"])).describe()
    if args.json:
        print(json.dumps({"devices": described, "allreduce": result.allreduce if result else None,
                          "measured_at": result.measured_at if result else None}, indent=1))
    else:
        report.print_devices(console, described, result)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorpilot",
        description="Plan, train, measure and serve deep-learning models at the speed of the hardware.")
    parser.add_argument("--version", action="version", version=f"tensorpilot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    tr = sub.add_parser("train", help="Train a model with the techniques that suit this hardware.",
                        description="Train a built-in workload (gpt on the Python standard library "
                        "by default) or your own model, applying mixed precision, compilation, "
                        "checkpointing and fast data loading for the detected hardware.")
    add_train_arguments(tr)
    tr.set_defaults(func=cmd_train)

    ge = sub.add_parser("generate", help="Sample text from a trained gpt run.",
                        description="Sample text from the newest checkpoint of a gpt training run.")
    ge.add_argument("--run", required=True, metavar="DIR", help="Run directory or checkpoint directory.")
    ge.add_argument("--prompt", default="", help="Text to continue (default: empty).")
    ge.add_argument("--tokens", type=argtypes.integer(1, MAX_GENERATE_TOKENS), default=200, metavar="N",
                    help=f"Bytes to generate, at most {MAX_GENERATE_TOKENS:,} (default: 200).")
    ge.add_argument("--temperature", type=argtypes.number(0, 1e6), default=0.8, metavar="X",
                    help="Sampling temperature; 0 is greedy (default: 0.8).")
    ge.add_argument("--top-k", type=argtypes.integer(0, 2**31 - 1), default=40, metavar="K",
                    help="Sample among the K likeliest bytes; 0 for all (default: 40).")
    ge.add_argument("--seed", type=argtypes.integer(0, 2**63 - 1), default=0, metavar="N",
                    help="Sampling seed (default: 0).")
    ge.add_argument("--device", default="auto", help="Device (default: auto).")
    ge.set_defaults(func=cmd_generate)
    hw = sub.add_parser("hw", help="Show this machine's accelerators, their peaks and measured ceilings.",
                        description="Detect the devices here and show, per dtype, the datasheet peak "
                        "(CPUs: an estimate), the measured matmul ceiling, %% of peak and the roofline "
                        "ridge point; or show a catalogued accelerator with --gpu.")
    hw.add_argument("--probe", action="store_true",
                    help="Measure the ceilings (matmul per dtype and size, memory bandwidth, host<->device, "
                         "all-reduce); results are cached per machine.")
    hw.add_argument("--refresh", action="store_true", help="Ignore the cache and measure again (with --probe).")
    hw.add_argument("--allreduce-procs", type=argtypes.integer(0, 64), default=2, metavar="N",
                    help="Processes for the all-reduce measurement; 0 or 1 skips it (default: 2).")
    hw.add_argument("--quick", action="store_true",
                    help="With --probe: small sizes only, seconds instead of a minute (a smoke test; "
                         "small matmuls understate the ceiling).")
    hw.add_argument("--gpu", metavar="NAME", help="Show a catalog entry, e.g. h100-sxm, 'A100 80GB PCIe'.")
    hw.add_argument("--json", action="store_true", help="Print machine-readable JSON.")
    hw.set_defaults(func=cmd_hw)
    parser._subcommands = {"train": tr, "generate": ge, "hw": hw}
    for module_name in COMPONENT_COMMANDS:
        parser._subcommands.update(importlib.import_module(module_name).register(sub))
    return parser


def _stop_signals(command: str) -> None:
    """Until a command installs its own handlers (train saves a checkpoint, serve drains), a
    stop signal ends it with one sentence and exit 130 instead of the interpreter's silent death
    (SIGTERM, SIGHUP)."""
    import signal

    def stop(signum, frame):
        exit_at_once(command, f"interrupted by {signal.Signals(signum).name}.")

    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name) and signal.getsignal(getattr(signal, name)) is signal.SIG_DFL:
            signal.signal(getattr(signal, name), stop)


def main(argv: list[str] | None = None) -> int:
    import threading

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # report against the subcommand's usage, not the top-level one
        parser._subcommands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    if threading.current_thread() is threading.main_thread():
        _stop_signals(args.command)
    try:
        return args.func(args)
    except TensorpilotError as exc:
        print(f"tensorpilot {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"tensorpilot {args.command}: interrupted.", file=sys.stderr)
        return 130
    except OSError as exc:
        # the machine refused something no check foresaw (disk full, a file vanished): its
        # reason and the file, in one sentence; a bug is not an OSError and keeps its traceback
        from tensorpilot.files import os_reason

        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        print(f"tensorpilot {args.command}: error: {os_reason(exc)}{where}.", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"tensorpilot {args.command}: error: this machine ran out of memory; use a smaller "
              "model or batch.", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
