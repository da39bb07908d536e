"""FLOPs of a transformer from its shapes: the one formula the planner and the trainer share.

A matmul (m, k) @ (k, n) costs 2*m*k*n FLOPs (a multiply and an add per term). Per layer and
per token (t = b*s tokens, h hidden, q = Q width, kv = K/V width, f MLP width), forward:

    Q, K, V projections   2 h (q + 2 kv)         (GQA: kv < q)
    attention output      2 q h
    MLP                   2 h f x 2 (GeLU: up, down) or x 3 (SwiGLU: gate, up, down)
    scores Q K^T, A V     2 x 2 s q              ("full" convention: every one of the s x s scores)

q = heads x head_dim, which is h except in models whose heads are wider (Gemma 7B: 4096 vs 3072).

plus the output head 2 h V per token. Backward is two matmuls of each forward one (gradient of
the input and of the weight), so a training step is 3 x forward -- the model FLOPs of PaLM's MFU
(Chowdhery et al. 2022, appendix B) and of Megatron-LM's
72 B s L h^2 (1 + s/(6h) + V/(12 L h)) (Narayanan et al. 2021, eq. 3 without recomputation).

Conventions, stated because sources differ:
- attention "full" counts all s x s scores (Megatron, PaLM, torchtitan, and what SDPA's math path
  executes); "causal" counts the half a causal kernel (flash) actually computes. MFU uses "full".
- recomputation: "full" re-runs each layer's forward (HFU counts it: Megatron's 96 B s L h^2
  form), "selective" re-runs only the attention core (scores, softmax, A V) (Korthikanti et al.
  2022), "op" is torchtitan's op-level selective checkpointing: every matmul and attention output
  is saved except every second matmul in forward order, which is re-run with all elementwise ops
  (torchtitan parallelize_llama ``_custom_policy``: "saves output of all compute ops, except every
  second mm").
- embeddings, norms, softmax and elementwise ops are not counted (negligible next to matmuls,
  and not matmul work that MFU measures).

Pure Python, no torch: ``tensorpilot.observe.flops.gpt_train_flops_formula`` delegates here, and
its unit test checks this formula against torch's FlopCounterMode.
"""

from __future__ import annotations

from typing import NamedTuple

from tensorpilot.plan.models import ModelSpec

__all__ = ["Gemm", "attention_core_flops", "forward_flops", "gpt_train_flops", "hardware_flops",
           "layer_gemms", "model_flops_per_token", "op_recomputed_gemm_flops", "recompute_flops", "train_flops"]

_ATTENTION = ("full", "causal")
RECOMPUTE_MODES = ("none", "selective", "op", "full")


class Gemm(NamedTuple):
    """One weight matmul of a layer: (m, k) activations @ (k, n) weights, per tensor-parallel rank."""

    name: str
    m: int
    k: int
    n: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n


def layer_gemms(spec: ModelSpec, tokens: int, tp: int = 1) -> list[Gemm]:
    """The weight matmuls of one block's forward on ``tokens`` rows, split Megatron-style over
    ``tp`` ranks (QKV and MLP-up by columns, output and MLP-down by rows)."""
    h, f, q, kv = spec.hidden, spec.ffn_hidden, spec.q_dim, spec.kv_dim
    up = 2 * f if spec.mlp == "swiglu" else f        # gate and up fused: (h, 2f)
    return [Gemm("qkv", tokens, h, (q + 2 * kv) // tp), Gemm("attn_out", tokens, q // tp, h),
            Gemm("mlp_up", tokens, h, up // tp), Gemm("mlp_down", tokens, f // tp, h)]


def op_recomputed_gemm_flops(spec: ModelSpec, tokens: int) -> int:
    """Forward matmul FLOPs of one block that op-level selective checkpointing re-runs: the
    2nd, 4th, ... of its unfused linears in forward order -- Q, K, V, output, then gate, up, down
    (SwiGLU) or up, down (GeLU): K, output and up (SwiGLU) or K, output and down (GeLU)."""
    h, f, q, kv = spec.hidden, spec.ffn_hidden, spec.q_dim, spec.kv_dim
    mlp = [h * f, h * f, f * h] if spec.mlp == "swiglu" else [h * f, f * h]
    linears = [h * q, h * kv, h * kv, q * h] + mlp                  # weights' k x n, forward order
    return sum(2 * tokens * w for w in linears[1::2])


def attention_core_flops(spec: ModelSpec, batch: int, seq_len: int, attention: str = "full",
                         doc_len: int | None = None) -> int:
    """Forward FLOPs of Q K^T and A V for one layer, averaged over the blocks: 2 x 2 b (query, key
    pairs) (a x head_dim, which is h unless the heads are wider). Pairs: s^2 ("causal": the half a
    causal kernel computes, s^2 / 2). A block with a sliding window w < s (spec.attention_window)
    pairs each query with its w latest keys: s w ("causal": s w - w^2 / 2, the first w queries
    seeing fewer), which is what a windowed flash kernel (FlashAttention-2's window_size) computes.
    ``doc_len``: each sequence packs documents of that many tokens under a document mask that the
    kernel skips (FlexAttention's block mask, FlashAttention's varlen): s / d documents, each with
    the pairs above at length d."""
    if attention not in _ATTENTION:
        raise ValueError(f"attention convention must be one of {_ATTENTION}, not {attention!r}")
    if doc_len and doc_len < seq_len:
        return round(attention_core_flops(spec, batch, doc_len, attention) * seq_len / doc_len)
    causal = attention == "causal"
    pairs = seq_len * seq_len / 2 if causal else seq_len * seq_len
    w = spec.attention_window
    if w and w < seq_len:
        windowed = seq_len * w - w * w / 2 if causal else seq_len * w
        share = spec.windowed_layers / spec.layers
        pairs = (1 - share) * pairs + share * windowed
    return round(2 * 2 * batch * pairs * spec.q_dim)


def head_flops(spec: ModelSpec, tokens: int) -> int:
    """Forward FLOPs of the output projection to the vocabulary (0 without an LM head)."""
    return 2 * tokens * spec.hidden * spec.vocab if spec.lm_head else 0


def forward_flops(spec: ModelSpec, batch: int, seq_len: int, attention: str = "full") -> int:
    """Forward matmul FLOPs of ``batch`` sequences of ``seq_len`` tokens."""
    tokens = batch * seq_len
    per_layer = sum(g.flops for g in layer_gemms(spec, tokens)) + attention_core_flops(spec, batch, seq_len, attention)
    return spec.layers * per_layer + head_flops(spec, tokens)


def train_flops(spec: ModelSpec, batch: int, seq_len: int, attention: str = "full") -> int:
    """Model FLOPs of one training step (forward + backward = 3 x forward), no recomputation."""
    return 3 * forward_flops(spec, batch, seq_len, attention)


def recompute_flops(spec: ModelSpec, batch: int, seq_len: int, recompute: str, attention: str = "full",
                    share: float = 1.0) -> float:
    """Extra forward FLOPs that activation recomputation executes in the backward pass; ``share``:
    under full recomputation, the share of blocks that recompute (Megatron's block method)."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, not {recompute!r}")
    if recompute == "none":
        return 0
    core = attention_core_flops(spec, batch, seq_len, attention)
    if recompute == "selective":
        return spec.layers * core
    tokens = batch * seq_len
    if recompute == "op":
        return spec.layers * op_recomputed_gemm_flops(spec, tokens)
    return share * spec.layers * (sum(g.flops for g in layer_gemms(spec, tokens)) + core)


def hardware_flops(spec: ModelSpec, batch: int, seq_len: int, recompute: str = "none",
                   attention: str = "full", share: float = 1.0) -> float:
    """FLOPs the hardware executes (the numerator of HFU): model FLOPs + recomputation."""
    return train_flops(spec, batch, seq_len, attention) + recompute_flops(spec, batch, seq_len, recompute, attention,
                                                                          share)


def model_flops_per_token(spec: ModelSpec, seq_len: int, attention: str = "full") -> float:
    """Training model FLOPs per token, ~ 6 N + 12 L h s (the usual '6N' plus attention)."""
    return train_flops(spec, 1, seq_len, attention) / seq_len


def gpt_train_flops(*, batch: int, seq_len: int, n_layer: int, d_model: int, vocab: int) -> int:
    """Training FLOPs of the built-in gpt (4h GeLU MLP, multi-head attention, full-attention
    convention: what SDPA's math path computes and torch's FlopCounterMode counts)."""
    spec = ModelSpec(name="gpt", hidden=d_model, layers=n_layer, heads=1, vocab=vocab, ffn_hidden=4 * d_model)
    return train_flops(spec, batch, seq_len, "full")
