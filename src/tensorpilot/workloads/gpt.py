"""A decoder-only transformer (GPT-2 style): pre-LayerNorm blocks, causal attention through
``scaled_dot_product_attention`` (which the trainer routes to the fastest kernel, as for any
model: tensorpilot.attention), exact-GeLU MLP, learned positions, optionally tied head. Shapes: B batch,
T time, C = d_model, H heads, V vocab.

Model code never imports torch.distributed; parallelism is applied from outside.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from tensorpilot.plan.models import GPT_SIZES


@dataclass(kw_only=True, slots=True)
class GPTConfig:
    vocab_size: int = 256        # bytes
    seq_len: int = 128
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    dropout: float = 0.0
    tie_head: bool = True


MAX_META_SIZE = 2**31 - 1     # any size a meta.json may record; products of two stay in int64


def gpt_config_from_meta(shape: Any, where: Any) -> GPTConfig:
    """The GPTConfig a checkpoint's ``meta.json`` records (``workload.gpt``), checked field by
    field: meta.json is data, and a wrong type or an unknown key is a CheckpointError naming it,
    not a TypeError. Whether the sizes match the weights file is ``checkpoint.build_checked``'s
    question, asked before anything is allocated."""
    from tensorpilot.errors import CheckpointError

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {str(where)!r} has a malformed meta.json: {what}.")

    fields = {f.name: f.type for f in dataclasses.fields(GPTConfig)}   # annotations as text
    if not isinstance(shape, dict):
        raise bad(f"workload.gpt must be an object, got {shape!r:.60}")
    unknown = sorted(set(shape) - set(fields))
    if unknown:
        raise bad(f"workload.gpt has an unknown field {unknown[0]!r:.60} (known: {', '.join(fields)})")
    for key, value in shape.items():
        name = f"workload.gpt.{key}"
        if fields[key] == "bool" and not isinstance(value, bool):
            raise bad(f"{name} must be true or false, got {value!r:.60}")
        if fields[key] == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                       or not 0 <= value < 1):
            raise bad(f"{name} must be a number in [0, 1), got {value!r:.60}")
        if fields[key] == "int" and (isinstance(value, bool) or not isinstance(value, int)
                                     or not 1 <= value <= MAX_META_SIZE):
            raise bad(f"{name} must be a positive integer up to {MAX_META_SIZE}, got {value!r:.60}")
    cfg = GPTConfig(**shape)
    if cfg.d_model % cfg.n_head:
        raise bad(f"workload.gpt.d_model ({cfg.d_model}) must be divisible by n_head ({cfg.n_head})")
    return cfg


# the byte-level presets live in the planner's model catalog, which knows every named shape
SIZES = GPT_SIZES


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.d_model // cfg.n_head                    # D = C / H
        # fused projection, rows ordered head-major (H, 3, D): a contiguous block of rows holds
        # whole heads with their q, k and v, so splitting the rows (column-wise tensor
        # parallelism) hands each rank complete heads.
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # -1 heads: all H here, H / tp on a tensor-parallel rank (whose qkv output is a row slice)
        qkv = self.qkv(x).view(B, T, -1, 3, self.head_dim)          # (B, T, H, 3, D)
        q, k, v = qkv.transpose(1, 2).unbind(dim=3)                  # 3 x (B, H, T, D)
        p = self.dropout if self.training else 0.0
        # the trainer may route this call to a faster kernel (tensorpilot.attention), as any model's
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)   # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))        # (B, T, H*D) -> (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # exact (erf) GeLU, as nanoGPT's MLP; GPT-2 used the tanh approximation. In bf16 on the dev
        # CPU, PyTorch's eager erf kernel is 2.7-3.2x faster than its tanh one and faster than
        # inductor's compiled forms of either (benchmarks/cpu_kernels.py)
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_head:
            self.head.weight = self.tok_emb.weight
        self.apply(self._init)
        # GPT-2's scaled init of residual projections: std 0.02 / sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape                                             # (B, T) byte ids
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)                    # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))                               # (B, T, V) logits

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.8,
                 top_k: int | None = 40, generator: torch.Generator | None = None) -> torch.Tensor:
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.cfg.seq_len:])[:, -1, :].float()   # (B, V)
            idx = torch.cat([idx, next_token(logits, temperature, top_k, generator)], dim=1)
        return idx


def next_token(logits: torch.Tensor, temperature: float, top_k: int | None,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) logits -> (B, 1) next ids: greedy at temperature 0, else sampled among the top_k.
    The logits are shifted by their row maximum and divided in float64 -- the same softmax --
    so a tiny temperature (1e-300 underflows to 0 in float32) sends the others to -inf
    (probability 0) instead of overflowing and turning the softmax into NaN."""
    if temperature <= 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
