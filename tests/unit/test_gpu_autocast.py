"""observe/gpu_autocast.py: the CPU trace casts as CUDA's autocast does. The reference is PyTorch's
documented CUDA op lists (docs "Automatic Mixed Precision package", "CUDA Ops that can autocast to
float32": pow, layer_norm, softmax, sum, ...; matmuls to the lower precision; cat not listed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorpilot.hardware import catalog
from tensorpilot.modelplan.planner import autocasts_like_cuda
from tensorpilot.observe.gpu_autocast import gpu_rules
from tensorpilot.observe.trace import trace_step

BF16 = torch.bfloat16


def _ops(rules: bool):
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    with gpu_rules() if rules else torch.autocast("cpu", enabled=True), torch.autocast("cpu", dtype=BF16):
        y = F.linear(x, w)                                # bf16 under both
        return {"linear": y, "pow": torch.pow(y, 3), "layer_norm": F.layer_norm(y, (8,)),
                "softmax": torch.softmax(y, -1), "sum": y.sum(), "cat": torch.cat([y, x]),
                "gelu": F.gelu(y)}


def test_gpu_rules_cast_as_cuda_autocast_and_the_cpu_rules_come_back():
    gpu = _ops(rules=True)
    assert gpu["linear"].dtype == BF16 and gpu["gelu"].dtype == BF16       # listed lower / not listed
    for name in ("pow", "layer_norm", "softmax", "sum"):                    # CUDA's fp32 lists
        assert gpu[name].dtype == torch.float32, name
    assert gpu["cat"].dtype == torch.float32            # not listed on CUDA: cat's own type promotion
    cpu = _ops(rules=False)                             # after the context: the CPU's rules again
    for name in ("pow", "layer_norm", "softmax", "sum"):
        assert cpu[name].dtype == BF16, name


def test_the_cpu_rules_come_back_after_an_error_inside():
    with pytest.raises(RuntimeError, match="inside"):
        with gpu_rules():
            raise RuntimeError("inside")
    with torch.autocast("cpu", dtype=BF16):
        assert torch.pow(torch.randn(3, dtype=BF16), 2).dtype == BF16


def test_softmax_with_an_explicit_dtype_keeps_it():
    # fp32_set_opt_dtype: autocast sets the output dtype only where the caller did not
    with gpu_rules(), torch.autocast("cpu", dtype=BF16):
        y = torch.randn(4, 8, dtype=BF16)
        assert torch.softmax(y, -1, dtype=BF16).dtype == BF16
        assert torch.softmax(y, -1).dtype == torch.float32
        assert y.sum(dtype=BF16).dtype == BF16 and y.sum().dtype == torch.float32


class TanhGelu(nn.Module):
    """Hugging Face GPT-2's gelu_new after a linear: 0.5 x (1 + tanh(c (x + 0.044715 x^3)))."""

    def __init__(self, n: int):
        super().__init__()
        self.fc = nn.Linear(n, n, bias=False)

    def forward(self, x):
        h = self.fc(x)
        return 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * torch.pow(h, 3.0))))


def test_a_traced_step_under_gpu_rules_runs_the_gelu_chain_in_fp32():
    B, N = 16, 32

    def trace(gpu: bool):
        return trace_step(TanhGelu(N), lambda: (torch.randn(B, N), None), lambda out, y: out.float().sum(),
                          lambda ps: torch.optim.SGD(ps, lr=0.1), autocast_dtype=BF16, gpu_autocast=gpu)

    def forward(tr, op):
        return [o for o in tr.ops if o.op == op and o.phase == "forward"]

    gpu, cpu = trace(True), trace(False)
    # pow reads the linear's bf16 output: on the GPU cast to fp32 first (B x N x 4 bytes read), on
    # the CPU read as it is (B x N x 2)
    (pow_gpu,), (pow_cpu,) = forward(gpu, "aten.pow"), forward(cpu, "aten.pow")
    assert (pow_gpu.dtype, pow_gpu.bytes_read, pow_gpu.bytes_written) == ("float32", B * N * 4, B * N * 4)
    assert (pow_cpu.dtype, pow_cpu.bytes_read, pow_cpu.bytes_written) == ("bfloat16", B * N * 2, B * N * 2)
    # everything after pow is fp32 on the GPU: tanh writes B x N x 4 bytes there, x 2 on the CPU
    assert forward(gpu, "aten.tanh")[0].bytes_written == B * N * 4
    assert forward(cpu, "aten.tanh")[0].bytes_written == B * N * 2
    # the cast up is one more kernel in forward: the bf16 -> fp32 copy of h (B x N x 2 read)
    casts = [o for o in forward(gpu, "aten._to_copy") if o.bytes_read == B * N * 2 and o.bytes_written == B * N * 4]
    assert len(casts) == 1


@pytest.mark.parametrize("key,expected", [("h100-sxm", True), ("a100-sxm-80gb", True), ("mi300x", True),
                                          ("max-1550-tile", True), ("gaudi2", False), ("tpu-v5p", False),
                                          ("trainium2", False)])
def test_which_accelerators_autocast_with_cuda_lists(key, expected):
    assert autocasts_like_cuda(catalog.get(key)) is expected
