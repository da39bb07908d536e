"""``tensorpilot launch slurm|k8s``: write the job files for a multi-node run (argparse only here;
the writers live in launch/jobfiles.py)."""

from __future__ import annotations

import argparse


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=2, metavar="N", help="Nodes, 1 to 100,000 (default: 2).")
    p.add_argument("--gpus", type=int, default=8, metavar="G", help="GPUs per node, 1 to 64 (default: 8).")
    p.add_argument("--name", default="tensorpilot",
                   help="Job name (default: tensorpilot). slurm: letters, digits, '.', '_', '-'; k8s: a DNS-1035 "
                        "label (lowercase letters, digits, '-', starting with a letter).")
    p.add_argument("--out", metavar="FILE", help="Write here (default: <name>.sbatch / <name>.yaml); '-' prints "
                   "the job file on standard output and nothing else, e.g. `--out - | sbatch` or "
                   "`--out - | kubectl apply -f -` (write ./- for a file named '-').")
    p.add_argument("train_args", nargs=argparse.REMAINDER, metavar="-- TRAIN ARGS",
                   help="Arguments of `tensorpilot train` after `--`, e.g. -- --size large --steps 5000.")


def register(sub) -> dict[str, argparse.ArgumentParser]:
    la = sub.add_parser("launch", help="Write an sbatch script or a Kubernetes PyTorchJob for a multi-node run.",
                        description="Write the job file that runs `tensorpilot train` on N nodes x G GPUs "
                        "through torchrun (c10d rendezvous, restarts, shared checkpoint directory).")
    kinds = la.add_subparsers(dest="launch_kind", metavar="{slurm,k8s}", required=True)
    sl = kinds.add_parser("slurm", help="An sbatch script (srun + torchrun).")
    _common(sl)
    sl.add_argument("--time", default="24:00:00",
                    help="Wall-clock limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (default: 24:00:00).")
    sl.add_argument("--partition", help="SLURM partition.")
    sl.add_argument("--checkpoint-dir", default="$HOME/tensorpilot-runs/$SLURM_JOB_NAME",
                    help="Run directory on storage all nodes share; $NAME and ${NAME} expand in the job "
                         "(default: $HOME/tensorpilot-runs/$SLURM_JOB_NAME).")
    k8 = kinds.add_parser("k8s", help="A Kubeflow PyTorchJob manifest plus its checkpoint volume claim.")
    _common(k8)
    k8.add_argument("--image", default="ghcr.io/example/tensorpilot:latest", help="Container image.")
    k8.add_argument("--namespace", default="default", help="Namespace (default: default).")
    k8.add_argument("--pvc-size", default="100Gi", help="Checkpoint volume size (default: 100Gi).")
    k8.add_argument("--storage-class", help="StorageClass of the ReadWriteMany checkpoint volume.")
    k8.add_argument("--max-restarts", type=int, default=3, metavar="N",
                    help="Group restarts, 0 to 1,000 (default: 3).")
    la.set_defaults(func=cmd_launch)
    return {"launch": la}


def cmd_launch(args: argparse.Namespace) -> int:
    from tensorpilot import files
    from tensorpilot.launch import jobfiles

    jobfiles.check_job_size(args.nodes, args.gpus)
    train_args = _train_args(args.train_args)
    if args.launch_kind == "slurm":
        text = jobfiles.sbatch_script(nodes=args.nodes, gpus=args.gpus, train_args=train_args,
                                      job_name=args.name, time=args.time, partition=args.partition,
                                      checkpoint_dir=args.checkpoint_dir)
        suffix = "sbatch"
    else:
        import json

        jobfiles.check_k8s_job_name(args.name, args.nodes)
        pvc = jobfiles.checkpoint_pvc(name=f"{args.name}-checkpoints", size=args.pvc_size,
                                      namespace=args.namespace, storage_class=args.storage_class)
        job = jobfiles.pytorchjob_manifest(name=args.name, nodes=args.nodes, gpus=args.gpus, image=args.image,
                                           train_args=train_args, pvc=pvc["metadata"]["name"],
                                           namespace=args.namespace, max_restarts=args.max_restarts)
        # JSON is valid YAML: two documents, no YAML library needed
        text = "---\n".join(json.dumps(doc, indent=2) + "\n" for doc in (pvc, job))
        suffix = "yaml"
    if args.out == "-":
        return _print_job_file(text)
    # the name is validated by now, so the default file name is a plain one in this directory
    out = files.output_file(args.out if args.out is not None else f"{args.name}.{suffix}", "--out")
    files.write_atomic(out, text, "job file")
    print(f"wrote {out} ({args.nodes} node(s) x {args.gpus} GPU(s))")
    return 0


def _print_job_file(text: str) -> int:
    """``--out -``: the job file alone on standard output, for a pipe into sbatch or kubectl."""
    import os
    import sys

    from tensorpilot.errors import TensorpilotError

    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader stopped early; keep Python's exit-time flush from failing on the closed pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise TensorpilotError("standard output closed before the whole job file was written "
                               "(--out -): the command reading it stopped early.") from None
    return 0


def _train_args(remainder: list[str] | None) -> list[str]:
    """The arguments after ``--``, checked by `tensorpilot train`'s own parser and then by the
    run configuration's types and rules, so a typo or an impossible value fails here, not in a
    queued job. No path is opened: the paths name the cluster's storage."""
    from tensorpilot.errors import ConfigError
    from tensorpilot.launch.jobfiles import check_train_args

    args = list(remainder or [])
    if args[:1] == ["--"]:
        args = args[1:]
    check_train_args(args)               # a line break anywhere, before any value is read
    parser = _train_parser()
    try:
        known, unknown = parser.parse_known_args(args)
    except _ParseError as exc:
        raise ConfigError(f"train arguments after --: {exc}.") from None
    if unknown:
        raise ConfigError(f"train arguments after -- include {' '.join(unknown)!r}, which `tensorpilot train` "
                          "does not accept (see `tensorpilot train --help`).")
    if "set:run_dir" in vars(known):
        raise ConfigError("the job file sets the run directory itself (slurm: --checkpoint-dir; k8s: the "
                          "checkpoint volume); leave --run-dir out of the train arguments.")
    try:
        _check_train_values(known)
    except ConfigError as exc:
        raise ConfigError(f"train arguments after --: {exc}") from None
    return args


def _check_train_values(known: argparse.Namespace) -> None:
    """The values given (``--lr nan``, ``--steps 0``, ``--precision fp64``) applied onto a default
    RunConfig the way `tensorpilot train` applies them, then every section's own validate(),
    except that data paths are not looked up (they exist on the cluster, maybe not here). Values
    that --config or --resume would bring are not known here; train checks them on the cluster.
    Standard library only, like the configuration."""
    import dataclasses

    from tensorpilot.config import SECTIONS, RunConfig, apply_mapping, overrides_to_mapping
    from tensorpilot.workloads import specs

    given = {k[len("set:"):]: v for k, v in vars(known).items() if k.startswith("set:")}
    cfg = apply_mapping(RunConfig(), overrides_to_mapping(given))
    for name in SECTIONS:
        section = getattr(cfg, name)
        if name == "data":
            section = dataclasses.replace(section, path=None, targets_path=None)
        section.validate()
    specs.check_model_name(cfg.model.name)


class _ParseError(Exception):
    """What argparse would have printed before exiting."""


def _train_parser() -> argparse.ArgumentParser:
    from tensorpilot.trainargs import add_train_arguments

    parser = argparse.ArgumentParser(prog="tensorpilot train", add_help=False)
    add_train_arguments(parser)

    def fail(message: str):
        raise _ParseError(message)

    parser.error = fail                  # argparse reports every other problem through error()
    return parser
