"""Precision choice from fake device profiles: no GPU is touched.

The expected answers are facts about the hardware: bf16 Tensor Cores arrive with Ampere
(sm_80); Volta (sm_70) and Turing (sm_75) have fp16 Tensor Cores only, and fp16 training
needs dynamic loss scaling; on CPU, bf16 is fast only with AVX512-BF16 or AMX.
"""

from __future__ import annotations

import pytest

from tensorpilot.errors import ConfigError
from tensorpilot.hardware.device import DeviceCaps
from tensorpilot.training.precision import DTYPE_BYTES, choose

A100 = DeviceCaps(kind="cuda", name="NVIDIA A100-SXM4-40GB", index=0, cuda_capability=(8, 0))
H100 = DeviceCaps(kind="cuda", name="NVIDIA H100 80GB HBM3", index=0, cuda_capability=(9, 0))
V100 = DeviceCaps(kind="cuda", name="Tesla V100-SXM2-16GB", index=0, cuda_capability=(7, 0))
T4 = DeviceCaps(kind="cuda", name="Tesla T4", index=0, cuda_capability=(7, 5))
MI250 = DeviceCaps(kind="cuda", name="AMD Instinct MI250X", index=0, cuda_capability=(9, 0), is_rocm=True)
CPU_AVX512_BF16 = DeviceCaps(kind="cpu", name="Xeon (Cooper Lake)",
                             cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16"}))
CPU_AMX = DeviceCaps(kind="cpu", name="Xeon (Sapphire Rapids)",
                     cpu_flags=frozenset({"avx2", "avx512f", "amx_bf16", "amx_tile"}))
CPU_AVX2 = DeviceCaps(kind="cpu", name="Core (Haswell)", cpu_flags=frozenset({"sse4_2", "avx", "avx2", "fma"}))
MPS = DeviceCaps(kind="mps", name="mps")
XPU = DeviceCaps(kind="xpu", name="xpu", index=0)


@pytest.mark.parametrize("caps", [A100, H100], ids=["ampere", "hopper"])
def test_auto_on_ampere_and_newer_is_bf16(caps):
    c = choose("auto", caps)
    assert (c.name, c.autocast, c.grad_scaler, c.tf32) == ("bf16", "bfloat16", False, False)
    assert caps.name in c.reason and "bf16" in c.reason


@pytest.mark.parametrize("caps, cc", [(V100, "7.0"), (T4, "7.5")], ids=["volta", "turing"])
def test_auto_on_pre_ampere_cuda_is_fp16_with_loss_scaling(caps, cc):
    c = choose("auto", caps)
    assert (c.name, c.autocast, c.grad_scaler, c.tf32) == ("fp16", "float16", True, False)
    assert "loss scaling" in c.reason and cc in c.reason and "lacks fast bf16" in c.reason


@pytest.mark.parametrize("caps", [CPU_AVX512_BF16, CPU_AMX], ids=["avx512_bf16", "amx"])
def test_auto_on_bf16_capable_cpu_is_bf16(caps):
    c = choose("auto", caps)
    assert (c.name, c.autocast, c.grad_scaler, c.tf32) == ("bf16", "bfloat16", False, False)
    assert "AVX512-BF16/AMX" in c.reason


def test_auto_on_plain_avx2_cpu_is_fp32():
    c = choose("auto", CPU_AVX2)
    assert (c.name, c.autocast, c.grad_scaler, c.tf32) == ("fp32", None, False, False)
    assert "no bf16 instructions" in c.reason


def test_auto_on_cpu_without_flags_is_fp32():
    # non-Linux hosts report no flags: never guess bf16
    assert choose("auto", DeviceCaps(kind="cpu")).name == "fp32"


def test_auto_on_mps_is_fp16_without_scaler():
    c = choose("auto", MPS)
    assert (c.name, c.autocast, c.grad_scaler, c.tf32) == ("fp16", "float16", False, False)
    assert "MPS" in c.reason


def test_auto_on_xpu_is_bf16():
    assert choose("auto", XPU).name == "bf16"


def test_auto_on_rocm_mi200_is_bf16():
    assert choose("auto", MI250).name == "bf16"


@pytest.mark.parametrize("caps", [CPU_AVX2, CPU_AMX, V100, MI250, MPS], ids=["cpu", "amx", "volta", "rocm", "mps"])
def test_explicit_tf32_without_nvidia_ampere_is_a_config_error(caps):
    with pytest.raises(ConfigError, match="tf32"):
        choose("tf32", caps)


@pytest.mark.parametrize("caps", [A100, H100])
def test_explicit_tf32_on_ampere(caps):
    c = choose("tf32", caps)
    assert (c.name, c.autocast, c.grad_scaler, c.tf32) == ("tf32", None, False, True)
    assert c.matmul_dtype == "tf32"


def test_explicit_fp16_on_cpu_has_no_scaler():
    c = choose("fp16", CPU_AVX2)
    assert (c.name, c.autocast, c.grad_scaler) == ("fp16", "float16", False)
    assert "loss scaling" not in c.reason and "as requested" in c.reason


def test_explicit_fp16_on_cuda_has_scaler():
    c = choose("fp16", A100)
    assert (c.name, c.grad_scaler) == ("fp16", True)
    assert "loss scaling" in c.reason


def test_explicit_bf16_on_cpu_without_instructions_warns_in_reason():
    c = choose("bf16", CPU_AVX2)
    assert (c.name, c.autocast, c.grad_scaler) == ("bf16", "bfloat16", False)
    assert "slow" in c.reason
    assert "slow" not in choose("bf16", CPU_AMX).reason


def test_explicit_bf16_on_ampere_keeps_tf32_for_fp32_matmuls():
    assert choose("bf16", A100).tf32 is True
    assert choose("bf16", CPU_AMX).tf32 is False


@pytest.mark.parametrize("caps", [CPU_AMX, A100, MPS])
def test_explicit_fp32_is_plain(caps):
    c = choose("fp32", caps)
    assert (c.name, c.autocast, c.grad_scaler, c.tf32) == ("fp32", None, False, False)
    assert c.matmul_dtype == "fp32"


def test_unknown_precision():
    with pytest.raises(ConfigError, match="fp8"):
        choose("fp8", A100)


def test_dtype_bytes():
    assert DTYPE_BYTES["fp32"] == 4 and DTYPE_BYTES["tf32"] == 4     # tf32 is stored as fp32
    assert DTYPE_BYTES["bf16"] == 2 and DTYPE_BYTES["fp16"] == 2


def test_device_caps_properties():
    assert A100.supports_tf32 and not MI250.supports_tf32 and not V100.supports_tf32
    assert not CPU_AVX2.cpu_fast_bf16 and CPU_AMX.cpu_fast_bf16
    assert A100.torch_device == "cuda:0" and CPU_AVX2.torch_device == "cpu"


@pytest.mark.parametrize("bf16, fp32, expected", [
    (2.3e11, 1.0e11, "bf16"),        # Zen 4: bf16 GEMMs ~2.3x fp32
    (1.66e11, 3.18e11, "fp32"),      # AVX512-BF16 without AMX, where oneDNN's bf16 GEMM is half fp32's
    (1.05e11, 1.0e11, "fp32"),       # a tie keeps full precision
])
def test_auto_on_a_bf16_cpu_follows_the_measured_ceilings(bf16, fp32, expected):
    c = choose("auto", CPU_AVX512_BF16, {"bf16": bf16, "fp32": fp32})
    assert c.name == expected and "measured" in c.reason
    assert c.autocast == ("bfloat16" if expected == "bf16" else None)
    assert choose("fp32", CPU_AVX512_BF16, {"bf16": bf16, "fp32": fp32}).name == "fp32"   # a request wins
    # measurements say nothing about GPUs' choice, and a missing one falls back to the flags
    assert choose("auto", H100, {"bf16": bf16, "fp32": fp32}).name == "bf16"
    assert choose("auto", CPU_AVX512_BF16, {"bf16": bf16}).name == "bf16"
