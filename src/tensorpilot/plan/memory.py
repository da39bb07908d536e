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
from tensorpilot.plan.timing import FUSED_ATTENTION

__all__ = ["DTYPE_BYTES", "GRAD_DTYPES", "OPTIMIZER_STATE_BYTES", "PRECISION_LABELS", "Precision", "activation_bytes_per_device",
           "layer_activation_bytes", "model_state_bytes", "optimizer_state_bytes", "precision",
           "precision_from_label", "weights_bytes", "kv_cache_bytes"]

# One table of dtype sizes.
# NVFP4: 4-bit E2M1 values with one E4M3 scale per 16 (and an fp32 scale per tensor): 0.5 + 1/16
# bytes an element (NVIDIA, Pretraining Large Language Models with NVFP4, arXiv 2509.25149, sec. 2)
NVFP4_BYTES = 0.5 + 1 / 16
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": NVFP4_BYTES, "int8": 1, "int4": 0.5}


@dataclass(frozen=True, slots=True)
class Precision:
    """What a precision recipe stores per parameter and computes in."""

    name: str
    compute: str             # catalog dtype of the matmuls: fp32, tf32, bf16, fp16, fp8, fp4
    param_bytes: float       # weights as the model holds them
    grad_bytes: float        # gradients as accumulated
    master_bytes: float      # separate fp32 copy of the weights (0 when params are fp32 already)
    optim_bytes: float       # optimizer state per parameter (Adam: m and v)
    act_bytes: float         # saved activations per element
    weight_copy_bytes: float  # low-precision weight copies cached during forward (autocast: half; fp8: + transpose)
    gemm_input_bytes: float = 0  # saved inputs of the weight GEMMs per element (fp8: 1); 0 = act_bytes

    @property
    def autocast(self) -> bool:
        """fp32 weights under torch.autocast (the *-amp recipes): the residual stream stays fp32."""
        return self.name in ("bf16-amp", "fp16-amp")


PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "bf16-amp", "fp16-amp", "bf16-pure", "fp16-pure", "fp8", "fp4")
# recipes whose block GEMMs run in a scaled low-precision format (the rest of the step stays bf16)
LOW_PRECISION_GEMMS = ("fp8", "fp4")
# dtypes gradients can be accumulated and reduced in, whatever the recipe's default (precision())
GRAD_DTYPES = ("fp32", "bf16", "fp16")
# how the language-model loss holds its logits: whole (the output GEMM, then the loss on all the
# logits at once); chunked (torchtune's CEWithChunkedOutputLoss: the logits whole in the
# activation dtype, upcast to fp32 and differentiated one of LOSS_CHUNKS chunks at a time); fused
# (Liger-Kernel's fused linear cross-entropy, arXiv 2410.10989 sec. 3.2, or Cut Cross-Entropy,
# arXiv 2411.09009: the output GEMM and the loss run over chunks of tokens, each chunk's logits
# V / h times smaller than the hidden states it came from, so they never exist whole); compiled
# (the loss under torch.compile with the model, as nanoGPT, torchtitan's compiled loss, torchtune
# and Hugging Face models that compute their own loss run it: Inductor fuses the fp32 upcast,
# log-softmax and its gradient into reductions over the logits in the activation dtype, and the
# partitioner saves the logits rather than an fp32 copy -- the logits and their gradient, e each)
LOSS_KERNELS = ("whole", "chunked", "fused", "compiled")
LOSS_CHUNKS = 8           # torchtune's num_output_chunks

# Optimizer state per parameter, in bytes (fp32 states unless the name says otherwise):
#   adam/adamw  m and v: 2 x 4
#   adamw-bf16  m and v kept in bf16 (torchao's AdamW(bf16 states), LLaMA-Factory's pure-bf16): 2 x 2
#   sgd         momentum: 4
#   sgd-plain   SGD without momentum (torch.optim.SGD's default momentum=0; LOMO's fused update):
#               no state
#   adamw8bit   m and v in 8 bits with one fp32 scale per block (Dettmers et al. 2022, "8-bit
#               Optimizers via Block-wise Quantization", section 2.1; the paper's bitsandbytes uses
#               blocks of 2048, torchao's AdamW8bit -- what `tensorpilot train` runs -- 256):
#               2 x (1 + 4/256) = 2.03
#   adafactor   factored second moment (Shazeer & Stern 2018, section 3): one fp32 row vector and
#               one column vector per (r, c) matrix, 4 (r + c) bytes, and no first moment (the
#               paper's and Hugging Face's default beta1 = None); vectors keep a full fp32 second
#               moment. Per parameter it depends on the shapes (:func:`optimizer_state_bytes`);
#               0.05 below is a 160 x 160 matrix, the figure used where no shapes are known.
#   muon        Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks";
#               Liu et al. 2025, "Muon is Scalable for LLM Training", arXiv 2502.16982): one momentum
#               buffer (4) on each block matrix, orthogonalised by Newton-Schulz iterations
#               (predict.MUON_NS_STEPS); AdamW (8) on the embeddings, the output head and every
#               vector. 4 below where no shapes are known (block matrices hold most parameters).
#   lamb        LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning: Training BERT in
#               76 minutes", Algorithm 2): Adam's m and v (2 x 4) and a trust ratio per tensor from
#               two norms, no further state
#   lion        Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", arXiv
#               2302.06675, Algorithm 1): the momentum only, 4
#   adam-mini   Adam-mini (Zhang et al. 2024, "Adam-mini: Use Fewer Learning Rates To Gain More",
#               arXiv 2406.16793; its package from 1.1.0): Adam's m, 4, and one fp32 v per block of
#               the Hessian's structure (a query or key head, an output neuron, a token's embedding
#               row), well under 1% of the parameters and not counted: half of AdamW's states, the
#               "50% memory over Adam" its README states
#   none        no optimizer step at all: a benchmark of forward and backward only (Hugging Face's
#               SDPA training benchmarks), or an update fused into backward without state (LOMO)
OPTIMIZER_STATE_BYTES = {"adam": 8.0, "adamw": 8.0, "adamw-bf16": 4.0, "sgd": 4.0, "sgd-plain": 0.0,
                         "adamw8bit": 2 * (1 + 4 / 256), "adafactor": 0.05, "muon": 4.0, "lamb": 8.0, "lion": 4.0,
                         "adam-mini": 4.0, "none": 0.0}

# Precision labels as papers, configs and framework docs write them (lower-cased, only letters
# and digits kept) -> recipe. 'bf16' alone is torchtitan's FSDP2 mixed precision (bf16 compute,
# fp32 sharded params and reductions: autocast-like); Megatron/DeepSpeed "mixed" keeps half
# weights with an fp32 master; Lightning's "bf16-true" and "pure bf16" keep no fp32 copy; fp8
# recipes differ in scaling (delayed, current, block-wise, MX) but store and compute alike here.
PRECISION_LABELS = {
    **{k: "fp32" for k in ("fp32", "float32", "single", "full", "fullprecision", "fp32full", "32", "32true")},
    **{k: "tf32" for k in ("tf32", "fp32tf32", "tensorfloat32")},
    **{k: "fp16" for k in ("fp16", "fp16mixed", "mixedfp16", "fp16mixedprecision", "mixedprecisionfp16", "half",
                           "fp16master", "apexo2", "o2")},
    **{k: "bf16" for k in ("bf16mixed", "mixedbf16", "bf16mixedprecision", "mixedprecisionbf16", "bf16master",
                           "bf16fp32master", "bf16withfp32master")},
    **{k: "fp16-amp" for k in ("amp", "torchamp", "nativeamp", "autocast", "torchautocast", "fp16amp", "ampfp16", "fp16autocast",
                               "fp16mixedadamw", "16", "16mixed", "ampo1", "o1", "mixedprecision")},
    **{k: "bf16-amp" for k in ("bf16", "bfloat16", "bf16amp", "ampbf16", "bf16autocast", "bf16mixedautocast",
                               "16bf16mixed", "bf16fsdp2", "bf16fsdpmixedprecision")},
    **{k: "bf16-pure" for k in ("bf16pure", "purebf16", "bf16true", "bf16only", "bf16nomaster", "bf16full")},
    **{k: "fp16-pure" for k in ("fp16pure", "purefp16", "fp16true", "16true", "fp16only", "fp16nomaster",
                                "fp16full")},
    **{k: "fp8" for k in ("fp8", "float8", "fp8mixed", "fp8hybrid", "fp8te", "fp8transformerengine", "fp8delayed",
                          "fp8delayedscaling", "fp8currentscaling", "fp8tensorwise", "fp8rowwise", "fp8blockwise",
                          "mxfp8", "fp8bf16", "fp8e4m3", "fp8torchao", "torchaofloat8", "fp8mixedprecision")},
    **{k: "fp4" for k in ("fp4", "nvfp4", "mxfp4", "fp4e2m1", "nvfp4blockscaling", "fp4mixed", "nvfp4mixed")},
}
# substrings tried in order when a label is not known whole ("FP16 mixed with AdamW" -> fp16-amp)
_PRECISION_NEEDLES = (("fp4", "fp4"), ("fp8", "fp8"), ("float8", "fp8"), ("fp16 mixed adamw", "fp16-amp"),
                      ("bf16 amp", "bf16-amp"), ("bf16 pure", "bf16-pure"), ("fp16 pure", "fp16-pure"),
                      ("fp16 mixed", "fp16"),
                      ("bf16 mixed", "bf16"), ("tf32", "tf32"), ("fp32", "fp32"), ("bf16", "bf16-amp"),
                      ("fp16", "fp16"))


def precision_from_label(text: str) -> str:
    """A published or user-written precision label -> a recipe of :data:`PRECISIONS`:
    'FP16 mixed' -> 'fp16', 'AMP' -> 'fp16-amp', 'bf16-true' -> 'bf16-pure', 'FP8 (TE)' -> 'fp8'.
    Unknown -> ConfigError naming the label."""
    import re

    key = re.sub(r"[^a-z0-9]", "", text.lower())
    if key in PRECISION_LABELS or text.strip() in PRECISIONS:
        return PRECISION_LABELS.get(key, text.strip())
    low = " ".join(re.sub(r"[^a-z0-9]", " ", text.lower()).split())
    # "fp16 weights + fp32 Adam state": an fp32 master, optimizer state or accumulation is part
    # of every half recipe, not the compute dtype
    low = re.sub(r"\bfp32 (master|adam|optimi[sz]er|states?|grad\w*|accumulation|copy|weights? copy)\b", "", low)
    for needle, name in _PRECISION_NEEDLES:
        if needle in low:
            return name
    raise ConfigError(f"unknown precision label {text.strip()[:60]!r}: use one of {', '.join(PRECISIONS)} "
                      "(docs/planner.md lists the synonyms read)")


def optimizer_state_bytes(optimizer: str, n_params: float, matrices: list[tuple[int, int, int]] = ()) -> float:
    """Bytes of optimizer state for ``n_params`` parameters. ``matrices``: (rows, cols, count) of
    the 2-D weights among them the optimizer treats as matrices; Adafactor (factored moments: 4
    (r + c) bytes per matrix, 4 bytes per element of everything else) and Muon (the block matrices:
    one 4-byte momentum, everything else AdamW's 8) need them. Without them both take the
    per-parameter figure of :data:`OPTIMIZER_STATE_BYTES`."""
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZER_STATE_BYTES)}, not {optimizer!r}.")
    if optimizer not in ("adafactor", "muon") or not matrices:
        return n_params * OPTIMIZER_STATE_BYTES[optimizer]
    in_matrices = sum(r * c * k for r, c, k in matrices)
    if optimizer == "muon":
        return 4.0 * in_matrices + OPTIMIZER_STATE_BYTES["adamw"] * max(0.0, n_params - in_matrices)
    return 4.0 * sum((r + c) * k for r, c, k in matrices) + 4.0 * max(0.0, n_params - in_matrices)


def precision(name: str, optimizer: str = "adam", state_bytes_per_param: float | None = None,
              grad_dtype: str | None = None) -> Precision:
    """Recipes: 'fp32'/'tf32' (all fp32), 'bf16'/'fp16' (half weights + fp32 master and Adam,
    Megatron and DeepSpeed; bf16 with fp32 gradients, fp16 with half ones), 'bf16-amp'/'fp16-amp'
    (torch.autocast: fp32 weights, grads and Adam; half compute), 'bf16-pure'/'fp16-pure' (everything
    in the half dtype, Adam states too: Lightning's "bf16-true"/"16-true", a model cast with
    .half()), 'fp8' (Transformer Engine's recipe: bf16 weights with an fp32 master, fp8
    GEMMs, each block weight cached in fp8 with its transpose -- Hopper's fp8 GEMM takes only the
    TN layout --, GEMM inputs saved for backward in fp8; attention, norms and communication in
    bf16; fp32 gradients as under bf16), 'fp4' (the NVFP4 recipe, NVIDIA arXiv 2509.25149 and
    Transformer Engine's NVFP4BlockScaling: the same with block GEMMs in NVFP4 -- each weight cached
    with its 16 x 16-block-scaled transpose, GEMM inputs saved in NVFP4, NVFP4_BYTES an element).
    ``state_bytes_per_param`` overrides the optimizer's table figure (Adafactor from the model's
    shapes); ``grad_dtype`` the dtype gradients are accumulated and reduced in (Megatron's
    --grad-reduce-in-bf16, NeMo's grad_reduce_in_fp32=False)."""
    if grad_dtype is not None:
        if grad_dtype not in GRAD_DTYPES:
            raise ConfigError(f"grad_dtype must be one of {', '.join(GRAD_DTYPES)}, not {grad_dtype!r}.")
        from dataclasses import replace

        return replace(precision(name, optimizer, state_bytes_per_param), grad_bytes=DTYPE_BYTES[grad_dtype])
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZER_STATE_BYTES)}, not {optimizer!r}.")
    st = OPTIMIZER_STATE_BYTES[optimizer] if state_bytes_per_param is None else state_bytes_per_param
    if name in ("fp32", "tf32"):
        return Precision(name, name, 4, 4, 0, st, 4, 0)
    if name == "bf16":
        # Megatron-LM's --bf16 accumulates and reduces gradients in fp32 (arguments.py sets
        # accumulate_allreduce_grads_in_fp32 for bf16: "bfloat16 requires gradient accumulation
        # and all-reduce to be done in fp32"): 2 + 4 + (4 + 8) / d bytes a parameter with the
        # distributed optimizer, its docs' "6 + 12/d" (docs/source/distrib_optimizer.md)
        return Precision(name, name, 2, 4, 4, st, 2, 0)
    if name == "fp16":          # fp16 gradients, fp32 master: ZeRO's 2 + 2 + 12 (Rajbhandari et al., sec. 3.1)
        return Precision(name, name, 2, 2, 4, st, 2, 0)
    if name in ("bf16-amp", "fp16-amp"):
        return Precision(name, name[:4], 4, 4, 0, st, 2, 2)
    if name in ("bf16-pure", "fp16-pure"):   # states kept in half too: half of fp32 ones (8-bit and bf16 ones stay)
        halved = optimizer in ("adam", "adamw", "sgd", "muon", "lamb", "lion", "adam-mini")
        return Precision(name, name[:4], 2, 2, 0, st / 2 if halved else st, 2, 0)
    if name == "fp8":
        return Precision(name, "fp8", 2, 4, 4, st, 2, 2, gemm_input_bytes=1)
    if name == "fp4":
        return Precision(name, "fp4", 2, 4, 4, st, 2, 2 * NVFP4_BYTES, gemm_input_bytes=NVFP4_BYTES)
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
                           attention: str = "flash", act_bytes: float = 2,
                           gemm_input_bytes: float = 0) -> float:
    """Bytes one block keeps for its backward, per device, for one micro-batch.

    Stored tensors per token, e = act_bytes (Korthikanti's GPT case gives 34 s b h at e = 2):
      replicated under TP unless sequence-parallel: norm-1 input h, QKV input h, norm-2 input h,
        MLP input h (e each); dropout masks after attention and MLP, h each (1 byte);
      split by TP: Q h, K kv, V kv, attention output h (each h is a x head_dim, = h usually), MLP: GeLU input f + down input f
        (SwiGLU: gate, up and their product, 3f);
      attention core: materialised -> softmax output a s (e) + dropout mask a s (1) + dropout
        output a s (e); flash -> a row log-sum-exp (4 bytes per head).
    ``gemm_input_bytes`` (fp8 recipes: 1) replaces e for the tensors saved as the inputs of the
    four weight GEMMs: QKV input h, MLP input h, attention output q, down-projection input f.
    """
    h, f, q, kv, a = spec.hidden, spec.ffn_hidden, spec.q_dim, spec.kv_dim, spec.heads
    tokens = seq_len * micro_batch
    sp_div = tp if sequence_parallel else 1
    if recompute == "full":                     # only the block's input survives
        return tokens * h * act_bytes / sp_div
    e = act_bytes
    if recompute == "op":
        # torchtitan's op-level SAC keeps the block's input, the outputs of the 1st, 3rd, ...
        # linears (Q, V, gate / up, down: flops.op_recomputed_gemm_flops) and the attention
        # output with its log-sum-exp; everything else is re-run in backward
        mlp_saved = f + h if spec.mlp == "swiglu" else f
        return tokens * ((h / sp_div) * e + (q + kv + q + mlp_saved) * e / tp + 4 * a / tp)
    g = gemm_input_bytes or e
    mask = 1 if spec.dropout else 0
    replicated = 2 * h * e + 2 * h * g + 2 * h * mask
    mlp = (2 if spec.mlp == "swiglu" else 1) * f * e + f * g
    split = (q + kv + kv) * e + q * g + mlp
    if attention in FUSED_ATTENTION:         # the output's log-sum-exp, fp32
        core = 4 * a
    else:
        core = a * seq_len * (e + (mask + e if spec.dropout else 0))
        if recompute == "selective":
            core = 0
    per_token = replicated / sp_div + split / tp + core / tp
    return tokens * per_token


def stage_layers(layers: int, pp: int, virtual_stages: int = 1) -> tuple[int, int, int]:
    """Transformer blocks on the first, a middle and the last of ``pp`` pipeline stages.

    Blocks that divide into the pp x v model chunks split evenly (the output layer rides on the
    last stage). Where they do not but blocks + 2 do, the embedding and the output layer each
    take one block's place: the first and last stages hold a block fewer (Megatron-LM's
    --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split, which
    NeMo's recipes set for Llama 3.1 405B's 126 blocks over 16 x 8 chunks; torchtitan's
    pipeline split weighs the embedding and the output as a block each the same way).
    Otherwise the busiest stage holds ceil(blocks / pp)."""
    if pp <= 1:
        return layers, layers, layers
    chunks = pp * max(1, virtual_stages)
    if layers % chunks and not (layers + 2) % chunks:
        per = (layers + 2) // pp
        return per - 1, per if pp > 2 else per - 1, per - 1
    per = math.ceil(layers / pp)
    return per, per, per


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
                                schedule: str = "1f1b", virtual_stages: int = 1,
                                gemm_input_bytes: float = 0, recompute_share: float = 1.0,
                                loss_kernel: str = "whole") -> dict[str, float]:
    """Activation bytes of the busiest pipeline stage: the stored block activations of all
    in-flight micro-batches, plus the working set of one block being recomputed / differentiated,
    plus the output logits and loss of one micro-batch (on the last stage; with pp = 1 the same
    device). ``recompute_share``: under full recomputation, the share of blocks that recompute
    (the others keep everything, Megatron's block method). Returns {"activations": ..., "logits": ...,
    "last_stage_activations": ...}: with a pipeline the last stage holds the logits but the fewest
    micro-batches, so it is the busiest only when the output layer outweighs them."""
    first, middle, last = stage_layers(spec.layers, pp, virtual_stages if schedule == "interleaved" else 1)
    kw = dict(seq_len=seq_len, micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel,
              attention=attention, act_bytes=act_bytes)
    per_layer = layer_activation_bytes(spec, recompute=recompute, gemm_input_bytes=gemm_input_bytes, **kw)
    if recompute == "full" and recompute_share < 1:
        kept = layer_activation_bytes(spec, recompute="none", gemm_input_bytes=gemm_input_bytes, **kw)
        per_layer = recompute_share * per_layer + (1 - recompute_share) * kept
    in_flight = _in_flight(schedule, pp, n_micro, virtual_stages)
    stored = per_layer * first * in_flight
    if middle > first and schedule != "gpipe":
        # a first stage a block short: the second holds a block more and, under 1F1B, one
        # micro-batch fewer in flight (interleaved: two model chunks fewer; Megatron's warm-up
        # count, 2 (pp - rank - 1) + (v - 1) pp chunks)
        v = virtual_stages if schedule == "interleaved" else 1
        second = in_flight - (1 if v == 1 else 2 / v) if n_micro >= pp else in_flight
        stored = max(stored, per_layer * middle * second)
    # backward of a recomputed block rebuilds its full activations; without recomputation the
    # gradient of the block being differentiated is the extra working set (~ one block's inputs)
    # (selective recomputation rebuilds only the attention core of one block: small next to it)
    working = layer_activation_bytes(spec, recompute="none", **kw) if recompute in ("full", "op") \
        else 2 * seq_len * micro_batch * spec.hidden * act_bytes / (tp if sequence_parallel else 1)
    tokens = seq_len * micro_batch
    logits = 0.0
    if spec.lm_head:
        # logits (e) + their fp32 copy for the loss + its gradient (fp32), split over TP (vocab
        # parallel); the final-norm input e*h. Held at the end of forward on the last stage.
        # Chunked: the fp32 copy and its gradient of one chunk. Compiled: the logits' gradient in
        # e, no fp32 copy. Fused: one chunk of about
        # tokens x h / V rows, i.e. tokens x h logits of e + 4 + 4 bytes, and the gradient of the
        # hidden states (e) the fused kernel computes in its forward (LOSS_KERNELS).
        upcast = 4 + 4
        if loss_kernel == "fused":      # + the output weight's gradient, accumulated in fp32
            logits = tokens * spec.hidden * (act_bytes + upcast + act_bytes + act_bytes) + \
                spec.vocab / tp * spec.hidden * 4
        elif loss_kernel == "compiled":
            logits = tokens * (spec.vocab / tp * (act_bytes + act_bytes) + spec.hidden * act_bytes)
        else:
            share = 1 / LOSS_CHUNKS if loss_kernel == "chunked" else 1.0
            logits = tokens * (spec.vocab / tp * (act_bytes + share * upcast) + spec.hidden * act_bytes)
    # the last stage holds the fewest micro-batches: one under 1F1B, Megatron's interleaved
    # warm-up of (v - 1) pp + 1 model chunks, every one under GPipe
    v = virtual_stages if schedule == "interleaved" and virtual_stages > 1 else 1
    last_in_flight = n_micro if schedule == "gpipe" else \
        min(n_micro, ((v - 1) * pp + 1) / v) if pp > 1 else in_flight
    return {"activations": stored + working, "logits": logits,
            "last_stage_activations": per_layer * last * last_in_flight + working}


def kv_cache_bytes(spec: ModelSpec, *, batch: int, context: int, dtype_bytes: float = 2) -> float:
    """Keys and values of every layer for ``batch`` sequences of ``context`` tokens:
    2 (K and V) x L x kv_heads x head_dim x context x batch x bytes. A block with a sliding window
    keeps only the window's latest keys (Hugging Face's sliding-window cache layers, vLLM)."""
    windowed = spec.windowed_layers if spec.attention_window and spec.attention_window < context else 0
    held = (spec.layers - windowed) * context + windowed * spec.attention_window
    return 2 * spec.kv_dim * held * batch * dtype_bytes
