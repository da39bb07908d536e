"""Memory per device of a training step, component by component. Pure functions of shapes.

Model states (Rajbhandari et al. 2020, ZeRO, section 3.1): mixed-precision Adam keeps per
parameter 2 bytes (half weights) + 2 (half grads) + 4 (fp32 master) + 8 (fp32 Adam m, v) = 16;
ZeRO stage 1 shards master + optimizer over data-parallel ranks, stage 2 also the grads, stage 3
(= FSDP full sharding) also the weights.

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", section 4): per layer and micro-batch, s b h (34 + 5 a s / h) bytes in half precision
with dropout; tensor parallelism t divides all but 10 s b h (norm inputs and dropout masks),
sequence parallelism divides those too; selective recomputation drops the 5 a s^2 b term;
full recomputation keeps only each layer's 2 s b h input. Here the 34 is built from the stored
tensors (:func:`layer_activation_bytes`), so SwiGLU, GQA, no-dropout models and flash attention
(which stores the output and a row log-sum-exp instead of the s x s probabilities) follow from
the same list. Pipelines: 1F1B keeps p micro-batches in flight on the first stage (GPipe: all
m); the interleaved schedule multiplies by 1 + (p - 1) / (p v) (Korthikanti, section 4.2.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tensorpilot.errors import ConfigError
from tensorpilot.plan import calibration as cal
from tensorpilot.plan.models import ModelSpec

__all__ = ["DTYPE_BYTES", "Precision", "activation_bytes_per_device", "layer_activation_bytes",
           "model_state_bytes", "precision", "weights_bytes", "kv_cache_bytes"]

# One table of dtype sizes.
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


@dataclass(frozen=True, slots=True)
class Precision:
    """What a precision recipe stores per parameter and computes in."""

    name: str
    compute: str             # catalog dtype of the matmuls: fp32, tf32, bf16, fp16, fp8
    param_bytes: float       # weights as the model holds them
    grad_bytes: float        # gradients as accumulated
    master_bytes: float      # separate fp32 copy of the weights (0 when params are fp32 already)
    optim_bytes: float       # optimizer state per parameter (Adam: m and v)
    act_bytes: float         # saved activations per element
    weight_copy_bytes: float  # half-precision weight copies autocast caches during forward


PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "bf16-amp", "fp16-amp", "bf16-pure", "fp8")

# Optimizer state per parameter, in bytes (fp32 states):
#   adam/adamw  m and v: 2 x 4
#   sgd         momentum: 4
#   adamw8bit   m and v in 8 bits with one fp32 scale per block of 256 (Dettmers et al. 2022,
#               "8-bit Optimizers via Block-wise Quantization"; torchao's block size): 2 x (1 + 4/256)
#   adafactor   factored second moment (Shazeer & Stern 2018): a rows + columns fp32 vector per
#               (r, c) matrix, 4 (r + c) / (r c) bytes per parameter -- 0.05 for 160 x 160, less
#               for larger matrices; no first moment. Vectors keep a full fp32 second moment, a
#               negligible share of a model's parameters.
OPTIMIZER_STATE_BYTES = {"adam": 8.0, "adamw": 8.0, "sgd": 4.0, "adamw8bit": 2 * (1 + 4 / 256), "adafactor": 0.05}


def precision(name: str, optimizer: str = "adam") -> Precision:
    """Recipes: 'fp32'/'tf32' (all fp32), 'bf16'/'fp16' (half weights and grads + fp32 master and
    Adam: Megatron, DeepSpeed), 'bf16-amp'/'fp16-amp' (torch.autocast: fp32 weights, grads and
    Adam; half compute), 'bf16-pure' (everything bf16, Adam states too), 'fp8' (fp8 matmuls,
    bf16 weights with fp32 master, as Transformer Engine)."""
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZER_STATE_BYTES)}, not {optimizer!r}.")
    st = OPTIMIZER_STATE_BYTES[optimizer]
    if name in ("fp32", "tf32"):
        return Precision(name, name, 4, 4, 0, st, 4, 0)
    if name in ("bf16", "fp16"):
        return Precision(name, name, 2, 2, 4, st, 2, 0)
    if name in ("bf16-amp", "fp16-amp"):
        return Precision(name, name[:4], 4, 4, 0, st, 2, 2)
    if name == "bf16-pure":    # states kept in bf16 too: half of fp32 ones (8-bit ones stay 8-bit)
        return Precision(name, "bf16", 2, 2, 0, st / 2 if optimizer in ("adam", "adamw", "sgd") else st, 2, 0)
    if name == "fp8":
        return Precision(name, "fp8", 2, 2, 4, st, 2, 1)
    raise ConfigError(f"unknown precision {name!r}; use one of {', '.join(PRECISIONS)}.")


def weights_bytes(n_params: float, dtype: str) -> float:
    """Bytes of ``n_params`` weights stored in ``dtype`` (7e9 in bf16 -> 14e9)."""
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}.")
    return n_params * DTYPE_BYTES[dtype]


def model_state_bytes(n_params: float, prec: Precision, *, zero_stage: int = 0, dp: int = 1) -> dict[str, float]:
    """Weights, grads, fp32 master and optimizer state of ``n_params`` parameters on one device,
    with ZeRO stage 0-3 sharding over ``dp`` data-parallel ranks."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0-3, not {zero_stage}")
    shard = lambda stage: dp if zero_stage >= stage else 1   # noqa: E731 - reads as the ZeRO table
    return {"params": n_params * prec.param_bytes / shard(3),
            "grads": n_params * prec.grad_bytes / shard(2),
            "master_params": n_params * prec.master_bytes / shard(1),
            "optimizer": n_params * prec.optim_bytes / shard(1)}


def layer_activation_bytes(spec: ModelSpec, *, seq_len: int, micro_batch: int, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           attention: str = "flash", act_bytes: float = 2) -> float:
    """Bytes one block keeps for its backward, per device, for one micro-batch.

    Stored tensors per token, e = act_bytes (Korthikanti's GPT case gives 34 s b h at e = 2):
      replicated under TP unless sequence-parallel: norm-1 input h, QKV input h, norm-2 input h,
        MLP input h (e each); dropout masks after attention and MLP, h each (1 byte);
      split by TP: Q h, K kv, V kv, attention output h (each h is a x head_dim, = h usually), MLP: GeLU input f + down input f
        (SwiGLU: gate, up and their product, 3f);
      attention core: materialised -> softmax output a s (e) + dropout mask a s (1) + dropout
        output a s (e); flash -> a row log-sum-exp (4 bytes per head).
    """
    h, f, q, kv, a = spec.hidden, spec.ffn_hidden, spec.q_dim, spec.kv_dim, spec.heads
    tokens = seq_len * micro_batch
    sp_div = tp if sequence_parallel else 1
    if recompute == "full":                     # only the block's input survives
        return tokens * h * act_bytes / sp_div
    e = act_bytes
    mask = 1 if spec.dropout else 0
    replicated = 4 * h * e + 2 * h * mask
    mlp = (3 if spec.mlp == "swiglu" else 2) * f * e
    split = (q + kv + kv + q) * e + mlp
    if attention == "flash":
        core = 4 * a
    else:
        core = a * seq_len * (e + (mask + e if spec.dropout else 0))
        if recompute == "selective":
            core = 0
    per_token = replicated / sp_div + split / tp + core / tp
    return tokens * per_token


def _in_flight(schedule: str, pp: int, n_micro: int, virtual_stages: int) -> float:
    """Micro-batches whose activations the busiest (first) stage holds at once, in units of one
    micro-batch through that stage's layers."""
    if pp == 1:
        return 1
    if schedule == "gpipe":
        return n_micro
    held = min(pp, n_micro)
    if schedule == "interleaved" and virtual_stages > 1:
        return held * (1 + (pp - 1) / (pp * virtual_stages))
    return held


def activation_bytes_per_device(spec: ModelSpec, *, seq_len: int, micro_batch: int, n_micro: int,
                                tp: int = 1, pp: int = 1, sequence_parallel: bool = False,
                                recompute: str = "none", attention: str = "flash", act_bytes: float = 2,
                                schedule: str = "1f1b", virtual_stages: int = 1) -> dict[str, float]:
    """Activation bytes of the busiest pipeline stage: the stored block activations of all
    in-flight micro-batches, plus the working set of one block being recomputed / differentiated,
    plus the output logits and loss of one micro-batch (on the last stage; with pp = 1 the same
    device). Returns {"activations": ..., "logits": ...}."""
    layers_per_stage = math.ceil(spec.layers / pp)
    kw = dict(seq_len=seq_len, micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel,
              attention=attention, act_bytes=act_bytes)
    per_layer = layer_activation_bytes(spec, recompute=recompute, **kw)
    stored = per_layer * layers_per_stage * _in_flight(schedule, pp, n_micro, virtual_stages)
    # backward of a recomputed block rebuilds its full activations; without recomputation the
    # gradient of the block being differentiated is the extra working set (~ one block's inputs)
    # (selective recomputation rebuilds only the attention core of one block: small next to it)
    working = layer_activation_bytes(spec, recompute="none", **kw) if recompute == "full" \
        else 2 * seq_len * micro_batch * spec.hidden * act_bytes / (tp if sequence_parallel else 1)
    tokens = seq_len * micro_batch
    logits = 0.0
    if spec.lm_head:
        # logits (e) + their fp32 copy for the loss + its gradient (fp32), split over TP (vocab
        # parallel); the final-norm input e*h. Held at the end of forward on the last stage.
        logits = tokens * (spec.vocab / tp * (act_bytes + 4 + 4) + spec.hidden * act_bytes)
    return {"activations": stored + working, "logits": logits}


def kv_cache_bytes(spec: ModelSpec, *, batch: int, context: int, dtype_bytes: float = 2) -> float:
    """Keys and values of every layer for ``batch`` sequences of ``context`` tokens:
    2 (K and V) x L x kv_heads x head_dim x context x batch x bytes."""
    return 2 * spec.layers * spec.kv_dim * context * batch * dtype_bytes
