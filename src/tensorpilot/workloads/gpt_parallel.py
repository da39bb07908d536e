"""How the built-in gpt splits over devices: its tensor-parallel plan and its pipeline stages.
The parallel runtime (tensorpilot.parallel) applies them; this is the only place that knows the
gpt's module names. The model code itself never imports torch.distributed.

Tensor parallelism (Megatron-LM's split, Shoeybi et al. 2019, section 3), per block:

    attention   qkv  column-wise: each rank computes H/tp whole heads (the gpt orders the fused
                     qkv rows head-major, so a row slice is complete heads)   (B, T, 3C/tp)
                proj row-wise: partial sums of (B, T, C), all-reduced (or reduce-scattered)
    MLP         fc   column-wise                                            (B, T, 4C/tp)
                proj row-wise                                               (B, T, C)

Two collectives per block forward, two in backward. With ``sequence_parallel`` the activations
between blocks (LayerNorms, residual adds) are sharded along T instead of replicated: the
all-reduce becomes a reduce-scatter + all-gather pair of the same volume, and the LayerNorm work
and activation memory are divided by tp (Korthikanti et al. 2022). Embeddings, the final norm
and the (tied) head stay replicated: at the gpt's sizes (byte vocabulary, V=256) sharding them
saves little and the tied weight must stay one tensor.

Pipeline parallelism: the gpt is cut by hand between blocks (the way torchtitan splits its
models, no tracing): stage s of pp holds blocks [s*L/pp, (s+1)*L/pp); the first stage also holds
the embeddings and the last the final norm and head. A stage keeps the model's parameter names
("blocks.3.attn..."), so its state_dict is a slice of the full model's and distributed
checkpoints load into any layout.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tensorpilot.errors import ConfigError


def tensor_parallel_plan(model: nn.Module, tp: int, sequence_parallel: bool) -> list[tuple[nn.Module, dict[str, Any]]]:
    """(module, {submodule name: ParallelStyle}) pairs for ``parallelize_module``, in order."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    n_head = model.cfg.n_head
    if n_head % tp:
        raise ConfigError(f"tensor parallelism splits attention heads: model.n_head ({n_head}) must "
                          f"be divisible by parallel.tp ({tp}).")
    if sequence_parallel and model.cfg.seq_len % tp:
        raise ConfigError(f"sequence parallelism needs model.seq_len ({model.cfg.seq_len}) divisible "
                          f"by parallel.tp ({tp}).")
    # with sequence parallelism the block boundary activations are Shard(1) (sequence dim)
    between = Shard(1) if sequence_parallel else Replicate()
    plans: list[tuple[nn.Module, dict[str, Any]]] = []
    for block in model.blocks:
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
        plans.append((block, plan))
    if sequence_parallel:
        # enter: shard the embedding sum along T; leave: gather it back before the final norm
        plans.append((model, {
            "blocks.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                           use_local_output=True),
            "ln_f": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                       use_local_output=True),
        }))
    return plans


class GPTStage(nn.Module):
    """Blocks [lo, hi) of a gpt; the embeddings when first, the final norm and head when last."""

    def __init__(self, gpt: nn.Module, lo: int, hi: int, first: bool, last: bool):
        super().__init__()
        self.cfg = gpt.cfg
        if first:
            self.tok_emb, self.pos_emb = gpt.tok_emb, gpt.pos_emb
        # a ModuleDict keyed by the original index keeps the names "blocks.<i>.*"
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in range(lo, hi)})
        if last:
            self.ln_f, self.head = gpt.ln_f, gpt.head
        self.first, self.last = first, last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:                                               # (B, T) byte ids
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.size(1), device=x.device))
        for block in self.blocks.values():                           # (B, T, C)
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x           # (B, T, V) on the last stage


def pipeline_stage(model: nn.Module, pp: int, pp_rank: int) -> GPTStage:
    """This rank's stage of ``pp``; its repeated blocks are ``stage.blocks`` (a ModuleDict)."""
    n_layer = len(model.blocks)
    if n_layer % pp:
        raise ConfigError(f"pipeline parallelism splits whole blocks: model.n_layer ({n_layer}) must be "
                          f"divisible by parallel.pp ({pp}).")
    if model.cfg.tie_head:
        # the tied weight would live on the first and the last stage at once, and its two
        # gradients would need an extra all-reduce between them
        raise ConfigError("pipeline parallelism needs an untied head: add --model.tie_head false.")
    per = n_layer // pp
    return GPTStage(model, pp_rank * per, (pp_rank + 1) * per, pp_rank == 0, pp_rank == pp - 1)
