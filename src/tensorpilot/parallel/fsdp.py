"""Fully sharded data parallelism with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each repeated block becomes one FSDP unit: its parameters are stored as 1/dp shards (DTensor,
Shard(0)), all-gathered just before the block runs and freed again afterwards when
``reshard_after_forward`` (one more all-gather in backward, peak memory ~ one block of full
parameters). The root call shards what is left (embeddings, final norm, head) and owns the
tied embedding/head weight, so a tied weight is one parameter in one unit. Gradients are
reduce-scattered in ``reduce_dtype`` (fp32: summing many bf16 gradients loses bits).

Parameter names do not change (FSDP2 shards in place, no wrapper module), so checkpoints written
through torch.distributed.checkpoint load into any layout.
"""

from __future__ import annotations

import torch
from torch import nn

from tensorpilot.modules import repeated_blocks

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def apply_fsdp(model: nn.Module, dp_mesh, *, blocks: list[nn.Module] | None, param_dtype: str,
               reshard_after_forward: bool, cpu_offload: bool) -> nn.Module:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=torch.float32)
    kwargs = dict(mesh=dp_mesh, mp_policy=mp)
    if cpu_offload:
        # shards and optimizer step live in host memory; copies to the GPU happen per unit
        kwargs["offload_policy"] = CPUOffloadPolicy()
    blocks = repeated_blocks(model) if blocks is None else blocks
    for i, block in enumerate(blocks):
        # the last block's parameters are needed again at once by backward: keep them gathered
        fully_shard(block, reshard_after_forward=reshard_after_forward and i < len(blocks) - 1, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kwargs)
    return model
