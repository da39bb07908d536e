"""Job files for multi-node runs: an sbatch script for SLURM and a Kubeflow PyTorchJob for
Kubernetes. Each runs ``tensorpilot train`` through torchrun on every node (c10d rendezvous,
restarts from the newest checkpoint on shared storage). Starting processes on this machine is
launch/torchrun.py's job."""

from __future__ import annotations

import re
import shlex

from tensorpilot.errors import ConfigError
# the Kubernetes rules are shared with `deploy k8s`; re-exported, as callers import them from here
from tensorpilot.k8s import (check_dns_label, check_dns_subdomain, check_image, check_quantity,
                             is_dns1035_label, shown)

DEFAULT_PORT = 29500

# Bounds on a job's size: no machine has more than 16 GPUs in one node today, no cluster more
# than ~10^5 nodes; beyond these a typo is the likely cause, not a job.
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 64
MAX_RESTARTS = 1000


# ------------------------------------------------------------------------------ validation
# Every user string that lands in a job file is checked here, so the writers are as safe when
# called from Python as from the CLI. In an sbatch script a newline would end an #SBATCH line and
# start a command of the user's choosing (and sbatch stops reading #SBATCH lines at the first
# command); in a manifest a bad name is refused by the API server only at submission.

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SLURM_WORD = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_SLURM_TIME = re.compile(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+)(?::([0-9]+))?)?")       # ASCII digits
_SHELL_VARIABLE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")


def check_job_size(nodes: int, gpus: int) -> None:
    for what, value, high in (("--nodes", nodes, MAX_NODES), ("--gpus", gpus, MAX_GPUS_PER_NODE)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise ConfigError(f"{what} must be a whole number from 1 to {high:,}, got {value!r}.")


def check_slurm_job_name(name: str) -> None:
    """Letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128: a name
    that is also a safe file name (the default --out is NAME.sbatch) and needs no quoting."""
    if not re.fullmatch(_SLURM_WORD, name) or len(name) > 128:
        raise ConfigError(f"job name {name!r} must be 1-128 letters, digits, '.', '_' or '-', starting with a "
                          "letter or digit.")


def check_slurm_partition(partition: str) -> None:
    """One partition name or a comma-separated list (sbatch tries each)."""
    if not re.fullmatch(rf"{_SLURM_WORD}(?:,{_SLURM_WORD})*", partition) or len(partition) > 256:
        raise ConfigError(f"partition {partition!r} must be a name of letters, digits, '.', '_' or '-' (or a "
                          "comma-separated list of them).")


def check_slurm_time(text: str) -> None:
    """sbatch --time's formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (0: no limit), or
    UNLIMITED / INFINITE; every field after the first is below 60 (hours after days: below 24)."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return
    m = _SLURM_TIME.fullmatch(text) if len(text) <= 32 else None
    if m is None or not _time_fields_in_range(m):
        raise ConfigError(f"--time {text!r} is not a SLURM time; use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                          "D-HH:MM:SS (e.g. 24:00:00 or 2-00:00:00).")


def _time_fields_in_range(m: re.Match) -> bool:
    days, *rest = m.groups()
    fields = [int(x) for x in rest if x is not None]
    if days is not None:                  # D-HH[:MM[:SS]]
        limits = [24, 60, 60]
    else:                                 # MM, MM:SS or HH:MM:SS: the first field has no bound
        limits = [None, 60, 60]
    return all(limit is None or value < limit for value, limit in zip(fields, limits))


def check_checkpoint_dir(path: str) -> None:
    """The run directory is written inside double quotes so that $HOME or ${SLURM_JOB_NAME}
    expand on the cluster; nothing else may: no command substitution ($(...), backticks), no
    other '$' form, no control character (a newline would end the line), no leading '-' (mkdir
    would read an option)."""
    if not path or len(path) > 4096:
        raise ConfigError("--checkpoint-dir must be a path of 1 to 4,096 characters.")
    bad = _CONTROL.search(path) or re.search(r"`", path) or re.search(r"\$", _SHELL_VARIABLE.sub("", path))
    if bad or path.startswith("-"):
        raise ConfigError(f"--checkpoint-dir {path!r} may name variables ($NAME or ${{NAME}}) but no other '$', "
                          "no backticks, no control characters and no leading '-'.")


def check_train_args(train_args: list[str]) -> None:
    """Arguments are shell-quoted (sbatch) or passed as a list (Kubernetes), so any text is
    inert; a line break or other control character still has no place in an option."""
    for arg in train_args:
        if not isinstance(arg, str) or _CONTROL.search(arg):
            raise ConfigError(f"train argument {arg!r} contains a line break or another control character.")


def check_k8s_job_name(name: str, nodes: int) -> None:
    """The training operator requires a DNS-1035 label (lowercase letters, digits, '-', starting
    with a letter, ending with a letter or digit) and names each pod's service NAME-master-0 /
    NAME-worker-I, which must stay within a label's 63 characters."""
    suffix = max(len("-master-0"), len(f"-worker-{nodes - 2}") if nodes > 1 else 0)
    longest = 63 - suffix
    if not is_dns1035_label(name, max_length=longest):
        raise ConfigError(f"job name {shown(name)} must be a DNS-1035 label: lowercase letters, digits and '-', "
                          f"starting with a letter and ending with a letter or digit, at most {longest} "
                          "characters here (the operator names its pods NAME-worker-N).")


def check_max_restarts(max_restarts: int) -> None:
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or not 0 <= max_restarts <= MAX_RESTARTS:
        raise ConfigError(f"--max-restarts must be a whole number from 0 to {MAX_RESTARTS:,}, got {max_restarts!r}.")


# ------------------------------------------------------------------------------ writers

def sbatch_script(*, nodes: int, gpus: int, train_args: list[str], job_name: str, time: str,
                  partition: str | None, checkpoint_dir: str, port: int = DEFAULT_PORT) -> str:
    """An sbatch script: one srun task per node, each running torchrun with ``gpus`` workers; the
    first node of the allocation hosts the c10d rendezvous. Every argument is validated first
    (check_*: ConfigError, one sentence)."""
    check_job_size(nodes, gpus)
    check_slurm_job_name(job_name)
    check_slurm_time(time)
    if partition is not None:
        check_slurm_partition(partition)
    check_checkpoint_dir(checkpoint_dir)
    check_train_args(train_args)
    part = f"#SBATCH --partition={partition}\n" if partition else ""
    args = " ".join(shlex.quote(a) for a in train_args)
    # double quotes: the default directory names $HOME and $SLURM_JOB_NAME, which must expand;
    # check_checkpoint_dir leaves only variables to expand; '`', '"' and '\' are escaped besides
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
    holds the run directory so a restarted pod resumes from the newest checkpoint. Every argument
    is validated first (check_*: ConfigError, one sentence)."""
    check_job_size(nodes, gpus)
    check_k8s_job_name(name, nodes)
    check_dns_label("namespace", namespace)
    check_dns_subdomain("volume claim", pvc)
    check_image(image)
    check_max_restarts(max_restarts)
    check_train_args(train_args)
    if not mount.startswith("/") or _CONTROL.search(mount):
        raise ConfigError(f"mount path {mount!r} must be an absolute path without control characters.")
    run_dir = f"{mount}/{name}"
    # Kubernetes expands $(VAR) in a container's command and reads '$$' as a literal '$'
    # (Container.args API docs): doubling every '$' keeps the user's arguments as typed
    user_args = [a.replace("$", "$$") for a in train_args]
    command = ["python", "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc-per-node={gpus}",
               f"--max-restarts={max_restarts}", "--rdzv-backend=c10d",
               "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)",
               "-m", "tensorpilot", "train", "--run-dir", run_dir, *user_args]

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
    spec: dict = {"pytorchReplicaSpecs": specs}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
        # the operator's admission webhook refuses an elasticPolicy without Worker replicas
        # (training-operator pkg/webhooks/pytorch); one node needs no rendezvous across pods
        spec["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": nodes, "maxReplicas": nodes,
                                 "maxRestarts": max_restarts}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def checkpoint_pvc(*, name: str, size: str, namespace: str = "default", storage_class: str | None = None) -> dict:
    """The ReadWriteMany claim every pod mounts for the run directory."""
    check_dns_subdomain("volume claim", name)
    check_dns_label("namespace", namespace)
    check_quantity("--pvc-size", size)
    if storage_class is not None:
        check_dns_subdomain("storage class", storage_class)
    spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


__all__ = ["sbatch_script", "pytorchjob_manifest", "checkpoint_pvc", "check_job_size", "check_slurm_job_name",
           "check_slurm_partition", "check_slurm_time", "check_checkpoint_dir", "check_train_args",
           "check_k8s_job_name", "check_dns_label", "check_dns_subdomain", "check_image", "check_quantity",
           "check_max_restarts"]
