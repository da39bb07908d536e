"""Tensor parallelism with DTensor's ``parallelize_module``. Which layers split how is the
workload's knowledge (its spec's ``tensor_parallel`` plan, e.g. tensorpilot.workloads.gpt_parallel
for the built-in gpt); this applies it on the mesh's "tp" axis."""

from __future__ import annotations

from torch import nn


def apply_tp(model: nn.Module, tp_mesh, plans) -> nn.Module:
    """``plans``: (module, {submodule name: ParallelStyle}) pairs, applied in order."""
    from torch.distributed.tensor.parallel import parallelize_module

    for module, plan in plans:
        parallelize_module(module, tp_mesh, plan)
    return model
