"""The `train` command line: its options (one per RunConfig setting, plus shorthands) and the
RunConfig they make, a resumed run's checkpoint configuration included. Shared by `tensorpilot
train` (tensorpilot.cli) and `tensorpilot launch` (tensorpilot.launch.command)."""

from __future__ import annotations

import argparse
import shlex
import typing
from typing import Any

from tensorpilot.errors import CheckpointError, ConfigError

# Short flags scripts can rely on -> the setting they set.
ALIASES = {
    "--model": "model.name", "--size": "model.size", "--steps": "train.steps",
    "--run-dir": "run_dir", "--precision": "engine.precision", "--compile": "engine.compile",
    "--device": "train.device", "--batch-size": "data.batch_size", "--lr": "optim.lr",
    "--data": "data.path", "--seed": "train.seed",
    "--optimize": "engine.optimize", "--tune-budget": "engine.tune_budget",
    "--nproc": "parallel.nproc", "--nnodes": "parallel.nnodes", "--node-rank": "parallel.node_rank",
    "--rdzv-endpoint": "parallel.rdzv_endpoint", "--max-restarts": "parallel.max_restarts",
    "--grid-intensity": "train.grid_intensity",
}


def _metavar(tp: Any) -> str:
    base = typing.get_args(tp)[0] if type(None) in typing.get_args(tp) else tp
    if typing.get_origin(base) is typing.Literal:
        return "{" + ",".join(typing.get_args(base)) + "}"
    if typing.get_origin(base) is list:
        return "A,B,..."
    return {int: "N", float: "X", str: "TEXT"}.get(base, "VALUE")


def _is_bool(tp: Any) -> bool:
    return tp is bool


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    from tensorpilot.config import field_docs

    p.add_argument("--config", metavar="FILE.toml", help="Read settings from a TOML file "
                   "(sections [model], [data], [optim], [engine], [train], [checkpoint], [logging]); "
                   "command-line options override it.")
    p.add_argument("--print-config", action="store_true",
                   help="Print the effective configuration as TOML and exit.")
    p.add_argument("--resume", nargs="?", const="latest", metavar="DIR",
                   help="Continue from the newest checkpoint of run directory DIR (or of --run-dir "
                        "when DIR is omitted), or from one checkpoint directory. The checkpoint's "
                        "configuration is the base; options given here override it.")
    docs = {name: (doc, tp, default) for name, doc, tp, default in field_docs()}
    common = p.add_argument_group("common options (shorthands for the settings below)")
    for flag, dotted in ALIASES.items():
        if dotted == "run_dir":
            common.add_argument(flag, dest="set:run_dir", metavar="DIR", default=argparse.SUPPRESS,
                                help="Run directory (default: a new directory under runs/).")
            continue
        doc, tp, default = docs[dotted]
        common.add_argument(flag, dest=f"set:{dotted}", metavar=_metavar(tp), default=argparse.SUPPRESS,
                            help=f"{doc} Same as --{dotted}. (default: {default})")
    section = None
    group = None
    for dotted, (doc, tp, default) in docs.items():
        sec = dotted.split(".")[0]
        if sec != section:
            section, group = sec, p.add_argument_group(f"[{sec}] settings")
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        if _is_bool(tp):
            group.add_argument(f"--{dotted}", dest=f"set:{dotted}", action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS,
                               help=f"{doc} (default: {shown})")
        else:
            group.add_argument(f"--{dotted}", dest=f"set:{dotted}", metavar=_metavar(tp), default=argparse.SUPPRESS,
                               help=f"{doc} (default: {shown if shown not in (None, '') else 'from preset'})")


def build_config(args: argparse.Namespace):
    from tensorpilot.config import RunConfig, apply_mapping, load_toml, overrides_to_mapping
    from tensorpilot.workloads import specs

    cfg = RunConfig()
    given = {k[4:]: v for k, v in vars(args).items() if k.startswith("set:")}
    if args.resume:
        # the checkpoint's own configuration is the base of a resumed run
        from tensorpilot.training import checkpoint as ckpt_io

        target = args.resume if args.resume != "latest" else given.get("run_dir")
        if target:
            ckpt = ckpt_io.find_checkpoint(target)
            saved = ckpt_io.read_meta(ckpt).get("config", {})
            if not isinstance(saved, dict):
                raise CheckpointError(f"checkpoint {str(ckpt)!r} is corrupt: its meta.json has no configuration.")
            _check_factory(saved, given.get("model.name"), ckpt)
            # the layout belongs to this invocation: a checkpoint resumes at any world size
            apply_mapping(cfg, {k: v for k, v in saved.items() if k not in ("run_dir", "resume", "parallel")},
                          source="checkpoint: ")
        cfg.resume = args.resume
    if args.config:
        apply_mapping(cfg, load_toml(args.config), source=f"{args.config}: ")
    apply_mapping(cfg, overrides_to_mapping(given))
    cfg = cfg.validate()
    specs.check_model_name(cfg.model.name)
    return cfg


def _check_factory(saved: dict, given: str | None, ckpt) -> None:
    """A run directory is data, possibly someone else's: the code that builds the model comes
    from this command line (or is built in), never from the checkpoint's meta.json."""
    from tensorpilot.workloads import specs

    model = saved.get("model") if isinstance(saved.get("model"), dict) else {}
    name = model.get("name")
    if not isinstance(name, str) or name in specs.builtin_names() or name == given:
        return
    if given:
        raise ConfigError(f"cannot resume: the checkpoint was trained with --model {name!r} but this "
                          f"run asks for {given!r}; drop the override or start a new run.")
    if name.startswith("python:"):
        raise ConfigError(f"the checkpoint's model ({name}) was given to tensorpilot.train() as an "
                          "object: resume it from Python, tensorpilot.train(model, data, "
                          f"overrides={{'resume': {str(ckpt)!r}}}).")
    raise ConfigError(f"the checkpoint was trained with the model factory {name!r}, and a run "
                      f"directory never chooses code to run: add --model {shlex.quote(name)} to resume it.")
