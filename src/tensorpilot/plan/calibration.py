"""The planner's calibration constants: few, global, each with its physical reason and source.

Nothing here is per model or per published run. Changing a value changes every prediction; the
validation table in docs/planner.md (``tensorpilot plan validate``) shows the effect.
"""

from __future__ import annotations

# ------------------------------------------------------------------------------ compute ceilings

# Maximum achievable matmul FLOP/s as a fraction of the dense datasheet peak, measured with large
# bf16 GEMMs (stas00/ml-engineering "MAMF" table; see shared reference measured_ceilings.md):
#   H100 SXM 794.5 / 989.4 = 0.80, A100 SXM 271.2 / 312 = 0.87, A100 PCIe 252.9 / 312 = 0.81,
#   MI300X 668-782 / 1307 = 0.51-0.60 (0.55 taken).
# The same table: MI250X 147.0 / 191.5 = 0.77 per GCD (ROCm 6.2; one matmul runs on one of its
# two GCDs). GH200 (821.0 / 989 = 0.83 there) is catalogued as a variant of the H100 die and
# takes its fraction.
# H200 has the H100's SXM5 compute die and clocks: its H100 fraction is ASSUMED.
# Blackwell (sm_100): OpenXLA's GEMM cost-model table (xla/backends/gpu/cost_model/
# matmul_interpolator_data.h, measured FLOP/s by shape) gives 1417 TFLOP/s bf16 and 2765 fp8
# (e4m3) at 4096^3 = 0.63 / 0.61 of B200's 2250 / 4500 dense peaks; the same table's sm_90 entry
# at 4096^3 is 780 = 0.79 of H100's 989, the MAMF figure above, so the shapes compare. The
# fraction below is the large-K rate those imply under Blackwell's measured half-depth
# (GEMM_HALF_DEPTH_PER_BALANCE_BY_PART): 0.63 x (4096 + 239) / 4096 = 0.67 bf16, 0.61 x (4096 +
# 478) / 4096 = 0.68 e4m3. With a GEMM's fixed cost (GEMM_OVERHEAD_S) on top, a 4096^3 GEMM then
# runs at 0.96 (bf16) and 0.90 (e4m3) of the table's rate; taking the fixed cost out of the table's
# times instead (0.70 / 0.76) planned the validation file's B200 runs (NeMo 25.x, MLPerf) faster
# than published (585 rows changed, 230 closer, benchmarks/RESULTS.md "Thirty-fifth pass"), so the
# fractions stay as derived. GB200 is the same sm_100 silicon at a higher power limit: its B200
# fractions are ASSUMED. B300/GB300 (sm_103) are not in the table: default.
# The same table's 2026 edition (stas00/ml-engineering compute/accelerator/README.md at 744d01e,
# bf16) adds parts that had no measurement here, as a fraction of the catalog's peak: MI325X 784.9
# / 1307 = 0.60 (ROCm 6.2.4, TunableOp), MI355X 1565 / 2517 = 0.62 (ROCm 7.0.2; the table divides by
# 2300), Gaudi 2 418.7 / 432 = 0.97, Gaudi 3 1243 / 1835 = 0.68 (it runs at 1600 MHz, the table
# says, not the 1750 its datasheet peak implies). MI350X is the MI355X's die at 2200 MHz and a lower
# power limit: its fraction of its own peak is ASSUMED the same, 0.62. Its B200 entry (1745 / 2250
# = 0.78, torch 2.7.1 + CUDA 12.8) is higher than OpenXLA's: B200 keeps OpenXLA's, which the NeMo 25.x and MLPerf B200
# runs of the validation file follow; newer stacks may run faster (benchmarks/RESULTS.md, ninth pass).
# V100 (Volta): cuBLAS GEMMs on the tensor cores "deliver up to 83 Tflops/s in mixed precision" of
# the 125 peak (Markidis et al. 2018, NVIDIA Tensor Core Programmability, Performance & Precision,
# IPDPSW, arXiv 1803.04014, abstract; CUDA 9 cuBLAS): 0.66. Its fp32 GEMMs: MAMF_FRACTION_FP32.
# T4 (Turing, a 70 W card): a 4096^3 fp16 cuBLAS GEMM run back to back holds ~24 of the 65 TFLOP/s
# datasheet peak, 0.37, because the card's power cap pulls its clock towards the 585 MHz base from
# the 1590 MHz boost the peak assumes (NVIDIA developer forums, "About GPU peak performance",
# thread 264462, 2023, with NVIDIA's answer naming the power cap).
# Intel Max 1550, one tile (Aurora): ALCF's node benchmarks (argonne-lcf/user-guides
# docs/aurora/node-performance-overview, oneMKL GEMM, pre-production SDK) measure BF16GEMM 273
# TFLOP/s on one tile alone and 2645 on the node's 12 tiles at once (220 a tile: the cards' power
# and clocks shared, as in training, which runs every tile): 220 / 419.4 = 0.53 (TF32GEMM 1311 /
# 12 / 209.7 = 0.52 agrees).
# Workstation, GeForce and inference parts: a crowd-sourced table of torch.mm throughput
# (zzc0721/torch-performance-test-data database.md at 0785868; its test.py times 30 square GEMMs of
# each size 1024-10240 after 6 warm-up and keeps the best size; PyTorch 2.2-2.8), bf16 over the
# catalog's dense peak (a GeForce card's fp32-accumulate rate), the median of a part's entries:
# RTX 4090 166.6 / 165.2 = 1.01 (four entries), RTX 3090 76.6 / 71 = 1.08 (three), RTX 3080 Ti
# 76.5 / 68.2 = 1.12, RTX 5090 239.1 / 209.5 = 1.14 (two), RTX PRO 6000 Blackwell Workstation
# 418.0 / 503.8 = 0.83, RTX A6000 123.3 / 154.8 = 0.80, L40S 269.2 / 362 = 0.74, H20 141.9 / 148 =
# 0.96. GeForce cards boost past the clock their datasheet peak assumes, hence fractions above 1.
# The same table's H100 (784-789) and H200 (790) entries are 0.80 of 989, the MAMF figure above,
# so the two compare.
MAMF_FRACTION: dict[str, float] = {
    "h100-sxm": 0.80, "h200-sxm": 0.80, "a100-sxm4-80gb": 0.87, "a100-sxm4-40gb": 0.87,
    "a100-pcie-80gb": 0.81, "a100-pcie-40gb": 0.81, "mi300x": 0.55, "b200": 0.67, "gb200": 0.67,
    "mi250x-gcd": 0.77, "v100-sxm2-32gb": 0.66, "mi325x": 0.60, "mi355x": 0.62, "mi350x": 0.62, "gaudi2": 0.97,
    "gaudi3": 0.68, "t4": 0.37, "max-1550-tile": 0.53, "rtx-4090": 1.01, "rtx-3090": 1.08,
    "rtx-3080-ti": 1.12, "rtx-5090": 1.14, "rtx-pro-6000-blackwell": 0.83, "rtx-a6000": 0.80, "l40s": 0.74,
    "h20": 0.96,
}
# fp32 GEMMs off the tensor cores (SIMT SGEMM, torch's default: TF32 off for matmuls): Volta's
# cuBLAS SGEMM reaches ~1/7 of its 83 TFLOP/s mixed-precision rate, 0.76 of the 15.7 fp32 peak
# (Markidis et al. 2018, above). The torch.mm table above, fp32 column over the catalog's fp32
# peak: A100 (SXM4 80GB 19.18, A800 19.08, 40GB 18.11) 0.98, H100 SXM (52.11; 51.88 in the table's
# issue #79) 0.78, H200 51.34 / 66.9 = 0.77, H20 31.95 / 44 = 0.73, B200 66.24 / 75 = 0.88. Parts
# since GA102 count two fp32 FMAs a clock on half their lanes, which GEMMs cannot keep fed: RTX
# 3090 24.79 / 35.6 = 0.70, RTX 4090 54.77 / 82.6 = 0.66, RTX 3080 Ti 24.37 / 34.1 = 0.71, RTX 5090
# 68.4 / 105.2 = 0.65, RTX PRO 6000 Blackwell 77.24 / 125 = 0.62, RTX A6000 23.92 / 38.7 = 0.62,
# L40S 46.88 / 91.6 = 0.51. Other parts: their bf16 fraction (ASSUMED).
MAMF_FRACTION_FP32: dict[str, float] = {
    "v100-sxm2-32gb": 0.76, "a100-sxm4-80gb": 0.98, "a100-sxm4-40gb": 0.98, "a100-pcie-80gb": 0.98,
    "a100-pcie-40gb": 0.98, "h100-sxm": 0.78, "h200-sxm": 0.77, "h20": 0.73, "b200": 0.88, "rtx-3090": 0.70,
    "rtx-4090": 0.66, "rtx-3080-ti": 0.71, "rtx-5090": 0.65, "rtx-pro-6000-blackwell": 0.62, "rtx-a6000": 0.62,
    "l40s": 0.51,
}
# Devices without a measurement: an ASSUMED fraction between the measured NVIDIA parts.
DEFAULT_MAMF_FRACTION = 0.80
# fp8 (e4m3) GEMMs through cuBLASLt, 8192^3, TN layout (the only one Hopper's fp8 GEMM takes):
# 1599-1630 TFLOP/s on 16 H100 SXM = 0.81 of the 1979 dense peak (public cuBLASLt cross-check
# report, gitea.d-robotics.cc han.zhao/test_gpu_scripts, 2026-05); the same hosts measured
# 1170-1180 (0.59) through torch._scaled_mm, so a recipe's GEMM path matters. Transformer Engine
# calls cuBLASLt: 0.81 for Hopper; torchao's float8 training (torchtitan, OLMo-core) calls
# torch._scaled_mm: 0.59. Other parts: their bf16 fraction (ASSUMED).
MAMF_FRACTION_FP8: dict[str, float] = {"h100-sxm": 0.81, "h200-sxm": 0.81, "b200": 0.68, "gb200": 0.68}
MAMF_FRACTION_FP8_SCALED_MM: dict[str, float] = {"h100-sxm": 0.59, "h200-sxm": 0.59}
# fp8 training recipes by the GEMM path they take: Transformer Engine (NeMo, Megatron, llm-foundry)
# or torchao's Float8Linear (torch._scaled_mm)
FP8_RECIPES = ("te", "torchao")

# A training step runs the tensor cores for minutes at full load, a GEMM benchmark for a burst:
# under the power cap clocks settle 5-15% below boost on A100/H100 (public nvidia-smi traces of
# training jobs), kernels leave small gaps between them, and a step's GEMMs have the model's
# shapes where MAMF is the best of a sweep. One global factor on every compute rate, CHOSEN within
# that physical range: the 43 reference rows fit anywhere in 0.85-0.90 (median error 2.6-3.3%);
# the ~1,060 other published runs of the validation file (91 sources) are predicted faster than
# measured at 0.90 (the median source by +10%; 70 of 91 sources fast) and still by +5% at 0.85,
# the range's low end, taken. Checked afterwards on a blind set (benchmarks/RESULTS.md, holdout11).
SUSTAINED_COMPUTE_FRACTION = 0.85

# A GEMM's efficiency by its reduction depth K: k / (k + K_half). Each output tile pays fixed costs
# (pipeline fill, epilogue: writing the tile) beside a main loop that grows with K, so a shallow
# GEMM runs far below the large-GEMM rate however many tiles it has; its width (M, N) matters
# little once the tiles fill the device. The fixed costs are memory time, so in units of K they
# grow with the device's machine balance (peak FLOP/s of the compute dtype over HBM bytes/s):
# K_half = GEMM_HALF_DEPTH_PER_BALANCE x balance. Measured: OpenXLA's GEMM cost-model table for
# sm_90 (tensorflow/tensorflow third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h,
# commit 372d578b, bf16, 375 shapes b x m x n x k up to 4 x 4096^3): over the 45 shapes with
# b x m >= 8192 rows and n >= 1024 (a training GEMM's regime), this model at the MAMF rate
# (0.80 of 989) with the HBM roofline fits K_half 140-160 (median |error| 3.5%; a fixed smallest-
# dimension half-size of 64 was 8.9% fast): 150 / 295 (H100's 989 TFLOP/s over 3.35 TB/s) = 0.5.
# H100, K = 1024: 0.87; A100 (balance 153): K_half 77, K = 1024: 0.93; fp8 doubles it. The
# balance scaling to other devices is the physical argument above, ASSUMED where not measured.
GEMM_HALF_DEPTH_PER_BALANCE = 0.5
# Measured per part. Blackwell (sm_100) in the same table's 2025 version (xla/backends/gpu/
# cost_model/matmul_interpolator_data.h, 375 shapes each of bf16 and e4m3): a deeper half-depth,
# its 2-CTA 256-wide MMA tiles paying more fixed cost a tile. On the 45 training-sized shapes
# (2 x 4096 rows, n 4096) bf16 runs 0.56 / 0.65 / 0.82 / 0.95 / 1.03 and e4m3 0.33 / 0.56 / 0.87
# / 1.06 / 1.14 of its 4096^3 rate at k = 256 ... 4096 (sm_90 bf16: 0.59 / 0.78 / 0.87 / 0.96 /
# 1.02): K_half fits 240 bf16 (median |error| 8%; 0.5 x balance, 141, was +15% fast) and ~450
# e4m3 (14%; 281 was +16% fast), 0.85 and 0.8 of B200's balance: 0.85. GB200: ASSUMED as B200.
GEMM_HALF_DEPTH_PER_BALANCE_BY_PART: dict[str, float] = {"b200": 0.85, "gb200": 0.85}
# A 16-bit GEMM with a dimension that is not a multiple of 8 elements (16 bytes) cannot take the
# tensor-core kernels' 16-byte vector loads (Ampere) or TMA copies (Hopper): cuBLAS runs it on older,
# slower kernels. A language model's output layer meets this wherever its vocabulary is not a
# multiple of 8 (GPT-2's 50,257, RoBERTa's 50,265, BERT's 30,522) and the stack does not pad it
# (TrainSetup.vocab_multiple). Its three GEMMs then run at this share of the aligned rate:
# - Hopper: measured on an H200 (torch 2.11, CUDA 13's cuBLAS; `python benchmarks/gpu_rates.py
#   align`, benchmarks/results/gpu_h200_20261128_lease5/align.json): 8,192 tokens at hidden 768 /
#   1600, vocabulary 50,257 against 50,304: forward 7.5 / 8.0x, input gradient 5.6 / 5.4x, weight
#   gradient 5.4 / 5.2x slower, the three 6.2x together: 0.16 (the forward ran a Turing-era
#   cutlass sm75 kernel). Hugging Face GPT-2's whole step (8 x 1024 tokens) went 59.2 -> 48.3 ms.
# - Ampere: "padding these matmuls achieves nearly a 3x speedup" on an A100 SXM4 80GB (PyTorch blog,
#   "Accelerating Large Language Models with Accelerated Transformers", 2023-04-18: nanoGPT's step
#   113 -> 87 ms): 0.35. Ada's tensor cores run Ampere's kernels: ASSUMED the same.
# Other parts are left at the aligned rate, unmeasured (Volta's cuBLAS before 11.0 skipped the
# tensor cores altogether; XLA pads a GEMM's dimensions itself).
_HOPPER = ("h100-sxm", "h100-pcie", "h100-nvl", "h200-sxm", "h20")
_AMPERE_ADA = ("a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-80gb", "a100-pcie-40gb", "a10", "a30", "rtx-a6000",
               "rtx-a5000", "rtx-3090", "rtx-3090-ti", "rtx-3080-ti", "rtx-3080-ti-laptop",
               "l4", "l40", "l40s", "rtx-4090", "rtx-6000-ada")
MISALIGNED_GEMM_SPEED: dict[str, float] = {**dict.fromkeys(_HOPPER, 0.16), **dict.fromkeys(_AMPERE_ADA, 0.35)}
GEMM_ALIGN_BYTES = 16


def unaligned(elements: int, elem_bytes: float) -> bool:
    """Whether ``elements`` of ``elem_bytes`` (a row's width, a leading dimension, an offset) miss a
    GEMM_ALIGN_BYTES boundary."""
    return elements * elem_bytes % GEMM_ALIGN_BYTES != 0


def misaligned_gemm_speed(catalog_key: str | None, dim: int, elem_bytes: float) -> float:
    """Share of the aligned rate at which a GEMM with a ``dim`` of ``elem_bytes`` elements runs on
    the part (1 where the dimension is aligned, the GEMM is not 16-bit, or the part is unmeasured)."""
    if elem_bytes != 2 or not unaligned(dim, elem_bytes):
        return 1.0
    return MISALIGNED_GEMM_SPEED.get(catalog_key or "", 1.0)

# Fused attention (FlashAttention-2 class, causal, head_dim 128), forward + backward, as a fraction
# of the dense datasheet peak: A100 50-73% (Dao 2023, FlashAttention-2, section 4.1) -> 0.60;
# H100 ~35% (Shah et al. 2024, FlashAttention-3, section 1: "FlashAttention-2 achieving only 35%
# utilization on H100"); H200 ASSUMED as H100. Other devices: ASSUMED 0.5.
FLASH_ATTENTION_PEAK_FRACTION: dict[str, float] = {
    "a100-sxm4-80gb": 0.60, "a100-sxm4-40gb": 0.60, "a100-pcie-80gb": 0.60, "a100-pcie-40gb": 0.60,
    "h100-sxm": 0.35, "h100-pcie": 0.35, "h100-nvl": 0.35, "h200-sxm": 0.35,
}
DEFAULT_FLASH_ATTENTION_PEAK_FRACTION = 0.50
# FlashAttention-2 itself (flash-attn 2.x, Hugging Face's attn_implementation "flash_attention_2") is
# written for Ampere's warp-level mma.sync. Blackwell (sm_100) runs it without its tcgen05 tensor-core
# path, at about the kernel's Hopper speed rather than the part's: on a B200, flash-attn 2.7.4 forward +
# backward 260-346 TFLOP/s at head_dim 64, 512-16K tokens (Dao-AILab/flash-attention issue #1589,
# 2025-04), forward 352-362 TFLOP/s at head_dim 128, 2K-8K tokens (meta-pytorch/tritonbench pull
# request #171, 2025-03), where FlashAttention-4 reaches 1,420-1,530 forward and 1,120-1,360 backward
# on the same part (flash-attention pull request #2280, 2026-02). A run naming FlashAttention-2 attends
# at this rate (FLOP/s, forward + backward, head_dim 128) on these parts; elsewhere the fractions above
# are FlashAttention-2's own. GB200: ASSUMED as B200.
FLASH2_ATTENTION_FLOPS: dict[str, float] = {"b200": 340e12, "gb200": 340e12}
# FlashAttention-2's backward runs 5 matmuls to the forward's 2 (it recomputes the scores).
FLASH_BACKWARD_RATIO = 2.5
# The rates above are at head_dim 128. A fused kernel does 4d (forward) to 10d (backward) matmul
# FLOPs per score element against a fixed per-element cost (exp on the special-function units,
# rescaling, casting P), so its rate at head width d goes as d / (d + d0). On an H100 SXM5 at 16k
# tokens (Shah et al. 2024, FlashAttention-3, figures 5-6) forward + backward at head_dim 64 runs
# at 0.90x the head_dim-128 rate with FlashAttention-2 (324 / 370 forward, 291 / 322 backward
# TFLOP/s; d0 = 17) and 0.82x with FlashAttention-3 (497 / 648, 474 / 561; d0 = 35): d0 = 25,
# between the two. Wider heads gain with FlashAttention-3 (+17% forward at 256) and lose with
# FlashAttention-2 (-12%): above 128 the rate is left at the 128 one.
FLASH_HEAD_DIM_REF = 128
FLASH_HEAD_DIM_HALF = 25.0


def flash_head_dim_factor(head_dim: int) -> float:
    """A fused attention kernel's rate at ``head_dim`` over its rate at 128 (at most 1)."""
    if head_dim >= FLASH_HEAD_DIM_REF or head_dim <= 0:
        return 1.0
    d0, ref = FLASH_HEAD_DIM_HALF, FLASH_HEAD_DIM_REF
    return (head_dim / (head_dim + d0)) / (ref / (ref + d0))
# First-generation fused attention kernels (FlashAttention 1.x, its 2022 Triton port, xformers'
# cutlass memory-efficient kernel, PyTorch 2.0-2.1's SDPA, which shipped FlashAttention 1) run at
# this share of the FlashAttention-2 rate: "around 2x speedup compared to FlashAttention" (Dao
# 2023, FlashAttention-2, abstract; section 4.1 gives 1.7-3.0x over FlashAttention on A100).
FIRST_GEN_FLASH_SPEED = 0.5

# A kernel's fixed cost (launch, ramp and tail), paid on top of its memory time by every kernel that
# is not a GEMM (GEMM_OVERHEAD_S below is a GEMM's): 5 us, the fixed cost OpenXLA's table measures for
# a GEMM. The traced planner charges it on every op (modelplan.costs); the formula planner on the
# memory-bound kernels of an eager block (timing.eager_block_kernels); a fused attention kernel never
# takes less. PyTorch's own cost model for automatic parallelisation takes a memory-bound op on an
# H100 as no less than 7 us, plus a 1 us launch gap in its graph estimate (meta-pytorch/autoparallel
# autoparallel/cost_models/compute_estimation.py and graph_passes/estimate_graph_metrics.py at
# a54c252, values fitted on H100 runs: pull request #146, 2025-09).
KERNEL_FLOOR_S = 5e-6
# A GEMM's fixed cost on top of its roofline time, paid by every GEMM kernel whatever its size:
# its first tiles' pipeline fill, the last wave's tail and the epilogue. OpenXLA's measured GEMM
# table (xla/service/gpu/model/matmul_interpolator_data.h, read at ROCm/xla ea2c45f, bf16, 375
# shapes b x m x n x k from 256^3 to 4 x 4096^3) runs the smallest at 5.0 us and the mid-size ones
# (10-30 us) a near-constant ~5 us over the roofline above (MAMF x k / (k + K_half), HBM bytes).
# As a floor, max(roofline, 5 us), that roofline misses the 375 H100 (sm_90) shapes by 33%
# (median, all planned fast) and the B200's by 36%; with 5 us added, by 5.0% (+0.7% signed) and
# 4.0%. A step of a small model (a 768-wide GEMM of 8k tokens takes ~40 us) pays it ~10%.
GEMM_OVERHEAD_S = 5e-6

# Eager PyTorch dispatches every op from the host, and the device cannot run ahead of that: a
# block's forward and backward cost the host its op count x the time one op takes to dispatch.
# Ops a block dispatches (aten ops incl. views, forward + backward, counted with a TorchDispatchMode
# on Hugging Face transformers 4.57.6's models: benchmarks/eager_op_count.py), by MLP and by
# whether attention is one fused SDPA call or materialised op by op: Llama 76 + 141 (gated MLP,
# RMSNorm and RoPE composite) / 101 + 164; GPT-2 74 + 97 / 74 + 98, OPT 54 + 99 / 70 + 117, BERT
# 67 + 115 / 67 + 114 (plain: the three's mean). One op on a GPU server's host: 9.7 us before the
# launch, measured on an H100's host (16-core Xeon at 2.1 GHz, torch 2.11, benchmarks/RESULTS.md
# "First GPU lease"): the host-bound tensorpilot gpt at 4 and 6 blocks took 15.4 and 20.1 ms a
# step, 2.33 ms a block for its 169 ops + 35 autocast casts, which at this model's launch costs
# below leaves 9.7 us an op. A desktop CPU dispatches faster: ~4.5 us for eager `x + 1` on an
# i9-11900K at 5.3 GHz (J. Ansel, "Micro-optimizations for the most micro of benchmarks",
# dev-discuss.pytorch.org, 2023), 4-6 us on this project's development CPUs; training steps run
# on server hosts, at server clocks.
EAGER_OPS_PER_BLOCK = {("gated", "fused"): 217, ("plain", "fused"): 169,
                       ("gated", "materialized"): 265, ("plain", "materialized"): 180}
HOST_SECONDS_PER_OP = 9.7e-6
# On a GPU, an op that computes also pays the driver's launch: a bare cuLaunchKernel takes 3.0-3.3 us
# of host time (0 / 19 kernel arguments, GB200; meta-pytorch/tritonbench pull request #1017, 2026,
# "irreducible CUDA driver cost"). Of the ops EAGER_OPS_PER_BLOCK counts, 46-58% launch a kernel
# (views, transposes and detach do not; benchmarks/eager_op_count.py): half.
KERNEL_LAUNCH_S = 3e-6
LAUNCHING_OP_SHARE = 0.5
# what one counted eager op costs the host on a GPU: 11.2 us
EAGER_SECONDS_PER_OP = HOST_SECONDS_PER_OP + LAUNCHING_OP_SHARE * KERNEL_LAUNCH_S
# torch.autocast (the *-amp recipes) adds the casts it inserts before and after the ops on its
# lists: 25-43 more ops a block, forward + backward, for the four families above (34 / 37 Llama,
# 31 / 25 GPT-2, 34 / 37 OPT, 43 / 34 BERT, fused / materialised attention), every one a copy
# kernel (the launching share rises by exactly them: benchmarks/eager_op_count.py): 35
AUTOCAST_OPS_PER_BLOCK = 35
AUTOCAST_SECONDS_PER_OP = HOST_SECONDS_PER_OP + KERNEL_LAUNCH_S
# ops outside the blocks a micro-batch dispatches, forward + backward: embeddings, the final norm,
# the output layer and the loss (45-94 by family and attention, same script): 65
EAGER_OPS_OUTSIDE_BLOCKS = 65

# ------------------------------------------------------------------------------ the user's stack

# The rates above are a tuned recipe's: the validation file's runs from the performance tables of
# the teams that tuned them -- NVIDIA's NeMo / Megatron-Bridge tables, DGX Cloud benchmarking
# recipes and Megatron-LM's papers, MLPerf submissions, MosaicML's llm-foundry, torchtitan's and
# MaxText's docs (validate.row_stack) -- centre on them: median speed error +0.0% over 2,183 speed
# rows outside the reference split (the 10,418-row file at a9a3a95). Every other stack (users' and labs' runs of the same frameworks,
# DeepSpeed, Hugging Face, their own code; the recipes' pull requests and issue threads) runs slower
# than planned: +12.5% over 6,308 rows of 2,269 sources, +11.4% in the passes collected before
# holdout55 and +16.6% after. A plan that knows no more of its stack (no measured step: plan.anchor)
# runs its kernels at this share of the recipe's rates: the stack efficiency at which those rows'
# median speed error is zero, 0.878 (0.886 from the passes before holdout55 alone, which takes the
# later passes' median |error| from 22.0% to 17.0%): benchmarks/stack_prior.py, benchmarks/
# RESULTS.md "Fortieth pass". `plan --stack recipe`, and `plan validate` on a recipe's row, keep the
# full rates.
TYPICAL_STACK_EFFICIENCY = 0.88
STACKS = ("typical", "recipe")


def stack_efficiency(stack: str) -> float:
    """The share of the planner's kernel rates a stack of kind ``stack`` (STACKS) reaches unmeasured."""
    return 1.0 if stack == "recipe" else TYPICAL_STACK_EFFICIENCY


# ------------------------------------------------------------------------------ memory traffic

# Achievable fraction of datasheet HBM bandwidth for streaming kernels: measured copies reach
# 85-92% on H100/H200 (measured_ceilings.md); 0.88.
MEMORY_BW_FRACTION = 0.88
# Parts whose measured streaming bandwidth is far below that: Intel Max 1550's tile streams 1 TB/s
# (STREAM triad, one tile alone and each of a node's 12 at once: ALCF's node benchmarks, above) of
# its 1.64 TB/s datasheet share, 0.61.
MEMORY_BW_FRACTION_BY_PART: dict[str, float] = {"max-1550-tile": 0.61}


def memory_bw_fraction(catalog_key: str | None) -> float:
    return MEMORY_BW_FRACTION_BY_PART.get(catalog_key or "", MEMORY_BW_FRACTION)


def streaming_bytes_per_s(acc) -> float:
    """Bytes a second ``acc``'s memory-bound kernels stream: its datasheet HBM bandwidth (1 TB/s
    where the catalog gives none) at the part's achievable fraction."""
    return (acc.mem_bw_gb_per_s or 1000) * 1e9 * memory_bw_fraction(calibration_key(acc))

# Elementwise (norm, residual, activation, dropout, softmax) traffic of an unfused eager/Megatron
# step vs the minimum the op list implies (timing.elementwise_bytes counts each tensor read and
# written once per op): backward reads saved inputs and incoming grads and writes grads, ~2x the
# forward; norms' backward also reduces over the batch. FITTED, single global value: 1.5.
ELEMENTWISE_TRAFFIC_FACTOR = 1.5

# ------------------------------------------------------------------------------ communication

# NCCL bus bandwidth as a fraction of the link's one-direction peak: DGX A100 all-reduce busbw
# ~230 of 300 GB/s, DGX H100 ~360-380 of 450 (nccl-tests reports) -> 0.8.
LINK_BW_FRACTION = 0.80
# InfiniBand/RoCE NICs sustain ~90% of line rate in nccl-tests across nodes.
INTERNODE_BW_FRACTION = 0.90
# Compute that runs beside an overlapped collective slows by the share of the device the
# collective's kernels hold: NCCL runs one thread block per channel, 16-32 channels on
# NVLink/InfiniBand systems, of 108 (A100) to 132 (H100) SMs, and its copies contend for HBM.
# ASSUMED 0.12 (16 of 132 SMs), global.
COLLECTIVE_COMPUTE_SHARE = 0.12
# Per-step latency (alpha) of one ring step: NVLink ~ a few us, network ~ 10 us.
ALPHA_INTRA_S = 5e-6
ALPHA_INTER_S = 10e-6
# Devices per node when the catalog does not say (DGX/HGX boards, OAM platforms: 8).
GPUS_PER_NODE = 8

# ------------------------------------------------------------------------------ host offload

# ZeRO-Offload (Ren et al. 2021, USENIX ATC; DeepSpeed's offload_optimizer, Megatron's
# --optimizer-cpu-offload) keeps the fp32 master, the optimizer states and fp32 gradients in host
# memory and steps Adam on the CPU; ZeRO-Infinity's offload_param (FSDP's CPUOffload) keeps the
# weights there too. Their costs are the host link and the host's memory bandwidth:
# - host link, both directions, where the catalog gives none (SXM and OAM parts): PCIe Gen4 x16,
#   64 GB/s (the DGX A100's; Gen5 hosts double it), ASSUMED; at LINK_BW_FRACTION of it each way;
# - host memory bandwidth: a DGX A100's two EPYC 7742 have 16 channels of DDR4-3200 (410 GB/s),
#   ~80% streamed (STREAM triad): 330 GB/s a host, ASSUMED for every host, shared by the devices
#   of the host that train (GPUS_PER_NODE at most);
# - CPU Adam moves 34 bytes a parameter: fp32 weight, m and v read and written (24), the fp32
#   gradient written from the half copy that crossed the link and read (8), the half weight
#   written for the trip back (2).
HOST_LINK_GB_PER_S = 64
HOST_MEMORY_BYTES_PER_S = 330e9
CPU_ADAM_BYTES_PER_PARAM = 34

# ------------------------------------------------------------------------------ memory overheads

# CUDA context + loaded kernels + library workspaces on the device, outside PyTorch's allocator:
# Hugging Face measured 1343 MB (MiB) after creating one tensor (transformers docs,
# perf_train_gpu_one). Newer CUDA with lazy loading needs less; this stays on the safe side.
CONTEXT_BYTES = 1343 * 2**20
# PyTorch's caching allocator reserves more than it hands out (block rounding, fragmentation
# across differently sized activations): ~5-10% on training runs; 5% added to allocated bytes.
ALLOCATOR_OVERHEAD_FRACTION = 0.05
# The fits verdict keeps this fraction of device memory free, for what no model predicts
# (NCCL buffers growing with communicators, allocator spikes, other processes).
SAFETY_MARGIN_FRACTION = 0.10

# ------------------------------------------------------------------------------ power

# Board power = TDP x (IDLE + (1 - IDLE) x busy), busy = HFU / MAMF fraction (tensor cores
# saturated). ~30% of TDP is drawn at idle-in-job (clocks up, HBM refresh, fans) on A100/H100
# nodes (public nvidia-smi logs of training jobs show 0.8-0.95 TDP while busy). ASSUMPTION.
IDLE_POWER_FRACTION = 0.30
# Share of a training job's wall-clock that advances training (goodput): the rest goes to restarts
# after failures, replaying steps since the last checkpoint and checkpoint stalls. Meta reports
# "higher than 90% effective training time" for Llama 3 405B on 16,384 H100 over a 54-day snapshot
# with 466 interruptions, 78% of the unexpected ones hardware (Dubey et al. 2024, section 3.3.4).
# Interruptions are per-device events, so the time they cost per hour of training grows with the
# device count: lost / trained = (1/0.90 - 1) x N / 16,384, and goodput = 1 / (1 + lost / trained):
# 0.90 at 16k devices, 0.986 at 2k, 0.9995 on one 8-GPU node (an MLPerf or speedrun clock).
# Time, device-hours, cost and energy of a token budget are divided by it; step time and
# throughput are steady state.
GOODPUT_REFERENCE = 0.90
GOODPUT_REFERENCE_DEVICES = 16_384


def goodput(n_devices: int) -> float:
    """Share of wall-clock that trains on ``n_devices``, from the Llama 3 interruption rate above."""
    lost = (1 / GOODPUT_REFERENCE - 1) * n_devices / GOODPUT_REFERENCE_DEVICES
    return 1 / (1 + lost)


# Share of sequence positions holding tokens in BERT's Wikipedia pretraining data at sequence length
# 512: "padding tokens represent in excess of 50%" (Krell et al. 2021, Efficient Sequence Packing
# without Cross-contamination, arXiv 2107.02027, abstract; MLPerf's packed configs pack two sequences
# to a 512-token row). A run whose kernels skip the padding (NVIDIA's --unpad / --unpad_fmha) computes
# on about half the positions it is credited with. 0.5.
BERT_WIKIPEDIA_TOKEN_FRACTION = 0.5
# Default grid carbon intensity, g CO2 per kWh: world average ~ 480 (IEA 2023); 400 ASSUMED as a
# round mid value. Users should pass --grid-intensity for their region.
DEFAULT_GRID_G_PER_KWH = 400.0


# A part that keeps its base part's peaks and clocks but a lower power limit (a power-capped variant:
# Meta's 500 W Grand Teton H100, `nvidia-smi -pl`) cannot hold the base part's sustained clock with
# its tensor cores saturated. CMOS dynamic power is C V^2 f and voltage tracks frequency in the
# DVFS range, so the busy power above idle grows as f^3: f / f_base = ((cap - idle) / (TDP - idle))^(1/3),
# idle = IDLE_POWER_FRACTION x the base TDP (defined below). Compute rates scale with the clock;
# HBM bandwidth does not (its clock is separate). 500 W on a 700 W H100: 0.84.
POWER_CLOCK_EXPONENT = 1 / 3


def power_cap_clock_fraction(tdp_w: float | None, base_tdp_w: float | None) -> float:
    """Sustained clock of a power-capped part relative to its base part's (1.0 when not capped)."""
    if not tdp_w or not base_tdp_w or tdp_w >= base_tdp_w:
        return 1.0
    idle = IDLE_POWER_FRACTION * base_tdp_w
    return max(0.0, (tdp_w - idle) / (base_tdp_w - idle)) ** POWER_CLOCK_EXPONENT


def calibration_key(acc) -> str:
    """The catalog entry whose measured fractions apply to ``acc``: a variant (a user's
    power-capped or larger-memory part, ``base = "h100-sxm"``; a variant of a user's part based
    on a catalog one) shares the silicon of the part at the root of its bases."""
    from tensorpilot.hardware import catalog

    return catalog.base_chain(acc)[-1].key


def mamf_fraction(catalog_key: str | None, dtype: str = "bf16", fp8_recipe: str = "te") -> float:
    if dtype == "fp4":
        # no fp4 GEMM measurement is published: the part's fp8 fraction through the same
        # block-scaled cuBLASLt path (Transformer Engine), ASSUMED
        dtype, fp8_recipe = "fp8", "te"
    table = MAMF_FRACTION_FP8_SCALED_MM if fp8_recipe == "torchao" else MAMF_FRACTION_FP8
    if dtype == "fp8" and (catalog_key or "") in table:
        return table[catalog_key]
    if dtype == "fp32" and (catalog_key or "") in MAMF_FRACTION_FP32:
        return MAMF_FRACTION_FP32[catalog_key]
    return MAMF_FRACTION.get(catalog_key or "", DEFAULT_MAMF_FRACTION)


def gemm_half_depth(peak_flops_per_s: float, mem_bw_gb_per_s: float | None, catalog_key: str | None = None) -> float:
    """Reduction depth at which a GEMM runs at half its large-GEMM rate on a device whose compute
    dtype peaks at ``peak_flops_per_s`` beside ``mem_bw_gb_per_s`` of HBM: the part's measured
    multiple of that balance (GEMM_HALF_DEPTH_PER_BALANCE_BY_PART) or GEMM_HALF_DEPTH_PER_BALANCE."""
    per_balance = GEMM_HALF_DEPTH_PER_BALANCE_BY_PART.get(catalog_key or "", GEMM_HALF_DEPTH_PER_BALANCE)
    return per_balance * peak_flops_per_s / ((mem_bw_gb_per_s or 1000) * 1e9)


def flash_attention_fraction(catalog_key: str | None) -> float:
    return FLASH_ATTENTION_PEAK_FRACTION.get(catalog_key or "", DEFAULT_FLASH_ATTENTION_PEAK_FRACTION)


def flash2_attention_flops(catalog_key: str | None) -> float | None:
    """FlashAttention-2's own forward + backward rate on a part that outgrew it, None elsewhere."""
    return FLASH2_ATTENTION_FLOPS.get(catalog_key or "")
