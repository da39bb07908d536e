"""``predict(model, hardware, layout, setup) -> Plan``: memory, step time, throughput, MFU, cost
and energy of one training configuration. Pure Python (catalog + formulas), microseconds per call,
so the layout search can call it thousands of times and ``train`` can print predicted vs measured.

>>> from tensorpilot.hardware import catalog
>>> from tensorpilot.plan.models import get_model
>>> p = predict(get_model("llama3-8b"), catalog.get("h100-sxm"), Layout(dp=8, sharding="fsdp",
...             recompute="selective"), TrainSetup(seq_len=8192, global_batch=16))
>>> p.fits, 0.3 < p.mfu < 0.6
(True, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from tensorpilot.errors import ConfigError
from tensorpilot.hardware.catalog import Accelerator
from tensorpilot.hardware.peak import mfu as mfu_of
from tensorpilot.plan import calibration as cal
from tensorpilot.plan import memory as mem
from tensorpilot.plan import timing as tm
from tensorpilot.plan.flops import (RECOMPUTE_MODES, hardware_flops, layer_gemms, op_recomputed_gemm_flops,
                                    train_flops)
from tensorpilot.layout import SCHEDULES, SHARDINGS, Layout
from tensorpilot.plan.limits import (MAX_DEVICES, MAX_DIM, MAX_GRID_G_PER_KWH, MAX_PRICE_PER_HOUR, MAX_SEQ_LEN,
                                     MAX_SEQUENCES, MAX_STACK_EFFICIENCY, MAX_TOKENS, check_count, check_number)
from tensorpilot.plan.models import ModelSpec

__all__ = ["OFFLOADS", "InferencePlan", "Layout", "Plan", "TrainSetup", "device_rates", "hourly_price",
           "least_recompute", "optimizer_step_temporary_bytes", "predict", "predict_inference", "recompute_share"]


# what lives in host memory: nothing; the optimizer's part (fp32 master, states, fp32 gradients;
# ZeRO-Offload); or that and the weights (ZeRO-Infinity's offload_param, FSDP's CPUOffload)
OFFLOADS = ("none", "optimizer", "params")

# How the optimizer step runs: fused, one kernel that reads the weights, gradients and moments and
# writes the weights and moments once (torch.optim.AdamW(fused=True), Apex's and Transformer
# Engine's FusedAdam, which Megatron-LM, NeMo and DeepSpeed use); foreach, torch.optim's default on
# CUDA, every elementwise op of the update one multi-tensor pass over all parameters; loop
# (foreach=False, Hugging Face's old adamw_hf, hand-written per-parameter updates), the same passes
# dispatched tensor by tensor from the host.
OPTIMIZER_IMPLS = ("fused", "foreach", "loop")
# Tensor accesses per parameter of the unfused AdamW update (torch 2.x _multi_tensor_adam and
# _single_tensor_adam, decoupled weight decay, no amsgrad): the weights 4 (decay read + write,
# addcdiv read + write), exp_avg 3 (lerp read + write, addcdiv read), exp_avg_sq 5 (mul read +
# write, addcmul read + write, sqrt read), the gradient 2 (lerp, addcmul) and the denominator, a
# temporary of the moments' dtype, 6 (sqrt write, div and add read + write, addcdiv read). The
# fused kernel's: 2, 2, 2, 1, 0. Counted op by op with a TorchDispatchMode in
# tests/unit/test_plan_optimizer_impl.py.
UNFUSED_ADAM_ACCESSES = {"weights": 4, "exp_avg": 3, "exp_avg_sq": 5, "grad": 2, "temporary": 6}
# ops one parameter tensor dispatches in the loop: the step counter's increment (a host tensor),
# then decay, lerp, mul, addcmul, sqrt, div, add, addcdiv -- eight that launch a kernel
LOOP_OPS_PER_TENSOR, LOOP_LAUNCHES_PER_TENSOR = 9, 8
# Adam-family optimizers whose unfused form the planner counts; the others (SGD, Adafactor, 8-bit
# AdamW, Lion) are planned as one fused pass whatever optimizer_impl says
_UNFUSED_COUNTED = ("adam", "adamw", "adamw-bf16")
# LAMB's fused step (apex's multi_tensor_lamb, which NVIDIA's BERT recipes and MLPerf BERT run) in
# three passes: Adam's update written to a buffer beside the moments, the L2 norms of the weights
# and of that update per tensor (the trust ratio), then the weights updated from it -- beyond the
# fused Adam pass, the update written and read twice and the weights read twice more, each in the
# master's dtype
LAMB_EXTRA_ACCESSES = 5
# Muon orthogonalises each block matrix's momentum with this many quintic Newton-Schulz iterations
# a step, in bf16 (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks",
# ns_steps=5; Liu et al. 2025, arXiv 2502.16982, sec. 2.1, five as well)
MUON_NS_STEPS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainSetup:
    """What is trained and how, independent of the layout."""

    seq_len: int
    global_batch: int                     # sequences per optimizer step
    precision: str = "bf16"               # see memory.precision
    optimizer: str = "adam"
    optimizer_impl: str = "fused"         # how the step runs (OPTIMIZER_IMPLS): fused | foreach | loop
    attention: str = "flash"              # flash (fused, causal half computed) | materialized
    kernels: str = "fused"                # elementwise ops: fused (Megatron/TE, XLA, torch.compile) | eager
    fp8_recipe: str = "te"                # fp8 GEMM path: te (Transformer Engine, cuBLASLt) | torchao (_scaled_mm)
    grad_dtype: str | None = None         # gradients accumulated and reduced in: fp32 | bf16 | fp16; None: the recipe's
    tokens: float | None = None           # tokens to train, for time / cost / energy
    price_per_hour: float | None = None   # USD per device-hour; default: the catalog's price
    grid_g_per_kwh: float = cal.DEFAULT_GRID_G_PER_KWH
    goodput: float | None = None          # share of wall-clock that trains; None: cal.goodput(devices)
    offload: str = "none"                 # host offload: none | optimizer (ZeRO-Offload) | params (+ weights, ZeRO-3)
    doc_len: int | None = None            # tokens a packed document has, under a document mask; None: one a sequence
    loss_kernel: str = "whole"            # language-model loss: whole | chunked | fused | compiled (memory.LOSS_KERNELS)
    stack_efficiency: float = 1.0         # share of the planner's kernel rates the user's stack reaches (plan.anchor)
    vocab_multiple: int = 1               # the output layer padded to a multiple of this (Megatron: 128 a TP rank)
    host_efficiency: float = 1.0          # share of the planner's op-dispatch rate its host reaches (eager; plan.anchor)

    def __post_init__(self) -> None:
        check_count("seq_len", self.seq_len, MAX_SEQ_LEN)
        check_count("global_batch", self.global_batch, MAX_SEQUENCES)
        if self.tokens is not None:
            check_number("tokens", self.tokens, MAX_TOKENS, above_low=True)
        if self.price_per_hour is not None:
            check_number("price_per_hour", self.price_per_hour, MAX_PRICE_PER_HOUR)
        check_number("grid_g_per_kwh", self.grid_g_per_kwh, MAX_GRID_G_PER_KWH)
        if self.goodput is not None:
            check_number("goodput", self.goodput, 1.0, above_low=True)
        if self.kernels not in tm.KERNELS:
            raise ConfigError(f"kernels must be one of {', '.join(tm.KERNELS)}, not {self.kernels!r}.")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ConfigError(f"optimizer_impl must be one of {', '.join(OPTIMIZER_IMPLS)}, "
                              f"not {self.optimizer_impl!r}.")
        if self.loss_kernel not in mem.LOSS_KERNELS:
            raise ConfigError(f"loss_kernel must be one of {', '.join(mem.LOSS_KERNELS)}, not {self.loss_kernel!r}.")
        if self.grad_dtype is not None and self.grad_dtype not in mem.GRAD_DTYPES:
            raise ConfigError(f"grad_dtype must be one of {', '.join(mem.GRAD_DTYPES)}, not {self.grad_dtype!r}.")
        if self.fp8_recipe not in cal.FP8_RECIPES:
            raise ConfigError(f"fp8_recipe must be one of {', '.join(cal.FP8_RECIPES)}, not {self.fp8_recipe!r}.")
        if self.offload not in OFFLOADS:
            raise ConfigError(f"offload must be one of {', '.join(OFFLOADS)}, not {self.offload!r}.")
        if self.offload != "none" and self.optimizer == "none":
            raise ConfigError(f"offload {self.offload!r} moves the optimizer's state and step to the host, and "
                              "optimizer 'none' has neither: drop --offload.")
        if self.doc_len is not None:
            check_count("doc_len", self.doc_len, MAX_SEQ_LEN)
        check_number("stack_efficiency", self.stack_efficiency, MAX_STACK_EFFICIENCY, above_low=True)
        check_number("host_efficiency", self.host_efficiency, MAX_STACK_EFFICIENCY, above_low=True)
        check_count("vocab_multiple", self.vocab_multiple, MAX_DIM)

    def goodput_on(self, n_devices: int) -> float:
        """The stated goodput, or the one interruptions leave on ``n_devices`` (calibration.goodput)."""
        return self.goodput if self.goodput is not None else cal.goodput(n_devices)


@dataclass(slots=True, kw_only=True)
class Plan:
    model: str
    hardware: str
    layout: str
    layout_detail: Layout
    n_devices: int
    memory_bytes: dict[str, float]          # per component + "total", busiest device
    memory_limit_bytes: float                # device capacity x (1 - safety margin)
    device_memory_bytes: float
    fits: bool
    step_time_s: float
    time_breakdown_s: dict[str, float]
    tokens_per_step: int
    tokens_per_s: float
    tokens_per_s_per_device: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    mfu: float | None
    hfu: float | None
    peak_flops_per_s: float | None
    time_to_train_s: float | None = None
    goodput: float | None = None          # the share of wall-clock that trains, in time_to_train_s
    gpu_hours: float | None = None
    price_per_gpu_hour: float | None = None
    cost_usd: float | None = None
    power_w_per_device: float | None = None
    energy_kwh: float | None = None
    co2_kg: float | None = None
    host_memory_bytes: float = 0.0          # per device, in host memory (TrainSetup.offload)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layout_detail"] = asdict(self.layout_detail)
        return d


def device_rates(acc: Accelerator, compute_dtype: str, fp8_recipe: str = "te",
                 attention: str = "flash") -> tm.DeviceRates:
    """Achievable rates in ``compute_dtype``. fp8 runs only the weight GEMMs in fp8, at the GEMM
    fraction of ``fp8_recipe``'s path (calibration.FP8_RECIPES): fused attention stays bf16
    (Transformer Engine's and torchao's default recipes), so its rate comes from the bf16 peak.
    fp4 (NVFP4 / MXFP4) likewise, at the fp4 peak. ``attention`` flash2: FlashAttention-2's own rate
    where the part outgrew it (calibration.FLASH2_ATTENTION_FLOPS), never above the part's."""
    peak = acc.peak_flops_per_s(compute_dtype)
    if not peak:
        raise ConfigError(f"{acc.key} has no published {compute_dtype} peak; choose another --precision.")
    if compute_dtype in mem.LOW_PRECISION_GEMMS:
        # everything but the GEMMs runs as under bf16
        key = cal.calibration_key(acc)
        return replace(device_rates(acc, "bf16", attention=attention),
                       matmul_flops_per_s=peak * cal.SUSTAINED_COMPUTE_FRACTION * _power_cap_fraction(acc)
                       * cal.mamf_fraction(key, compute_dtype, fp8_recipe),
                       gemm_half_depth=cal.gemm_half_depth(peak, acc.mem_bw_gb_per_s, key))
    link = (acc.link_gb_per_s or 32) * 1e9 / 2 * cal.LINK_BW_FRACTION          # both directions -> one
    host = acc.host_link_gb_per_s * 1e9 / 2 * cal.LINK_BW_FRACTION if acc.host_link_gb_per_s else None
    net = (acc.internode_gbit_per_s or 100) * 1e9 / 8 * cal.INTERNODE_BW_FRACTION
    sustained = peak * cal.SUSTAINED_COMPUTE_FRACTION * _power_cap_fraction(acc)
    key = cal.calibration_key(acc)
    attend = sustained * cal.flash_attention_fraction(key)
    if attention == "flash2" and (flash2 := cal.flash2_attention_flops(key)):
        attend = min(attend, flash2 * _power_cap_fraction(acc))
    return tm.DeviceRates(matmul_flops_per_s=sustained * cal.mamf_fraction(key, compute_dtype),
                          mem_bytes_per_s=cal.streaming_bytes_per_s(acc),
                          link_bytes_per_s=link, internode_bytes_per_s=net,
                          attention_flops_per_s=attend,
                          gpus_per_node=acc.link_domain_gpus or cal.GPUS_PER_NODE, host_link_bytes_per_s=host,
                          gemm_half_depth=cal.gemm_half_depth(peak, acc.mem_bw_gb_per_s, key))


def _exposed(comm_s: float, compute_s: float, tail: float) -> float:
    """Exposed time of a collective overlapped with ``compute_s`` of work: at least its ``tail``
    share waits (the part no compute is left to hide: the last block's gradients, a tensor-parallel
    collective's first chunk), what compute cannot cover waits, and the compute it runs beside
    slows by the share of the device the collective's kernels take."""
    exposed = max(comm_s * tail, comm_s - compute_s)
    return exposed + cal.COLLECTIVE_COMPUTE_SHARE * (comm_s - exposed)


def _power_cap_fraction(acc: Accelerator) -> float:
    """A variant that inherits its base part's peaks under a lower power limit runs slower clocks
    (calibration.power_cap_clock_fraction) than the furthest part up its chain of bases with the
    same peaks; a variant whose own datasheet restates its peaks (H200 NVL) already has them."""
    from tensorpilot.hardware import catalog

    ref = acc
    for parent in catalog.base_chain(acc)[1:]:
        if parent.peak_flops_per_s("bf16") != acc.peak_flops_per_s("bf16"):
            break
        ref = parent
    return 1.0 if ref is acc else cal.power_cap_clock_fraction(acc.tdp_w, ref.tdp_w)


def board_power_w(acc: Accelerator, hfu: float | None, compute_dtype: str) -> float | None:
    """Board power of one device running a step at hardware-FLOP utilisation ``hfu`` (of the
    ``compute_dtype`` datasheet peak): TDP x (idle + (1 - idle) x busy), busy = hfu over the
    fraction of peak its saturated matmuls reach (calibration.IDLE_POWER_FRACTION, an
    ASSUMPTION); None without a TDP in the catalog (CPUs, measured local devices)."""
    if not acc.tdp_w:
        return None
    saturated = cal.mamf_fraction(cal.calibration_key(acc), compute_dtype) * cal.SUSTAINED_COMPUTE_FRACTION
    busy = min(1.0, (hfu or 0.0) / saturated)
    return acc.tdp_w * (cal.IDLE_POWER_FRACTION + (1 - cal.IDLE_POWER_FRACTION) * busy)


def check_layout(spec: ModelSpec, layout: Layout, setup: TrainSetup, n_devices: int | None = None) -> None:
    """Raise ConfigError (one sentence) for a layout that cannot run."""
    lo = layout
    for name, high in (("tp", MAX_DEVICES), ("pp", MAX_DEVICES), ("dp", MAX_DEVICES), ("cp", MAX_DEVICES),
                       ("micro_batch", MAX_SEQUENCES), ("virtual_stages", MAX_DEVICES)):
        check_count(name, getattr(lo, name), high)
    if lo.n_devices > MAX_DEVICES:
        raise ConfigError(f"tp x pp x dp x cp = {lo.n_devices:,} devices exceeds the planner's maximum of "
                          f"{MAX_DEVICES:,}.")
    if n_devices is not None and lo.n_devices != n_devices:
        raise ConfigError(f"tp x pp x dp x cp = {lo.tp} x {lo.pp} x {lo.dp} x {lo.cp} = {lo.n_devices} does not equal "
                          f"--gpus {n_devices}.")
    if spec.heads % lo.tp:
        raise ConfigError(f"tp={lo.tp} does not divide the {spec.heads} attention heads of {spec.name}.")
    if spec.ffn_hidden < lo.tp:
        raise ConfigError(f"tp={lo.tp} exceeds the MLP width (ffn_hidden {spec.ffn_hidden}) of {spec.name}.")
    if spec.n_kv_heads % lo.tp and lo.tp % spec.n_kv_heads:
        raise ConfigError(f"tp={lo.tp} and the {spec.n_kv_heads} key/value heads of {spec.name} do not divide "
                          "one another.")
    # the embedding and the output layer may each take a block's place (memory.stage_layers)
    chunks = lo.pp * (lo.virtual_stages if lo.schedule == "interleaved" else 1)
    if chunks > spec.layers and (lo.pp == 1 or chunks != spec.layers + 2):
        what = f"pp={lo.pp}" if chunks == lo.pp else f"pp x virtual stages = {lo.pp} x {lo.virtual_stages}"
        raise ConfigError(f"{what} exceeds the {spec.layers} layers of {spec.name} (each model chunk needs a "
                          "layer, or exactly layers + 2 chunks with the embedding and the output layer as one each).")
    if setup.global_batch % (lo.dp * lo.micro_batch):
        raise ConfigError(f"micro-batch {lo.micro_batch} x dp {lo.dp} does not divide the global batch "
                          f"{setup.global_batch}.")
    if lo.sharding not in SHARDINGS:
        raise ConfigError(f"unknown sharding {lo.sharding!r}; use one of {', '.join(SHARDINGS)}.")
    if lo.schedule not in SCHEDULES:
        raise ConfigError(f"unknown pipeline schedule {lo.schedule!r}; use one of {', '.join(SCHEDULES)}.")
    if lo.recompute not in RECOMPUTE_MODES:
        raise ConfigError(f"unknown recompute {lo.recompute!r}; use one of {', '.join(RECOMPUTE_MODES)}.")
    if lo.recompute_layers > chunk_layers(spec, lo):
        raise ConfigError(f"recompute_layers {lo.recompute_layers} exceeds the {chunk_layers(spec, lo)} blocks of a "
                          "model chunk: pass at most that many (or none, to recompute every block).")
    if lo.cp > 1 and lo.cp_mode == "ring" and setup.seq_len % (2 * lo.cp):
        raise ConfigError(f"context parallelism splits each sequence into 2 x cp = {2 * lo.cp} load-balanced chunks; "
                          f"seq_len {setup.seq_len} is not a multiple of it.")
    if lo.cp > 1 and lo.cp_mode == "ulysses":
        if setup.seq_len % lo.cp:
            raise ConfigError(f"Ulysses splits each sequence into cp = {lo.cp} chunks; seq_len {setup.seq_len} is not "
                              "a multiple of it.")
        if (spec.heads // lo.tp) % lo.cp:
            raise ConfigError(f"Ulysses gives each of its cp = {lo.cp} ranks whole attention heads: cp does not divide "
                              f"the {spec.heads // lo.tp} heads a tensor-parallel rank holds ({spec.name}); use ring "
                              "context parallelism or a cp that divides them.")
    if lo.sequence_parallel and lo.tp == 1:
        raise ConfigError("sequence parallelism needs tp > 1.")
    if setup.offload == "params" and lo.zero_stage != 3:
        raise ConfigError("offloading the weights to the host needs them sharded: pass --sharding zero3 (each "
                          "device gathers a block's weights from the host as it needs them).")
    if setup.attention not in tm.ATTENTION:
        raise ConfigError(f"attention must be one of {', '.join(tm.ATTENTION)}, not {setup.attention!r}.")


def recompute_share(spec: ModelSpec, layout: Layout) -> float:
    """Share of each model chunk's blocks that run the layout's recomputation: all of them, unless
    full recomputation names fewer blocks (``recompute_layers``) than a chunk holds."""
    if layout.recompute != "full" or not layout.recompute_layers:
        return 1.0
    return min(1.0, layout.recompute_layers / chunk_layers(spec, layout))


def chunk_layers(spec: ModelSpec, layout: Layout) -> int:
    """Blocks of the fullest model chunk (a stage's share of the layers, over its virtual stages)."""
    vp = layout.virtual_stages if layout.schedule == "interleaved" else 1
    return math.ceil(spec.layers / (layout.pp * vp))


def _optimizer_bytes_per_param(prec, optimizer: str, impl: str) -> float:
    """Bytes the optimizer step moves per parameter it updates: fused, the weights (the fp32 master
    where there is one) read and written, the gradient read, the states read and written, the half
    copy written; foreach and loop (Adam family), UNFUSED_ADAM_ACCESSES of each."""
    weights = prec.master_bytes or prec.param_bytes
    half_copy = prec.param_bytes if prec.master_bytes else 0
    if impl == "fused" or optimizer not in _UNFUSED_COUNTED:
        extra = LAMB_EXTRA_ACCESSES * weights if optimizer == "lamb" else 0
        return prec.grad_bytes + 2 * weights + 2 * prec.optim_bytes + half_copy + extra
    moment = prec.optim_bytes / 2
    n = UNFUSED_ADAM_ACCESSES
    return (n["weights"] * weights + n["grad"] * prec.grad_bytes + half_copy
            + (n["exp_avg"] + n["exp_avg_sq"] + n["temporary"]) * moment)


def optimizer_step_temporary_bytes(states: dict[str, float], optimizer: str, impl: str) -> float:
    """Bytes the device allocates for the optimizer step's temporaries: foreach Adam(W), one moment's
    size of the states the device holds (the denominator of the update, computed for all parameters
    before addcdiv applies it; none where the states are offloaded to the host); a fused kernel,
    none; a per-tensor loop, one tensor's at a time (not counted)."""
    if impl != "foreach" or optimizer not in _UNFUSED_COUNTED:
        return 0.0
    return states["optimizer"] / 2


def muon_gemms(spec: ModelSpec, layers: int | None = None, tp: int = 1) -> list[tuple[int, int, int, int]]:
    """The GEMMs of one Muon step's Newton-Schulz iterations over the block matrices of ``layers``
    blocks (default all), as (M, K, N, count). Each iteration on an (m, n) momentum, m <= n:
    A = X X^T, B = bA + cA^2, X = aX + BX -- GEMMs (m, n, m), (m, m, m) and (m, m, n), 4 m^2 n + 2 m^3
    FLOPs; MUON_NS_STEPS of them, in bf16."""
    out = []
    for r, c, k in spec.matrices(layers, embedding=False, head=False, tp=tp):
        m, n = min(r, c), max(r, c)
        out += [(m, n, m, k * MUON_NS_STEPS), (m, m, m, k * MUON_NS_STEPS), (m, m, n, k * MUON_NS_STEPS)]
    return out


def _muon_orthogonalise_s(spec: ModelSpec, acc: Accelerator, s: TrainSetup, lo: Layout, layers: int,
                          replicas: int, bw: float, alpha: float) -> float:
    """Muon's Newton-Schulz work on one device, a step (muon_gemms). The reference implementations
    (Jordan's Muon, modded-nanogpt) hand each matrix to one data-parallel rank and all-gather the
    bf16 updates; under ZeRO the weights' own all-gather carries them (counted with the
    data-parallel traffic), without it the gather comes after the work."""
    rates = tm.kernel_share(device_rates(acc, "bf16", attention=s.attention), s.stack_efficiency)
    work = sum(count * tm.gemm_time_s(m, k, n, rates, 2) for m, k, n, count in muon_gemms(spec, layers, lo.tp))
    matrices = spec.matrices(layers, embedding=False, head=False, tp=lo.tp)
    count = sum(k for *_, k in matrices)
    if replicas <= 1 or not count:
        return work
    gather = tm.allgather_time_s(2 * sum(r * c * k for r, c, k in matrices), replicas, bw, alpha) \
        if lo.zero_stage == 0 else 0.0
    return work / min(replicas, count) + gather


def least_recompute(spec: ModelSpec, acc: Accelerator, layout: Layout, setup: TrainSetup,
                    fits: Callable[[Plan], bool] = lambda p: p.fits) -> Plan:
    """``layout`` under full recomputation of the fewest blocks of each model chunk that fit: the
    other blocks keep their activations and skip the recomputed forward (Megatron-LM's
    --recompute-method block --recompute-num-layers k; NeMo's activations_checkpoint_num_layers).
    Memory falls and time rises with k, so the least k that fits (bisection) is the fastest;
    the plan of every block recomputed when even that does not fit."""
    n = chunk_layers(spec, layout)

    def plan_of(k: int) -> Plan:             # k = n: every block (recompute_layers 0)
        return predict(spec, acc, replace(layout, recompute="full", recompute_layers=k % n), setup, check=False)

    best = plan_of(n)
    if not fits(best):
        return best
    lo, hi = 0, n                                # fits(hi); k = 0 (no recomputation) is not tried here
    while hi - lo > 1:
        mid = (lo + hi) // 2
        plan = plan_of(mid)
        if fits(plan):
            hi, best = mid, plan
        else:
            lo = mid
    return best


def _stage_param_split(spec: ModelSpec, pp: int, virtual_stages: int = 1) -> tuple[float, float]:
    """Parameters of the fuller stage before the last (its blocks + the embedding on the first)
    and of the last stage (its blocks + the output layer); with pp = 1 everything, twice."""
    if pp == 1:
        every = spec.layers * spec.layer_params + spec.embedding_params + spec.head_params
        return every, every
    first, middle, last = mem.stage_layers(spec.layers, pp, virtual_stages)
    # Megatron keeps a copy of a tied embedding on the last stage for the output layer
    last_head = spec.head_params + (spec.vocab * spec.hidden if spec.tied_embeddings and spec.lm_head else 0)
    return (max(first * spec.layer_params + spec.embedding_params, middle * spec.layer_params),
            last * spec.layer_params + last_head)


def predict(spec: ModelSpec, acc: Accelerator, layout: Layout, setup: TrainSetup, *,
            check: bool = True) -> Plan:
    if check:
        check_layout(spec, layout, setup)
    lo, s = layout, setup
    # Muon's momentum is on the block matrices only (AdamW on the embeddings, head and vectors)
    matrices = spec.matrices(embedding=False, head=False) if s.optimizer == "muon" else spec.matrices()
    state = mem.optimizer_state_bytes(s.optimizer, spec.n_params, matrices) / spec.n_params
    prec = mem.precision(s.precision, s.optimizer, state_bytes_per_param=state, grad_dtype=s.grad_dtype)
    e = prec.act_bytes
    rates = tm.kernel_share(device_rates(acc, prec.compute, s.fp8_recipe, s.attention), s.stack_efficiency)
    lowp = prec.compute in mem.LOW_PRECISION_GEMMS                 # fp8 / fp4 block GEMMs
    # the output layer stays bf16 (TE, NeMo)
    head_rates = tm.kernel_share(device_rates(acc, "bf16", attention=s.attention), s.stack_efficiency) if lowp \
        else rates
    n_micro = s.global_batch // (lo.dp * lo.micro_batch)        # micro-batches per replica per step
    vp = lo.virtual_stages if lo.schedule == "interleaved" else 1
    first, middle, last = mem.stage_layers(spec.layers, lo.pp, vp)
    layers_stage = max(first, middle, last)                     # the fullest stage (memory)
    share = recompute_share(spec, lo)                           # of the blocks, those that recompute
    seq_local = s.seq_len // lo.cp                              # tokens of each sequence on one rank
    replicas = lo.replicas                                      # ranks reducing gradients together

    # ---- memory of the busiest device
    # parameters of the fuller stage before the last and of the last; the larger sets the step's
    # gradient and optimizer traffic
    body, head = (n / lo.tp for n in _stage_param_split(spec, lo.pp, vp))
    params_stage = max(body, head)
    acts = mem.activation_bytes_per_device(
        spec, seq_len=seq_local, micro_batch=lo.micro_batch, n_micro=n_micro, tp=lo.tp, pp=lo.pp,
        sequence_parallel=lo.sequence_parallel, recompute=lo.recompute, attention=s.attention,
        act_bytes=e, schedule=lo.schedule, virtual_stages=lo.virtual_stages,
        gemm_input_bytes=prec.gemm_input_bytes, recompute_share=share, loss_kernel=s.loss_kernel)
    held_params, held_acts, held_logits = params_stage, acts["activations"], acts["logits"]
    if lo.pp > 1:
        # the busiest device is a stage before the last (most micro-batches in flight, the
        # embedding on the first) or the last (the output layer and the logits, one micro-batch)
        def held(params: float, activations: float) -> float:
            return sum(mem.model_state_bytes(params, prec, zero_stage=lo.zero_stage, dp=lo.shard_degree).values()) \
                + activations

        if held(head, acts["last_stage_activations"] + acts["logits"]) > held(body, acts["activations"]):
            held_params, held_acts = head, acts["last_stage_activations"]
        else:
            held_params, held_logits = body, 0.0
    states = mem.model_state_bytes(held_params, prec, zero_stage=lo.zero_stage, dp=lo.shard_degree)
    host_bytes = 0.0
    if s.offload != "none":
        # the host keeps the fp32 master, the states and fp32 gradients (and, offloading params,
        # the weights); gradients leave the device bucket by bucket as backward produces them
        host_bytes = states["master_params"] + states["optimizer"] + \
            held_params / (lo.shard_degree if lo.zero_stage >= 2 else 1) * 4
        states = {**states, "grads": 0.0, "master_params": 0.0, "optimizer": 0.0}
        if s.offload == "params":
            host_bytes += states["params"]
            states["params"] = 0.0
    layer_param_bytes = spec.layer_params / lo.tp * DTYPE_COMPUTE_BYTES(prec)
    buffers = 0.0
    # fsdp: two gathered blocks (current + prefetch) and one unsharded block grad; under a
    # pipeline the stage's blocks stay gathered through the step (see dp_exposed)
    gathered = layers_stage if lo.pp > 1 else 2
    if lo.zero_stage == 3:
        buffers += gathered * layer_param_bytes + spec.layer_params / lo.tp * prec.grad_bytes
    elif replicas > 1 or s.offload != "none":   # DDP/ZeRO (and offload) gradient buckets: 25 MB, two in flight
        buffers += 2 * 25 * 2**20
    # autocast keeps a half copy of each weight it used until forward ends (FSDP: of gathered
    # blocks); fp8 / fp4 recipes cache the low-precision weight and its transpose of every block GEMM
    copied_params = gathered * spec.layer_params / lo.tp if lo.zero_stage == 3 else \
        (layers_stage * spec.layer_params / lo.tp if lowp else params_stage)
    buffers += prec.weight_copy_bytes * copied_params
    allocated = sum(states.values()) + held_acts + held_logits + buffers
    # the optimizer step, after backward has freed the activations: torch.optim's foreach Adam(W)
    # holds one temporary the size of a moment over every parameter it updates at once (the
    # denominator, _foreach_sqrt(exp_avg_sq); torch/optim/adamw.py _multi_tensor_adamw), which can
    # outgrow the backward's peak where activations are few (full recompute, FSDP on few ranks)
    step_extra = max(0.0, optimizer_step_temporary_bytes(states, s.optimizer, s.optimizer_impl)
                     - (held_acts + held_logits + buffers))
    allocated += step_extra
    memory_bytes = {**states, "activations": held_acts, "logits_and_loss": held_logits,
                    "buffers": buffers, "optimizer_step": step_extra,
                    "allocator_overhead": allocated * cal.ALLOCATOR_OVERHEAD_FRACTION,
                    "cuda_context": cal.CONTEXT_BYTES}
    memory_bytes["total"] = sum(memory_bytes.values())
    device_bytes = (acc.mem_gb or 0) * 2**30
    limit = device_bytes * (1 - cal.SAFETY_MARGIN_FRACTION)

    # ---- time of one micro-batch through the busiest stage
    lt = tm.layer_times(spec, rates, seq_len=seq_local, micro_batch=lo.micro_batch, tp=lo.tp,
                        sequence_parallel=lo.sequence_parallel, attention=s.attention, e=e, kv_len=s.seq_len,
                        kernels=s.kernels, autocast=prec.autocast, doc_len=s.doc_len)
    # op-level SAC re-runs every second linear (their share of the block's GEMM FLOPs) and every
    # elementwise op, not attention
    op_gemm_s = lt.gemm_fwd_s * op_recomputed_gemm_flops(spec, 1) / sum(g.flops for g in layer_gemms(spec, 1)) \
        if lo.recompute == "op" else 0.0
    recompute_s = {"none": 0.0, "selective": lt.attention_fwd_s, "op": op_gemm_s + lt.elementwise_fwd_s,
                   "full": share * lt.forward_s}[lo.recompute]
    full = share if lo.recompute == "full" else 0.0             # recomputed forwards a block, on average
    n_tp_coll = 4 + 2 * full
    tp_comm_s = n_tp_coll * lt.tp_comm_per_collective_s
    if lo.overlap_comm and tp_comm_s:
        # each collective is split into chunks pipelined with the GEMM it feeds (or that feeds
        # it): what the block's GEMMs cannot cover stays exposed, and at least the first chunk of
        # each collective (a tp-th of it) is; the GEMMs it runs beside slow as under any overlap
        gemm_s = lt.gemm_fwd_s * (1 + full) + lt.gemm_bwd_s
        tp_comm_s = _exposed(tp_comm_s, gemm_s, 1 / lo.tp)
    tokens_micro = seq_local * lo.micro_batch
    # context parallelism: a ring passes every rank's keys and values round the cp group in
    # cp - 1 steps, hidden behind the attention of the chunk in hand (Megatron-Core's and
    # torchtitan's ring attention); backward passes them again with their gradients (2x)
    # Ulysses instead swaps sequence for heads: all-to-alls turn the rank's tokens of every head
    # into every token of cp-th of the heads for q, k and v, and back for the attention output;
    # backward runs the same four on the gradients, a recomputed forward its own again. They are
    # not overlapped (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv 2309.14509, section 3.1); the
    # attention core then does the same cp-th of the work as a ring rank.
    cp_comm_s = 0.0
    if lo.cp > 1 and lo.cp_mode == "ulysses":
        bw, alpha = tm.group_link(rates, lo.cp, lo.tp)
        q_bytes = tokens_micro * spec.q_dim / lo.tp * e
        kv_bytes = tokens_micro * spec.kv_dim / min(lo.tp, spec.n_kv_heads) * e
        swaps = 2 * tm.alltoall_time_s(q_bytes, lo.cp, bw, alpha) + 2 * tm.alltoall_time_s(kv_bytes, lo.cp, bw, alpha)
        cp_comm_s = (2 + full) * swaps
    elif lo.cp > 1:
        bw, alpha = tm.group_link(rates, lo.cp, lo.tp)
        kv_bytes = 2 * tokens_micro * spec.kv_dim / min(lo.tp, spec.n_kv_heads) * e     # K and V
        ring = (lo.cp - 1) * (alpha + kv_bytes / bw)
        cp_comm_s = max(0.0, ring - lt.attention_fwd_s) + max(0.0, 2 * ring - lt.attention_bwd_s)
    head_s, head_speed = 0.0, 1.0
    if spec.lm_head:
        # output GEMM (fwd + 2 bwd) + the loss's traffic over the logits: in fp32, ~6 passes of 4
        # bytes (cast, log-softmax, its gradient, the cast back); compiled with the model, a
        # forward reduction reading the logits twice (max, then the sum of exponentials) and a
        # backward reading them and writing their gradient, in the activation dtype: 4e
        # (a tensor-parallel rank's share of the vocabulary, padded to the stack's multiple; one that
        # is not 16-byte aligned runs cuBLAS's slower kernels: calibration.MISALIGNED_GEMM_SPEED)
        vocab = math.ceil(spec.vocab / (lo.tp * s.vocab_multiple)) * s.vocab_multiple
        loss_bytes = 4 * e if s.loss_kernel == "compiled" else 24
        head_speed = cal.misaligned_gemm_speed(cal.calibration_key(acc), vocab, e)
        gemm_rates = replace(head_rates, matmul_flops_per_s=head_rates.matmul_flops_per_s * head_speed)
        head_s = tm.gemm_time_s(tokens_micro, spec.hidden, vocab, gemm_rates, e) \
            + tm.backward_gemms_time_s(tokens_micro, spec.hidden, vocab, gemm_rates, e) \
            + tokens_micro * vocab * loss_bytes / rates.mem_bytes_per_s
        if s.kernels == "eager":
            head_s += tm.eager_outside_kernels() * cal.KERNEL_FLOOR_S
    # fp8 scaling: every GEMM input is cast to fp8 with its amax (read e, write 1 byte) in forward,
    # the output gradient likewise in backward, and the saved fp8 input transposed for the
    # weight gradient (Hopper's fp8 GEMM is TN-only: read 1, write 1); block weights are cast
    # and transposed once per step (cached across micro-batches), added below with the optimizer.
    # NVFP4 quantises the input and the output gradient twice each (row-wise for the forward and
    # input-gradient GEMMs; column-wise after a 16-point random Hadamard transform for the weight
    # gradient, arXiv 2509.25149 sec. 4): read e, write q, twice, for both.
    cast_layer_s = 0.0
    if prec.compute == "fp8":
        cast_layer_s = sum((e + 1 + 2) * g.m * g.k + (e + 1) * g.m * g.n
                           for g in layer_gemms(spec, tokens_micro, lo.tp)) / rates.mem_bytes_per_s
    elif prec.compute == "fp4":
        q = prec.gemm_input_bytes
        cast_layer_s = sum(2 * (e + q) * (g.m * g.k + g.m * g.n)
                           for g in layer_gemms(spec, tokens_micro, lo.tp)) / rates.mem_bytes_per_s
    # the busiest stage sets the pipeline's pace: the last (its blocks + the output layer) or,
    # where the output layer took a block's place, a fuller stage before it
    layer_micro_s = lt.forward_s + lt.backward_s + recompute_s + tp_comm_s + cp_comm_s + cast_layer_s
    layers_stage = last
    if max(first, middle) * layer_micro_s > last * layer_micro_s + head_s:
        layers_stage, head_s = max(first, middle), 0.0
    cast_s = layers_stage * cast_layer_s
    fwd_s = layers_stage * lt.forward_s
    bwd_s = layers_stage * (lt.backward_s + recompute_s)
    stage_micro_s = fwd_s + bwd_s + layers_stage * (tp_comm_s + cp_comm_s) + head_s + cast_s
    # eager PyTorch: the device waits for the host where a micro-batch's work is shorter than
    # dispatching its ops (calibration.EAGER_OPS_PER_BLOCK, + autocast's casts under the *-amp
    # recipes, + the embeddings, head and loss, charged to the busiest stage as if it held them);
    # a recomputed forward dispatches its block again
    host_wait_s = 0.0
    if s.kernels == "eager":
        ops = tm.eager_block_ops(spec, s.attention) * (1 + full / 3)
        casts = cal.AUTOCAST_OPS_PER_BLOCK * (1 + full / 3) if prec.autocast else 0.0
        host_s = layers_stage * (ops * cal.EAGER_SECONDS_PER_OP + casts * cal.AUTOCAST_SECONDS_PER_OP) \
            + cal.EAGER_OPS_OUTSIDE_BLOCKS * cal.EAGER_SECONDS_PER_OP
        host_wait_s = max(0.0, host_s / s.host_efficiency - stage_micro_s)
        stage_micro_s += host_wait_s
    if lo.pp > 1:               # activations sent forward and gradients back, Megatron's scatter/gather /t
        bw, alpha = tm.group_link(rates, lo.pp, lo.tp * lo.cp * lo.dp)
        p2p = alpha + tokens_micro * spec.hidden * e / lo.tp / bw
        stage_micro_s += 2 * p2p * (lo.virtual_stages if lo.schedule == "interleaved" else 1)

    # ---- data-parallel / sharded communication (hybrid sharding: gathers and reduce-scatters
    # inside the shard group, then one all-reduce of each rank's gradient shard across groups)
    shard = lo.shard_degree
    bw, alpha = tm.group_link(rates, shard if lo.zero_stage == 3 else replicas, lo.tp)
    # the gradients (and, sharded, the weights) travel block by block, a collective each (FSDP
    # wraps every block; DDP's 25 MB and Megatron's 40M-parameter buckets hold a block of a
    # mid-size model or less), and a ring pays its n - 1 latency steps per collective
    alpha *= layers_stage
    # what backward leaves to reduce after its last op, and forward must gather before its first:
    # a block's share, and on the stage that holds it the input embedding's too (its gradient is
    # the last backward produces: the first layer's input, so DDP's last bucket, Megatron's last
    # grad bucket and FSDP's root reduce it after backward ends)
    tail = (spec.layer_params / lo.tp + (spec.embedding_params / lo.tp if params_stage == body else 0.0)) \
        / params_stage
    grad_bytes = params_stage * (prec.grad_bytes if prec.grad_bytes <= 2 else 4)
    half_param_bytes = params_stage * DTYPE_COMPUTE_BYTES(prec)
    bwd_micro_s = bwd_s + head_s
    dp_exposed = 0.0
    if replicas > 1:
        if lo.zero_stage == 3:
            ag = tm.allgather_time_s(half_param_bytes, shard, bw, alpha)
            rs = tm.reducescatter_time_s(grad_bytes, shard, bw, alpha)
            if lo.pp > 1:
                # with a pipeline a stage's weights stay gathered from its first forward to its
                # last backward (torchtitan's reshard_after_forward default under PP; Llama 3
                # paper, section 3.3.2: "we do not reshard after forward computation"): one
                # all-gather and one reduce-scatter a step, each behind a micro-batch of work
                dp_exposed = _exposed(ag, fwd_s, tail) + _exposed(rs, bwd_micro_s, tail)
            else:
                # without one, each block is gathered before its forward and again before its
                # backward (reshard_after_forward=True) and its gradient reduce-scattered, every
                # micro-batch; each collective overlaps the neighbouring block's compute
                dp_exposed = n_micro * (_exposed(ag, fwd_s, tail)
                                        + _exposed(ag + rs, bwd_micro_s, tail))
            if shard < replicas:
                bw_r, alpha_r = tm.group_link(rates, replicas // shard, lo.tp * shard)
                alpha_r *= layers_stage
                ar = tm.allreduce_time_s(grad_bytes / shard, replicas // shard, bw_r, alpha_r)
                dp_exposed += _exposed(ar, bwd_micro_s, tail)
        else:
            def reduced(comm_s: float) -> float:
                """Overlapped with backward, or after it (Layout.overlap_grad_reduce)."""
                return _exposed(comm_s, bwd_micro_s, tail) if lo.overlap_grad_reduce else comm_s

            if lo.zero_stage == 2:     # reduce-scatter every micro-batch
                rs = tm.reducescatter_time_s(grad_bytes, replicas, bw, alpha)
                dp_exposed = n_micro * reduced(rs)
            else:                      # one all-reduce (ZeRO-1: reduce-scatter) in the last backward
                ar = tm.allreduce_time_s(grad_bytes, replicas, bw, alpha)
                dp_exposed = reduced(ar / 2 if lo.zero_stage == 1 else ar)
            if lo.zero_stage in (1, 2):  # updated weights gathered after the optimizer step
                ag = tm.allgather_time_s(half_param_bytes, replicas, bw, alpha)
                # overlapped: each block's weights arrive behind the next step's forward
                dp_exposed += _exposed(ag, n_micro * fwd_s, tail) if lo.overlap_comm else ag

    # DDP's gradient copies into its buckets and back (Layout.grad_bucket_copies), on the device's
    # memory beside backward's kernels
    copies_s = 4 * grad_bytes / rates.mem_bytes_per_s \
        if lo.grad_bucket_copies and replicas > 1 and lo.zero_stage == 0 else 0.0

    # ---- optimizer: streams weights, grads, master and states once each way
    # (offloaded: the host steps it, below)
    opt_params = params_stage / (shard if lo.zero_stage >= 1 else 1)
    opt_bytes = 0.0 if s.offload != "none" or s.optimizer == "none" else \
        opt_params * _optimizer_bytes_per_param(prec, s.optimizer, s.optimizer_impl)
    if lowp:                    # block weights cast and transposed once a step: read 2, write 2 copies
        opt_bytes += layers_stage * spec.layer_params / lo.tp * (2 + prec.weight_copy_bytes)
    offload_s = 0.0
    if s.offload != "none":
        # host offload (calibration: ZeRO-Offload's costs): each micro-batch's reduced gradients
        # cross to the host behind backward; Adam runs on the CPU over the rank's shard at the
        # host's memory bandwidth while the updated half weights cross back chunk by chunk (the
        # longer of the two); offloaded weights also cross up for each forward and backward gather
        link = rates.host_link_bytes_per_s or cal.HOST_LINK_GB_PER_S * 1e9 / 2 * cal.LINK_BW_FRACTION
        half = DTYPE_COMPUTE_BYTES(prec)
        down = opt_params * half / link
        host_bw = cal.HOST_MEMORY_BYTES_PER_S / min(lo.n_devices, rates.gpus_per_node)
        offload_s = n_micro * _exposed(down, bwd_micro_s, tail) + max(
            opt_params * cal.CPU_ADAM_BYTES_PER_PARAM / host_bw, opt_params * half / link)
        if s.offload == "params":
            up = params_stage / shard * half / link
            offload_s += n_micro * (_exposed(up, fwd_s, tail) + _exposed(up, bwd_micro_s, tail))
    optimizer_s = opt_bytes / rates.mem_bytes_per_s
    if s.optimizer_impl == "loop" and opt_bytes:
        # the host dispatches each parameter tensor's ops in turn; the device's passes run behind it,
        # and the slower of the two sets the step (embeddings, head and final norm: 4 tensors more)
        tensors = layers_stage * spec.layer_tensors + 4
        host_s = tensors * (LOOP_OPS_PER_TENSOR * cal.HOST_SECONDS_PER_OP
                            + LOOP_LAUNCHES_PER_TENSOR * cal.KERNEL_LAUNCH_S) / s.host_efficiency
        optimizer_s = max(optimizer_s, host_s)

    if s.optimizer == "muon" and s.offload == "none":
        optimizer_s += _muon_orthogonalise_s(spec, acc, s, lo, layers_stage, replicas, bw, alpha)

    pipe_s = tm.pipeline_time_s(stage_micro_s, lo.pp, n_micro, lo.schedule, lo.virtual_stages)
    step_s = pipe_s + dp_exposed + optimizer_s + offload_s + copies_s
    breakdown = {
        "compute": n_micro * layers_stage * (lt.gemm_fwd_s + lt.gemm_bwd_s + lt.attention_fwd_s + lt.attention_bwd_s
                                             + (recompute_s if lo.recompute == "selective" else 0)
                                             + op_gemm_s
                                             + full * (lt.gemm_fwd_s + lt.attention_fwd_s)),
        "memory_bound": n_micro * (layers_stage * lt.elementwise_fwd_s * (3 + (full or lo.recompute == "op"))
                                   + head_s) + copies_s,
        "tp_comm": n_micro * layers_stage * tp_comm_s,
        "pipeline_bubble": pipe_s - n_micro * stage_micro_s,
        "pp_comm": n_micro * (stage_micro_s - host_wait_s - fwd_s - bwd_s - layers_stage * (tp_comm_s + cp_comm_s)
                              - head_s - cast_s),
        "host_dispatch": n_micro * host_wait_s,
        "cp_comm": n_micro * layers_stage * cp_comm_s,
        "casts": n_micro * cast_s,
        "dp_comm_exposed": dp_exposed,
        "optimizer": optimizer_s,
        "host_offload": offload_s,
    }

    # ---- derived
    tokens_step = s.global_batch * s.seq_len
    model_flops = train_flops(spec, s.global_batch, s.seq_len, "full")
    hw_flops = hardware_flops(spec, s.global_batch, s.seq_len, lo.recompute, "full", share)
    n_dev = lo.n_devices
    peak = acc.peak_flops_per_s(prec.compute)
    plan_mfu = mfu_of(model_flops / step_s / n_dev, peak)
    plan_hfu = mfu_of(hw_flops / step_s / n_dev, peak)
    power = board_power_w(acc, plan_hfu, prec.compute)
    plan = Plan(model=spec.name, hardware=acc.key, layout=lo.name, layout_detail=lo, n_devices=n_dev,
                memory_bytes=memory_bytes, memory_limit_bytes=limit, device_memory_bytes=device_bytes,
                fits=memory_bytes["total"] <= limit, step_time_s=step_s, time_breakdown_s=breakdown,
                tokens_per_step=tokens_step, tokens_per_s=tokens_step / step_s,
                tokens_per_s_per_device=tokens_step / step_s / n_dev, model_flops_per_step=model_flops,
                hardware_flops_per_step=hw_flops, mfu=plan_mfu, hfu=plan_hfu, peak_flops_per_s=peak,
                power_w_per_device=power, host_memory_bytes=host_bytes)
    price = hourly_price(s, acc)
    plan.price_per_gpu_hour = price
    if s.tokens:
        # steady-state steps over the share of wall-clock that trains (calibration.goodput)
        plan.goodput = s.goodput_on(n_dev)
        plan.time_to_train_s = s.tokens / plan.tokens_per_s / plan.goodput
        plan.gpu_hours = plan.time_to_train_s * n_dev / 3600
        plan.cost_usd = plan.gpu_hours * price if price is not None else None
        if power:
            plan.energy_kwh = power * n_dev * plan.time_to_train_s / 3.6e6
            plan.co2_kg = plan.energy_kwh * s.grid_g_per_kwh / 1000
    if price is None:
        plan.notes.append(f"no catalog price for {acc.key}: pass --price-per-hour for a cost.")
    if head_speed < 1:
        plan.notes.append(f"the output layer's {vocab:,} vocabulary columns a device holds are not a multiple "
                          f"of 8: its GEMMs run cuBLAS's unaligned kernels, planned at {head_speed:.2f} of the aligned "
                          f"rate on {acc.key} (calibration.MISALIGNED_GEMM_SPEED); pad the vocabulary "
                          "(--vocab-multiple 64 plans it so).")
    return plan


def hourly_price(setup: TrainSetup, acc: Accelerator) -> float | None:
    """The user's price (0 included: owned hardware) or else the catalog's; None when neither."""
    return setup.price_per_hour if setup.price_per_hour is not None else acc.price_usd_per_gpu_hour


def DTYPE_COMPUTE_BYTES(prec: mem.Precision) -> float:  # noqa: N802 - reads like the table it is
    """Bytes of a weight in the compute dtype (what FSDP gathers, what autocast copies)."""
    return mem.DTYPE_BYTES["bf16" if prec.compute in mem.LOW_PRECISION_GEMMS else prec.compute]


# ------------------------------------------------------------------------------ inference sizing

@dataclass(slots=True, kw_only=True)
class InferencePlan:
    model: str
    hardware: str
    tp: int
    weights_bytes: float
    kv_cache_bytes: float
    activation_bytes: float
    total_bytes_per_device: float
    memory_limit_bytes: float
    fits: bool
    decode_tokens_per_s: float        # batch x steps/s, memory-bound decode (weights + KV read per step)

    def to_dict(self) -> dict:
        return asdict(self)


def predict_inference(spec: ModelSpec, acc: Accelerator, *, batch: int, context: int, dtype: str = "bf16",
                      kv_dtype: str | None = None, tp: int = 1) -> InferencePlan:
    """Weights + KV cache for ``batch`` sequences of ``context`` tokens, split over ``tp`` devices."""
    check_count("batch", batch, MAX_SEQUENCES)
    check_count("context", context, MAX_SEQ_LEN)
    check_count("tp", tp, MAX_DEVICES)
    if (kv_dtype or dtype) not in mem.DTYPE_BYTES:
        raise ConfigError(f"unknown KV-cache dtype {kv_dtype!r}; use one of {', '.join(mem.DTYPE_BYTES)}.")
    if spec.heads % tp:
        raise ConfigError(f"tp={tp} does not divide the {spec.heads} attention heads of {spec.name}.")
    w = mem.weights_bytes(spec.n_params, dtype) / tp
    kv = mem.kv_cache_bytes(spec, batch=batch, context=context,
                            dtype_bytes=mem.DTYPE_BYTES[kv_dtype or dtype]) / tp
    # prefill working set of one layer: (batch, context, h + f) activations; logits of one step
    act = batch * context * (spec.hidden + spec.ffn_hidden) * 2 / tp + batch * spec.vocab * 4
    total = w + kv + act + cal.CONTEXT_BYTES
    limit = (acc.mem_gb or 0) * 2**30 * (1 - cal.SAFETY_MARGIN_FRACTION)
    bw = cal.streaming_bytes_per_s(acc)
    step_s = (w + kv) / bw          # every decode step reads all weights and the whole cache
    return InferencePlan(model=spec.name, hardware=acc.key, tp=tp, weights_bytes=w, kv_cache_bytes=kv,
                         activation_bytes=act, total_bytes_per_device=total, memory_limit_bytes=limit,
                         fits=total <= limit, decode_tokens_per_s=batch / step_s)
