"""Time of a training step: a roofline per op class plus alpha-beta collectives. Pure functions.

Op classes and how each is timed on one device (rates from the catalog x calibration):
- weight GEMMs: max(FLOPs / (MAMF x size efficiency), bytes / bandwidth) + a kernel's fixed cost;
- attention core: flash -> FLOPs at the fused-attention rate, lower for heads narrower than 128
  (calibration.flash_head_dim_factor; backward 2.5x the forward; first-generation kernels, flash1,
  at half that rate; flash2, FlashAttention-2 named, at its own rate where the part outgrew it);
  materialised -> two batched GEMMs per head (memory bound at head_dim 64-128) + softmax/dropout
  traffic over the a x s x s scores;
- elementwise (norms, residuals, activation, dropout): bytes / bandwidth; run eagerly, one kernel an
  op, each also pays a kernel's fixed cost (eager_block_kernels);
- collectives: ring all-reduce moves 2 (n-1)/n of the buffer through each link, all-gather and
  reduce-scatter (n-1)/n (Patarasuk & Yuan 2009; NCCL's "bus bandwidth"), each of 2 (n-1) or
  (n-1) steps paying the latency alpha.
Pipeline schedules (Narayanan et al. 2021, section 2.2): GPipe and 1F1B take (m + p - 1) stage
slots, a bubble fraction (p - 1) / (m + p - 1) of the step; interleaving with v chunks shrinks
the bubble to (p - 1) / v slots.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, replace

from tensorpilot.plan import calibration as cal
from tensorpilot.plan.flops import attention_core_flops, layer_gemms
from tensorpilot.plan.models import ModelSpec

# how the elementwise ops run: fused kernels (hand-written or compiled) or one PyTorch op a kernel
KERNELS = ("fused", "eager")
# how the attention core runs: a FlashAttention-2-class fused kernel, a first-generation one
# (calibration.FIRST_GEN_FLASH_SPEED), or the s x s scores materialised by two batched GEMMs
ATTENTION = ("flash", "flash2", "flash1", "materialized")
FUSED_ATTENTION = ("flash", "flash2", "flash1")

__all__ = ["ATTENTION", "FUSED_ATTENTION", "KERNELS", "DeviceRates", "allgather_time_s", "allreduce_time_s",
           "alltoall_time_s", "backward_gemms_time_s", "bubble_fraction", "gemm_time_s", "kernel_share",
           "layer_times", "pipeline_time_s", "reducescatter_time_s", "ring_allreduce_bytes_factor", "score_bytes_per_element"]


@dataclass(frozen=True, slots=True)
class DeviceRates:
    """Achievable rates of one device (datasheet x calibration), SI units."""

    matmul_flops_per_s: float        # large-GEMM ceiling in the compute dtype
    mem_bytes_per_s: float           # streaming HBM bandwidth
    link_bytes_per_s: float          # intra-node collective bus bandwidth per device, one direction
    internode_bytes_per_s: float     # scale-out bandwidth per device, one direction
    attention_flops_per_s: float     # fused (flash) attention, forward + backward
    gpus_per_node: int = cal.GPUS_PER_NODE   # devices the intra-node link joins
    gemm_half_depth: float = 64.0    # reduction depth K at which a GEMM runs at half its large-GEMM rate
    host_link_bytes_per_s: float | None = None   # PCIe beyond a bridged pair, one direction


def kernel_share(rates: DeviceRates, efficiency: float) -> DeviceRates:
    """``rates`` as a stack that reaches ``efficiency`` of them runs its kernels (GEMMs, attention,
    memory-bound ops; plan.anchor): its links, the host, the kernel floor and a GEMM's fixed cost keep
    their own."""
    if efficiency == 1.0:
        return rates
    return replace(rates, matmul_flops_per_s=rates.matmul_flops_per_s * efficiency,
                   attention_flops_per_s=rates.attention_flops_per_s * efficiency,
                   mem_bytes_per_s=rates.mem_bytes_per_s * efficiency)


def gemm_time_s(m: int, k: int, n: int, rates: DeviceRates, elem_bytes: float, batch: float = 1) -> float:
    """``batch`` (m, k) @ (k, n) matmuls in one kernel (a batched GEMM: ``batch`` = 1 is a plain
    one): roofline with the efficiency of its reduction depth k (calibration.GEMM_HALF_DEPTH_PER_
    BALANCE), plus the kernel's fixed cost (calibration.GEMM_OVERHEAD_S), paid once."""
    flops = 2 * m * k * n * batch
    compute = flops / (rates.matmul_flops_per_s * k / (k + rates.gemm_half_depth))
    traffic = elem_bytes * (m * k + k * n + m * n) * batch / rates.mem_bytes_per_s
    return max(compute, traffic) + cal.GEMM_OVERHEAD_S


def backward_gemms_time_s(m: int, k: int, n: int, rates: DeviceRates, elem_bytes: float) -> float:
    """The two backward GEMMs of an (m, k) @ (k, n) forward: the input gradient (m, n) @ (n, k),
    depth n, and the weight gradient (k, m) @ (m, n), depth m (the tokens)."""
    return gemm_time_s(m, n, k, rates, elem_bytes) + gemm_time_s(k, m, n, rates, elem_bytes)


# ------------------------------------------------------------------------------ collectives

def ring_allreduce_bytes_factor(n: int) -> float:
    """Bytes each device sends per byte of buffer in a ring all-reduce: 2 (n - 1) / n."""
    return 2 * (n - 1) / n if n > 1 else 0.0


def allreduce_time_s(nbytes: float, n: int, bw_bytes_per_s: float, alpha_s: float) -> float:
    """The faster of a ring (2 (n - 1) latency steps) and a tree (2 log2 n steps, each byte sent
    up and down): NCCL's tuner picks between them by this alpha-beta cost, as XLA does between
    its algorithms on a torus."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    ring = 2 * (n - 1) * alpha_s + ring_allreduce_bytes_factor(n) * nbytes / bw_bytes_per_s
    tree = 2 * math.ceil(math.log2(n)) * alpha_s + 2 * nbytes / bw_bytes_per_s
    return min(ring, tree)


def allgather_time_s(nbytes: float, n: int, bw_bytes_per_s: float, alpha_s: float) -> float:
    """All-gather of an ``nbytes`` full buffer (each device holds nbytes / n): (n-1)/n x nbytes."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * alpha_s + (n - 1) / n * nbytes / bw_bytes_per_s


reducescatter_time_s = allgather_time_s      # same traffic pattern, reversed


def alltoall_time_s(nbytes: float, n: int, bw_bytes_per_s: float, alpha_s: float) -> float:
    """All-to-all of the ``nbytes`` each device holds: it keeps 1/n and sends (n - 1)/n, a slice
    to each peer, in n - 1 exchanges (NCCL's send/recv pairs)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * alpha_s + (n - 1) / n * nbytes / bw_bytes_per_s


def group_link(rates: DeviceRates, size: int, stride: int) -> tuple[float, float]:
    """(bandwidth, alpha) of a process group of ``size`` ranks spaced ``stride`` apart when ranks
    fill nodes in order: it stays on the intra-node link when size x stride fits in a node.
    Across nodes, the k ranks of the group on each node drive k NICs (one a GPU, rail-optimised
    clusters): NCCL and XLA split a ring collective into channels spread over the node's NICs,
    so a ring's inter-node hop carries 1/k of the data per NIC (nccl-tests on DGX A100/H100
    nodes report multi-node bus bandwidths near 8 NICs' line rate, not one's). The intra-node
    link still bounds it."""
    if size * stride <= rates.gpus_per_node:
        return rates.link_bytes_per_s, cal.ALPHA_INTRA_S
    # the host's link: the scale-up link itself, or for a bridged pair of PCIe cards
    # (host_link_bytes_per_s) PCIe, inside a host of GPUS_PER_NODE cards and on to the NICs,
    # which hang off the same slots
    bridged = rates.host_link_bytes_per_s is not None
    host, host_bw = (cal.GPUS_PER_NODE, rates.host_link_bytes_per_s) if bridged else \
        (rates.gpus_per_node, rates.link_bytes_per_s)
    if size * stride <= host:
        return host_bw, cal.ALPHA_INTRA_S
    k = max(1, min(size, host // stride))
    return min(host_bw, k * rates.internode_bytes_per_s), cal.ALPHA_INTER_S


# ------------------------------------------------------------------------------ one layer

@dataclass(frozen=True, slots=True)
class LayerTimes:
    """Seconds for one block, one micro-batch, one device."""

    gemm_fwd_s: float
    gemm_bwd_s: float                # input gradients (depth: the output width) + weight gradients (depth: tokens)
    attention_fwd_s: float
    attention_bwd_s: float
    elementwise_fwd_s: float
    tp_comm_per_collective_s: float

    @property
    def forward_s(self) -> float:
        return self.gemm_fwd_s + self.attention_fwd_s + self.elementwise_fwd_s

    @property
    def backward_s(self) -> float:
        # every weight GEMM has two backward GEMMs of its size; elementwise traffic doubles
        return self.gemm_bwd_s + self.attention_bwd_s + 2 * self.elementwise_fwd_s


def elementwise_bytes_per_token(spec: ModelSpec, *, tp: int, sequence_parallel: bool, e: float,
                                kernels: str = "fused", autocast: bool = False) -> float:
    """Forward traffic of the memory-bound ops of one block, per token, one device.

    ``kernels="fused"`` (hand-fused kernels as in Megatron / Transformer Engine, XLA, or
    torch.compile's Inductor): each op reads its inputs and writes its output once: norms 2h
    each, residual adds 3h each, activation 2f (GeLU) or 3f (SwiGLU: gate, up -> product),
    dropout 2h + 1-byte mask each.

    ``kernels="eager"``: every PyTorch op is its own kernel and moves its tensors once, so these
    ops move more than the fused count (bytes an element; e = activation bytes):
    - RMSNorm is composite in fp32 (Hugging Face LlamaRMSNorm, torch.nn.RMSNorm's reference
      path): upcast, square, mean, scale by the reciprocal root, downcast, weight: 28 + 4e
      (28 in fp32, no casts). Gated-MLP models are taken to use RMSNorm and RoPE (every such
      family does); others a LayerNorm, one native kernel: 2e.
    - rotary embedding of q and k in fp32 (upcast, complex product, downcast): 16 + 2e (8 in fp32);
    - SwiGLU as silu(gate) then a product: 5e against 3e a ffn element;
    - the attention output transposed back to (tokens, heads x head_dim) before its projection: 2e.
    Under ``autocast`` (fp32 weights, torch.autocast) the residual stream stays fp32 (the
    embedding output is fp32 and fp32 + half is fp32): each residual add reads 4 + e and writes
    4; norms run in fp32 (layer_norm is on autocast's fp32 list: 8; RMSNorm 28 without casts)
    and their output is cast to e for the next GEMM (4 + e).
    GeLU and dropout move the same in both. Norms, residuals and dropouts run on every TP rank
    unless sequence-parallel.
    """
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, not {kernels!r}")
    h, f = spec.hidden, spec.ffn_hidden
    gated = spec.mlp == "swiglu"
    norm, residual = 2 * e, 3 * e                       # bytes an element of h
    act = (3 if gated else 2) * f * e
    rope = attn_out = 0.0
    if kernels == "eager":
        attn_out = 2 * spec.q_dim * e
        if autocast:
            residual = 4 + e + 4
            norm = (28 if gated else 8) + 4 + e
        elif gated:
            norm = 28 + 4 * e if e < 4 else 28
        if gated:
            act = 5 * f * e
            rope = (16 + 2 * e if e < 4 else 8) * (spec.q_dim + spec.kv_dim)
    replicated = (norm + residual) * h * 2 + (2 * (2 * h * e + h) if spec.dropout else 0)
    split = act + rope + attn_out
    return (replicated / (tp if sequence_parallel else 1) + split / tp) * cal.ELEMENTWISE_TRAFFIC_FACTOR


def eager_block_ops(spec: ModelSpec, attention: str) -> int:
    """Ops one eager block dispatches from the host, forward + backward
    (calibration.EAGER_OPS_PER_BLOCK, by MLP and by whether SDPA fuses the attention)."""
    kind = ("gated" if spec.mlp == "swiglu" else "plain",
            "fused" if attention in FUSED_ATTENTION else "materialized")
    return cal.EAGER_OPS_PER_BLOCK[kind]


def eager_block_kernels(spec: ModelSpec, attention: str, autocast: bool = False) -> float:
    """Memory-bound kernels one eager block launches, forward + backward: the launching share of
    its ops (calibration.LAUNCHING_OP_SHARE) and autocast's casts, less its GEMMs (three a weight:
    forward, input and weight gradients) and attention kernels (fused: one forward, one backward;
    materialised: two batched GEMMs forward, four backward), which pay their fixed costs as GEMMs
    or under the kernel floor. Llama with SDPA: 108.5 - 12 - 2 = 94.5; GPT-2: 84.5 - 12 - 2 = 70.5."""
    launching = eager_block_ops(spec, attention) * cal.LAUNCHING_OP_SHARE
    casts = cal.AUTOCAST_OPS_PER_BLOCK if autocast else 0
    timed = 3 * len(layer_gemms(spec, 1)) + (2 if attention in FUSED_ATTENTION else 6)
    return max(0.0, launching + casts - timed)


def eager_outside_kernels() -> float:
    """Memory-bound kernels an eager micro-batch launches outside its blocks (embeddings, final norm,
    loss; calibration.EAGER_OPS_OUTSIDE_BLOCKS), less the output layer's three GEMMs: 29.5."""
    return cal.EAGER_OPS_OUTSIDE_BLOCKS * cal.LAUNCHING_OP_SHARE - 3


def score_bytes_per_element(spec: ModelSpec, e: float, kernels: str = "fused", autocast: bool = False) -> float:
    """Forward traffic over each element of materialised (s x s) attention scores, besides the two
    batched GEMMs that write and read them (e = activation bytes).

    Fused (Megatron's scale-mask-softmax kernel, XLA): softmax reads and writes the scores once,
    2e; dropout reads, writes and masks them, 2e + 1. Eager (one PyTorch op a kernel, as Hugging
    Face's eager attention and the GPT-2 / BERT reference code run it): the scale by 1/sqrt(d) and
    the mask (additive or torch.where) are kernels of their own, 2e each; softmax writes fp32
    under autocast (softmax is on autocast's fp32 list) and in gated-MLP (Llama-family) models,
    whose eager attention asks for an fp32 softmax itself: e + 4; dropout then moves fp32
    (4 + 4 + 1); the next GEMM's input is cast back, 4 + e."""
    if kernels == "fused":
        return 2 * e + ((2 * e + 1) if spec.dropout else 0)
    probs = 4 if autocast or spec.mlp == "swiglu" else e
    cast = (probs + e) if probs != e else 0
    return 2 * e + 2 * e + (e + probs) + ((2 * probs + 1) if spec.dropout else 0) + cast


def layer_times(spec: ModelSpec, rates: DeviceRates, *, seq_len: int, micro_batch: int, tp: int,
                sequence_parallel: bool, attention: str, e: float, kv_len: int | None = None,
                doc_len: int | None = None,
                kernels: str = "fused", autocast: bool = False) -> LayerTimes:
    """``seq_len``: the tokens of each sequence on this device; ``kv_len``: the keys each of
    them attends over (context parallelism: seq_len / cp local queries against all seq_len keys,
    chunks load-balanced so each rank gets 1/cp of the causal work); ``doc_len``: the documents
    packed in each sequence, under a mask a fused kernel skips (materialised scores stay full)."""
    kv_len = kv_len or seq_len
    tokens = seq_len * micro_batch
    gemms = layer_gemms(spec, tokens, tp)
    gemm = sum(gemm_time_s(g.m, g.k, g.n, rates, e) for g in gemms)
    gemm_bwd = sum(backward_gemms_time_s(g.m, g.k, g.n, rates, e) for g in gemms)
    if attention in FUSED_ATTENTION:
        convention = "causal" if spec.causal else "full"
        flops = attention_core_flops(spec, micro_batch, kv_len, convention, doc_len) / tp * seq_len / kv_len
        rate = rates.attention_flops_per_s * (cal.FIRST_GEN_FLASH_SPEED if attention == "flash1" else 1.0) \
            * cal.flash_head_dim_factor(spec.head_dim)
        att_f = max(flops / rate, cal.KERNEL_FLOOR_S)
        att_b = cal.FLASH_BACKWARD_RATIO * att_f
    else:
        # per head: (s, d) @ (d, s) scores and (s, s) @ (s, d) output, b a / t heads per device,
        # each product one batched kernel over the heads (torch.baddbmm / bmm)
        d, heads = spec.head_dim, micro_batch * spec.heads / tp
        bmm = gemm_time_s(seq_len, d, kv_len, rates, e, heads) + gemm_time_s(seq_len, kv_len, d, rates, e, heads)
        score_bytes = heads * seq_len * kv_len * score_bytes_per_element(spec, e, kernels, autocast)
        soft = score_bytes * cal.ELEMENTWISE_TRAFFIC_FACTOR / rates.mem_bytes_per_s
        att_f = bmm + soft
        att_b = 2 * bmm + 2 * soft
    ew = tokens * elementwise_bytes_per_token(spec, tp=tp, sequence_parallel=sequence_parallel, e=e,
                                              kernels=kernels, autocast=autocast) \
        / rates.mem_bytes_per_s
    if kernels == "eager":
        # each kernel's fixed cost; a third of the block's kernels are the forward's, as backward_s
        # counts the elementwise time twice (Llama: 76 forward and 141 backward ops)
        ew += eager_block_kernels(spec, attention, autocast) / 3 * cal.KERNEL_FLOOR_S
    # one TP collective: all-reduce of the (tokens, h) block output (with sequence parallelism a
    # reduce-scatter + all-gather pair: the same bytes), inside a node
    bw, alpha = group_link(rates, tp, 1)
    comm = allreduce_time_s(tokens * spec.hidden * e, tp, bw, alpha)
    return LayerTimes(gemm, gemm_bwd, att_f, att_b, ew, comm)


# ------------------------------------------------------------------------------ pipeline

def bubble_fraction(pp: int, n_micro: int, schedule: str = "1f1b", virtual_stages: int = 1) -> float:
    """Idle fraction of a pipelined step: (p - 1) / (m + p - 1); interleaved: (p-1)/v slots."""
    if pp <= 1:
        return 0.0
    idle = (pp - 1) / (virtual_stages if schedule == "interleaved" else 1)
    return idle / (n_micro + idle)


def pipeline_time_s(stage_micro_s: float, pp: int, n_micro: int, schedule: str = "1f1b",
                    virtual_stages: int = 1) -> float:
    """Time of ``n_micro`` micro-batches through ``pp`` stages, each taking ``stage_micro_s``."""
    return stage_micro_s * n_micro / (1 - bubble_fraction(pp, n_micro, schedule, virtual_stages))
