"""Tensor parallelism for the built-in gpt with DTensor's ``parallelize_module`` (Megatron-LM's
split, Shoeybi et al. 2019, section 3):

    attention   qkv  column-wise: each rank computes H/tp whole heads (the gpt orders the fused
                     qkv rows head-major, so a row slice is complete heads)   (B, T, 3C/tp)
                proj row-wise: partial sums of (B, T, C), all-reduced (or reduce-scattered)
    MLP         fc   column-wise                                            (B, T, 4C/tp)
                proj row-wise                                               (B, T, C)

Two collectives per block forward, two in backward. With ``sequence_parallel`` the activations
between blocks (LayerNorms, residual adds) are sharded along T instead of replicated: the
all-reduce becomes a reduce-scatter + all-gather pair of the same volume, and the LayerNorm work
and activation memory are divided by tp (Korthikanti et al. 2022).
Embeddings, the final norm and the (tied) head stay replicated: at the gpt's sizes (byte vocab,
V=256) sharding them saves little and the tied weight must stay one tensor.
"""

from __future__ import annotations

from torch import nn

from tensorpilot.errors import ConfigError


def apply_tp(model: nn.Module, tp_mesh, sequence_parallel: bool) -> nn.Module:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    tp = tp_mesh.size()
    blocks = getattr(model, "blocks", None)
    if blocks is None or not hasattr(model, "tok_emb"):
        raise ConfigError("tensor parallelism (--parallel.tp) is implemented for the built-in gpt only.")
    n_head = model.cfg.n_head
    if n_head % tp:
        raise ConfigError(f"tensor parallelism splits attention heads: model.n_head ({n_head}) must "
                          f"be divisible by parallel.tp ({tp}).")
    if sequence_parallel and model.cfg.seq_len % tp:
        raise ConfigError(f"sequence parallelism needs model.seq_len ({model.cfg.seq_len}) divisible "
                          f"by parallel.tp ({tp}).")
    # with sequence parallelism the block boundary activations are Shard(1) (sequence dim)
    between = Shard(1) if sequence_parallel else Replicate()
    for block in blocks:
        plan = {
            "attn.qkv": ColwiseParallel(),
            "attn.proj": RowwiseParallel(output_layouts=between),
            "mlp.fc": ColwiseParallel(),
            "mlp.proj": RowwiseParallel(output_layouts=between),
        }
        if sequence_parallel:
            plan.update({
                "ln1": SequenceParallel(), "ln2": SequenceParallel(),
                # all-gather T before the column-wise layers need the whole sequence
                "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)
    if sequence_parallel:
        # enter: shard the embedding sum along T; leave: gather it back before the final norm
        parallelize_module(model, tp_mesh, {
            "blocks.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                           use_local_output=True),
            "ln_f": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                       use_local_output=True),
        })
    return model
