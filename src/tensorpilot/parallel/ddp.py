"""Data parallelism by replication: DistributedDataParallel over the mesh's "dp" axis.

DDP groups gradients into buckets of ``bucket_mb`` (in reverse registration order, roughly the
order backward produces them) and launches each bucket's all-reduce as soon as it is full, so
communication overlaps the rest of backward. On gradient-accumulation micro-steps the trainer
enters ``no_sync()`` and gradients only accumulate locally; the last micro-step reduces the sum.
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel


def apply_ddp(model: nn.Module, dp_mesh, bucket_mb: float, device) -> DistributedDataParallel:
    return DistributedDataParallel(
        model,
        process_group=dp_mesh.get_group(),
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_mb,
        # gradients are written straight into the bucket storage: no copy, less memory
        gradient_as_bucket_view=True,
        # parameters frozen with --optim.freeze have no gradient; DDP must not wait for them
        find_unused_parameters=False,
    )
