"""Pipeline parallelism for the built-in gpt with ``torch.distributed.pipelining``.

The gpt is cut by hand between blocks (the way torchtitan splits its models, no tracing):
stage s of pp holds blocks [s*L/pp, (s+1)*L/pp); the first stage also holds the embeddings and
the last the final norm and head. A stage keeps the model's parameter names ("blocks.3.attn..."),
so its state_dict is a slice of the full model's and distributed checkpoints load into any layout.

A batch of B samples is cut into m micro-batches of B/m. Schedules (Huang et al. 2019 GPipe;
Narayanan et al. 2021 1F1B / PipeDream-flush):
    gpipe  all m forwards, then all m backwards: activations of m micro-batches alive at once
    1f1b   after a warm-up of pp-1 forwards, alternate one forward / one backward: at most pp
           micro-batches alive; same bubble, (pp-1)/(m+pp-1) of the step idle
More micro-batches shrink the bubble; the default m = 2*pp keeps it at most ~1/3.
"""

from __future__ import annotations

import torch
from torch import nn

from tensorpilot.errors import ConfigError


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


def split_gpt(model: nn.Module, pp: int, pp_rank: int) -> GPTStage:
    if not hasattr(model, "blocks") or not hasattr(model, "tok_emb"):
        raise ConfigError("pipeline parallelism (--parallel.pp) is implemented for the built-in gpt only.")
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


def build_schedule(stage_module: nn.Module, pp: int, pp_rank: int, device, pp_group, *, schedule: str,
                   microbatches: int, batch_size: int, loss_fn):
    """A PipelineStage for this rank and the schedule that drives it."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    m = microbatches or 2 * pp
    if batch_size % m:
        raise ConfigError(f"pipeline parallelism cuts each batch into {m} micro-batches: data.batch_size "
                          f"({batch_size}) must be divisible by it (set --parallel.pp_microbatches).")
    stage = PipelineStage(stage_module, pp_rank, pp, device, group=pp_group)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    # loss_fn returns the mean over a micro-batch; scale_grads divides the summed gradients by m,
    # so the step's gradient is the mean over the whole batch, as without pipelining
    return cls(stage, n_microbatches=m, loss_fn=loss_fn, scale_grads=True), m
