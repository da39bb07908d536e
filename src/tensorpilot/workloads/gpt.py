"""A decoder-only transformer (GPT-2 style): pre-LayerNorm blocks, causal attention through
``scaled_dot_product_attention`` (flash/efficient kernels) or, on CPUs, blocked plain matmuls
(``math_attention``), exact-GeLU MLP, learned positions, optionally tied head. Shapes: B batch,
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


# Largest attention-score tensor (B x H x T x T elements) the "math" path materialises; above
# it the fused SDPA kernels are used regardless (2**28 bf16 scores + fp32 softmax ~ 1.5 GiB).
MATH_ATTENTION_MAX_SCORES = 2**28


# Query rows per block of math_attention: small enough for a block's scores to stay in cache,
# large enough for efficient matmuls; smaller blocks skip more of the masked half but run more,
# smaller matmuls (benchmarks/cpu_kernels.py compares block sizes and SDPA's CPU kernel).
ATTENTION_QUERY_BLOCK = 128


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
                   block: int = ATTENTION_QUERY_BLOCK) -> torch.Tensor:
    """Causal attention with the scores materialised by plain matmuls: (B, H, T, D) -> (B, H, T, D).

    The queries go in blocks of ``block`` rows; block [s, e) attends to keys [0, e) only, so the
    fully masked upper triangle right of the diagonal block is never computed (about
    (n-1)/(2n) of the scores for n blocks), and each block's (B, H, block, e) scores stay small
    enough to be reused from cache between the matmul, softmax and matmul. The mask is an additive
    (e-s, e) bias of 0 / -inf built from index comparisons and added in place to the fresh scores
    (the matmul saves its inputs, not its output, so in place is safe for autograd; its backward
    is the identity): no masked copy of the scores forward and no masking kernel backward, which
    ``masked_fill`` costs (benchmarks/cpu_kernels.py). Under inductor the bias is computed
    in-register. The scale goes on the queries (D columns, not e). Softmax stays in the input
    dtype: PyTorch's CPU kernel and inductor both sum the exponentials in fp32 for bf16/fp16
    inputs. Against an fp64 reference the output error equals an explicit fp32 softmax's, dq's is
    ~1.5x larger, all within 2x of fused SDPA's (tests/unit/test_engine.py); in exchange, no casts.
    See CausalSelfAttention.attention_impl."""
    T = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    rows = torch.arange(T, device=q.device)
    outs = []
    for s in range(0, T, block):
        e = min(s + block, T)
        att = (q[:, :, s:e] * scale) @ k[:, :, :e].transpose(-2, -1)           # (B, H, e-s, e)
        future = rows[None, :e] > rows[s:e, None]                              # (e-s, e) key after query
        bias = torch.zeros(future.shape, dtype=att.dtype, device=att.device).masked_fill_(future, float("-inf"))
        att = torch.softmax(att.add_(bias), dim=-1)                            # fp32 sums inside
        if dropout_p:
            att = F.dropout(att, dropout_p)
        outs.append(att @ v[:, :, :e])                                         # (B, H, e-s, D)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


class CausalSelfAttention(nn.Module):
    # "sdpa": F.scaled_dot_product_attention (flash / memory-efficient kernels: the default, and
    # the right choice on GPUs). "math": math_attention, chosen by the engine on CPUs
    # (engine.choose_attention), where PyTorch's CPU flash kernel is slow at head_dim 64 and the
    # blocked matmuls are faster eager and fuse under inductor.
    attention_impl = "sdpa"

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
        if self.attention_impl == "math" and q.shape[0] * q.shape[1] * T * T <= MATH_ATTENTION_MAX_SCORES:
            y = math_attention(q, k, v, p)                          # (B, H, T, D)
        else:
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
