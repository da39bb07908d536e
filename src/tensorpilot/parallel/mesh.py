"""Process group and DeviceMesh for one run: who am I, how many are we, and how are we arranged.

A layout is dp x pp x tp = world size. The mesh is always 3-D, named ("dp", "pp", "tp"), with
tp innermost: tensor-parallel peers exchange activations every layer, so they should be the
closest ranks (same node, NVLink); data-parallel peers exchange gradients once per step and can
be the farthest. Axes of size 1 cost nothing.

The process group is initialised from the environment torchrun sets (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT); under ``srun`` without torchrun the SLURM variables are
translated. gloo on CPU, NCCL on CUDA, and every collective has a timeout: a dead peer ends the
run with an error instead of a hang.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tensorpilot.errors import ConfigError, TensorpilotError, first_line
from tensorpilot.layout import Layout

__all__ = ["Layout", "ParallelContext", "DistributedError", "in_launched_worker", "resolve_layout",
           "init_distributed", "slurm_env", "is_comm_failure", "first_line"]


class DistributedError(TensorpilotError):
    """A peer, the rendezvous or the network failed (exit code 1, one sentence)."""


def is_comm_failure(exc: BaseException) -> bool:
    """An error raised by a collective because a peer or the network went away (or timed out)."""
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return any(k in text for k in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                    "Timed out", "timed out", "ProcessGroupGloo", "NCCL error", "gloo"))


def resolve_layout(pcfg, world: int) -> Layout:
    """The layout ``pcfg`` asks for on ``world`` processes, or a one-sentence ConfigError."""
    inner = pcfg.tp * pcfg.pp
    dp = pcfg.dp or max(world // inner, 1)
    if dp * inner != world:
        raise ConfigError(f"the layout dp={dp} x tp={pcfg.tp} x pp={pcfg.pp} needs {dp * inner} "
                          f"processes but {world} were started; change --nproc or the layout.")
    return Layout(dp=dp, tp=pcfg.tp, pp=pcfg.pp, sharding=pcfg.sharding,
                  sequence_parallel=pcfg.sequence_parallel and pcfg.tp > 1, schedule=pcfg.pp_schedule)


def in_launched_worker() -> bool:
    """True inside a process torchrun (or srun, or a test harness) started as one rank of many."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def slurm_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """torch.distributed's variables derived from SLURM's when run under ``srun`` (one task per
    rank) without torchrun; {} when not under a multi-task SLURM step."""
    env = os.environ if env is None else env
    if "SLURM_PROCID" not in env or int(env.get("SLURM_NTASKS", "1")) <= 1 or "RANK" in env:
        return {}
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    master = env.get("MASTER_ADDR")
    if not master and nodes:
        try:   # "gpu[01-04]" -> "gpu01"; scontrol knows SLURM's hostlist syntax
            master = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True,
                                    text=True, timeout=10).stdout.split()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            master = nodes.split(",")[0]
    return {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env["SLURM_NTASKS"],
            "LOCAL_RANK": env.get("SLURM_LOCALID", "0"), "MASTER_ADDR": master or "127.0.0.1",
            # a port every task of this job agrees on without talking: derived from the job id
            "MASTER_PORT": env.get("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))}


@dataclass
class ParallelContext:
    """This process's place in the run. ``mesh`` is None when running alone."""

    layout: Layout
    rank: int = 0
    local_rank: int = 0
    device: Any = None
    mesh: Any = None                          # torch DeviceMesh ("dp", "pp", "tp") or None
    owns_group: bool = False                  # this run created the process group (and ends it)

    @property
    def world(self) -> int:
        return self.layout.world

    @property
    def active(self) -> bool:
        return self.mesh is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def coord(self, axis: str) -> int:
        return self.mesh[axis].get_local_rank() if self.mesh is not None else 0

    @property
    def dp_rank(self) -> int:
        return self.coord("dp")

    @property
    def pp_rank(self) -> int:
        return self.coord("pp")

    def group(self, axis: str):
        return self.mesh[axis].get_group()


def _store(rank: int, world: int, timeout_s: float):
    """The key-value store the process group meets in. Under torchrun the agent's store outlives
    a restart of the group, so the previous attempt's keys (dead peers' addresses) are still in it:
    each attempt gets its own key prefix. Elsewhere None (torch's env:// store)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timedelta(seconds=timeout_s))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"tensorpilot/attempt_{attempt}", store)


def init_distributed(pcfg, device_kind: str) -> ParallelContext:
    """Join the process group torchrun/srun describes and build the mesh; alone, a trivial context.
    On CUDA each process takes the GPU of its LOCAL_RANK."""
    import torch

    os.environ.update(slurm_env())
    if not in_launched_worker() or int(os.environ["WORLD_SIZE"]) == 1:
        layout = resolve_layout(pcfg, 1)
        return ParallelContext(layout=layout)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    layout = resolve_layout(pcfg, world)      # before joining: a bad layout fails fast everywhere
    cuda = device_kind == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    owns_group = not dist.is_initialized()   # a caller's own group is theirs to destroy
    if owns_group:
        try:
            # the timeout bounds the store connection and every later collective: a peer that
            # died or never arrived raises instead of blocking forever
            dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                                    timeout=timedelta(seconds=pcfg.timeout_s), store=_store(rank, world, pcfg.timeout_s),
                                    device_id=device if cuda else None)
        except (RuntimeError, ValueError, TimeoutError) as exc:
            first = first_line(exc)
            raise DistributedError(f"rank {rank} could not join the process group within "
                                   f"{pcfg.timeout_s:g} s ({first}).") from None
    mesh = init_device_mesh(device.type, (layout.dp, layout.pp, layout.tp), mesh_dim_names=("dp", "pp", "tp"))
    return ParallelContext(layout=layout, rank=rank, local_rank=local_rank, device=device, mesh=mesh,
                           owns_group=owns_group)
