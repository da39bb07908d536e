"""Starting the processes of a run: torchrun on this machine (``tensorpilot train --nproc N``),
and ready-made job files for SLURM (sbatch) and Kubernetes (Kubeflow PyTorchJob).

``train --nproc N`` does not re-implement process management: it writes the effective
configuration to ``<run-dir>/launch.toml`` and runs torchrun's own agent in this process
(``torch.distributed.run``) with ``-m tensorpilot train --config <run-dir>/launch.toml``. The agent
restarts the whole group up to ``--max-restarts`` times when a worker dies; a restarted worker
sees TORCHELASTIC_RESTART_COUNT > 0 and resumes from the run's newest checkpoint.
"""

from __future__ import annotations

import re

import os
import socket
from pathlib import Path

from tensorpilot.errors import ConfigError
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
    # join_timeout bounds how long the group waits for every node to arrive
    args += ["--rdzv-conf", f"join_timeout={int(p.timeout_s)}",
             "--rdzv-id", Path(cfg.run_dir).name, "-m", "tensorpilot", "train", "--config", str(config_path)]
    return args


def launch_train(cfg, console=None) -> int:
    """Run ``cfg`` on ``nproc`` local processes (per node) through torchrun's agent."""
    from tensorpilot.config import to_toml
    from tensorpilot.training.trainer import new_run_dir

    p = cfg.parallel
    nnodes = int(p.nnodes.split(":")[-1])
    if nnodes == 1:                         # catch a layout/world mismatch before starting anything
        resolve_layout(p, p.nproc)
    if not cfg.run_dir:
        cfg.run_dir = str(new_run_dir(cfg))
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.resume == "latest":              # 'latest' means this run's newest checkpoint
        cfg.resume = str(run_dir)
    config_path = run_dir / "launch.toml"
    config_path.write_text(to_toml(cfg))

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import parse_args, run

    args = torchrun_args(cfg, config_path)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(p.nproc, 1))))
    if console is not None:
        console.print(f"launching: torchrun {' '.join(args)}", highlight=False)
    try:
        run(parse_args(args))
    except ChildFailedError as exc:
        rank, failure = min(exc.failures.items())
        restarts = f" after {p.max_restarts} restart(s)" if p.max_restarts else ""
        raise DistributedError(f"training failed{restarts}: worker rank {rank} exited with code "
                               f"{failure.exitcode} (its own message is above).") from None
    except RendezvousError as exc:
        raise DistributedError(f"the rendezvous did not complete within {p.timeout_s:g} s: not all "
                               f"{p.nnodes} node(s) joined ({first_line(exc, 160)}).") from None
    return 0


# ------------------------------------------------------------------------------ job files

def sbatch_script(*, nodes: int, gpus: int, train_args: list[str], job_name: str, time: str,
                  partition: str | None, checkpoint_dir: str, port: int = DEFAULT_PORT) -> str:
    """An sbatch script: one srun task per node, each running torchrun with ``gpus`` workers; the
    first node of the allocation hosts the c10d rendezvous."""
    import shlex

    part = f"#SBATCH --partition={partition}\n" if partition else ""
    args = " ".join(shlex.quote(a) for a in train_args)
    # double quotes: the default directory names $HOME and $SLURM_JOB_NAME, which must expand
    run_dir = '"' + re.sub(r'([`"\\])', r'\\\1', checkpoint_dir) + '"'
    return f"""#!/bin/bash
# Written by `tensorpilot launch slurm`. Submit with: sbatch <this file>
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={gpus}
#SBATCH --cpus-per-task={max(4, 8 * gpus)}
#SBATCH --time={time}
#SBATCH --output=%x-%j.out
{part}set -euo pipefail
# the first node of the allocation hosts the rendezvous
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export OMP_NUM_THREADS=8
# checkpoints must live on storage every node sees: a restarted group resumes from there
mkdir -p {run_dir}
srun --kill-on-bad-exit=1 python -m torch.distributed.run \\
    --nnodes={nodes} --nproc-per-node={gpus} \\
    --rdzv-backend=c10d --rdzv-endpoint="$head:{port}" --rdzv-id="$SLURM_JOB_ID" \\
    --max-restarts=3 \\
    -m tensorpilot train --run-dir {run_dir} {args}
"""


def pytorchjob_manifest(*, name: str, nodes: int, gpus: int, image: str, train_args: list[str],
                        pvc: str, mount: str = "/checkpoints", namespace: str = "default",
                        max_restarts: int = 3) -> dict:
    """A Kubeflow training-operator PyTorchJob (kubeflow.org/v1): 1 master + nodes-1 workers, each
    a pod with ``gpus`` GPUs running torchrun; the operator sets MASTER_ADDR/PORT, and
    ``elasticPolicy`` makes torchrun use a c10d rendezvous with restarts. A PersistentVolumeClaim
    holds the run directory so a restarted pod resumes from the newest checkpoint."""
    run_dir = f"{mount}/{name}"
    command = ["python", "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc-per-node={gpus}",
               f"--max-restarts={max_restarts}", "--rdzv-backend=c10d",
               "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)",
               "-m", "tensorpilot", "train", "--run-dir", run_dir, *train_args]

    def replica(count: int) -> dict:
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {
                "containers": [{
                    "name": "pytorch", "image": image, "command": command,
                    "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
                    "volumeMounts": [{"name": "checkpoints", "mountPath": mount},
                                     {"name": "dshm", "mountPath": "/dev/shm"}],
                }],
                "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": pvc}},
                            # NCCL and DataLoader workers need more shared memory than the 64 MiB default
                            {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
            }},
        }

    specs = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": nodes, "maxReplicas": nodes,
                              "maxRestarts": max_restarts},
            "pytorchReplicaSpecs": specs,
        },
    }


def checkpoint_pvc(*, name: str, size: str, namespace: str = "default", storage_class: str | None = None) -> dict:
    """The ReadWriteMany claim every pod mounts for the run directory."""
    spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def check_job_size(nodes: int, gpus: int) -> None:
    if nodes <= 0 or gpus <= 0:
        raise ConfigError(f"--nodes and --gpus must be positive integers, got {nodes} and {gpus}.")


__all__ = ["wants_launch", "launch_train", "torchrun_args", "sbatch_script", "pytorchjob_manifest",
           "checkpoint_pvc", "check_job_size"]
