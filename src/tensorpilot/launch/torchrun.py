"""Starting the processes of a run on this machine: ``tensorpilot train --nproc N`` through
torchrun (job files for SLURM and Kubernetes: launch/jobfiles.py).

``train --nproc N`` does not re-implement process management: it writes the effective
configuration to ``<run-dir>/launch.toml`` and runs torchrun's own agent in this process
(``torch.distributed.run``) with ``-m tensorpilot train --config <run-dir>/launch.toml``. The agent
restarts the whole group up to ``--max-restarts`` times when a worker dies; a restarted worker
sees TORCHELASTIC_RESTART_COUNT > 0 and resumes from the run's newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import socket
from pathlib import Path

from tensorpilot.errors import TrainingAborted
from tensorpilot.parallel.mesh import DistributedError, first_line, in_launched_worker, resolve_layout

DEFAULT_PORT = 29500


def wants_launch(cfg) -> bool:
    """This process should start the workers (instead of being one)."""
    p = cfg.parallel
    return not in_launched_worker() and (p.nproc > 1 or p.nnodes != "1" or bool(p.rdzv_endpoint))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has_option(flag: str) -> bool:
    """Whether this torch's torchrun knows ``flag`` (newer options are missing in older ones)."""
    from torch.distributed.run import get_args_parser

    return flag in get_args_parser()._option_string_actions


def torchrun_args(cfg, config_path: Path) -> list[str]:
    """torchrun's command line for this run (also what a user would type by hand)."""
    p = cfg.parallel
    single_node = p.nnodes == "1"
    args = ["--nproc-per-node", str(p.nproc), "--nnodes", p.nnodes, "--max-restarts", str(p.max_restarts)]
    if single_node and not p.rdzv_endpoint:
        # a private rendezvous on a free loopback port: several runs may share the machine
        args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}"]
    else:
        endpoint = p.rdzv_endpoint or f"127.0.0.1:{DEFAULT_PORT}"
        args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--node-rank", str(p.node_rank)]
    if _has_option("--shutdown-timeout"):
        # a stop signal lets the workers finish their step and save together: give them the
        # collective timeout before the agent kills them (its default is 30 s)
        args += ["--shutdown-timeout", str(int(p.timeout_s))]
    # join_timeout bounds how long the group waits for every node to arrive
    args += ["--rdzv-conf", f"join_timeout={int(p.timeout_s)}",
             "--rdzv-id", Path(cfg.run_dir).name, "-m", "tensorpilot", "train", "--config", str(config_path)]
    return args


def launch_train(cfg, console=None) -> int:
    """Run ``cfg`` on ``nproc`` local processes (per node) through torchrun's agent."""
    from tensorpilot.training import rundir

    p = cfg.parallel
    nnodes = int(p.nnodes.split(":")[-1])
    if nnodes == 1:                         # catch a layout/world mismatch before starting anything
        resolve_layout(p, p.nproc)
    # the workers' run directory, by the trainer's own rule (a resumed run continues in the
    # directory of its checkpoint), checked before any process starts
    run_dir, _ = rundir.resolve(cfg.run_dir, cfg.resume, cfg.model.name, cfg.model.size)
    # the workers' configuration names that directory ('latest': this run's newest checkpoint);
    # a copy: the caller's configuration is not changed
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir),
                              resume=str(run_dir) if cfg.resume == "latest" else cfg.resume)
    held = rundir.lock(run_dir)             # for the whole group (restarts included); workers inherit it
    os.environ[rundir.LOCK_ENV] = str(run_dir.resolve())
    try:
        return _run_torchrun(cfg, run_dir, console)
    finally:
        held.release()
        os.environ.pop(rundir.LOCK_ENV, None)


def _run_torchrun(cfg, run_dir: Path, console) -> int:
    from tensorpilot.config import to_toml
    from tensorpilot.files import write_atomic

    p = cfg.parallel
    config_path = run_dir / "launch.toml"
    write_atomic(config_path, to_toml(cfg), "launch configuration")

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import parse_args, run

    args = torchrun_args(cfg, config_path)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(p.nproc, 1))))
    if console is not None:
        console.print(f"launching: torchrun {' '.join(args)}", highlight=False)
    try:
        run(parse_args(args))
    except SignalException as exc:          # the agent forwarded it; the workers stopped together
        raise _interrupted(cfg, signal.Signals(exc.sigval).name) from None
    except ChildFailedError as exc:
        codes = {f.exitcode for f in exc.failures.values()}
        # a stop signal reached a worker: the ranks agreed, saved together and exit 130; the agent
        # sends SIGTERM to the ranks still exiting when the first one is gone (-15: killed by it)
        if INTERRUPTED_EXIT_CODE in codes and codes <= {INTERRUPTED_EXIT_CODE, -signal.SIGTERM}:
            raise _interrupted(cfg, "a stop signal to a worker") from None
        rank, failure = min(exc.failures.items())
        restarts = f" after {p.max_restarts} restart(s)" if p.max_restarts else ""
        raise DistributedError(f"training failed{restarts}: worker rank {rank} exited with code "
                               f"{failure.exitcode} (its own message is above).") from None
    except RendezvousError as exc:
        raise DistributedError(f"the rendezvous did not complete within {p.timeout_s:g} s: not all "
                               f"{p.nnodes} node(s) joined ({first_line(exc, 160)}).") from None
    return 0


INTERRUPTED_EXIT_CODE = 130                 # what `tensorpilot train` exits with after a stop signal


def _interrupted(cfg, what: str) -> TrainingAborted:
    """The launcher's sentence after its workers stopped on a signal: where the run can go on."""
    from tensorpilot.training.checkpoint import list_checkpoints

    ckpts = list_checkpoints(Path(cfg.run_dir) / "checkpoints")
    saved = f"the newest checkpoint is {ckpts[-1].name}" if ckpts else "no checkpoint was written"
    again = f"tensorpilot train --resume {shlex.quote(cfg.run_dir)} --nproc {cfg.parallel.nproc}"
    if cfg.parallel.nnodes != "1":
        again += f" --nnodes {cfg.parallel.nnodes}"
    return TrainingAborted(f"interrupted by {what}; {saved}, continue with `{again}`.",
                           exit_code=INTERRUPTED_EXIT_CODE)


__all__ = ["wants_launch", "launch_train", "torchrun_args"]
