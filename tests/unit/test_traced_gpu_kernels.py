"""A CPU trace planned for a GPU takes the GPU's kernels where the CPU's differ: SDPA with dropout
in the fused kernel (observe/gpu_attention.py) and 16-bit GEMMs with unaligned rows at the part's
slower rate (modelplan/costs.py: gemm_misaligned). References: the same step traced without
dropout (what the fused kernel saves), PyTorch's CPU dispatch (the math path with dropout), and
hand arithmetic from the catalog's rates."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorpilot.hardware import catalog
from tensorpilot.modelplan import costs
from tensorpilot.observe.gpu_attention import fuses_dropout_attention
from tensorpilot.observe.trace import trace_step
from tensorpilot.plan import calibration as cal

B, L, H, D = 2, 64, 4, 16           # batch, tokens, heads, head width


class Attn(nn.Module):
    def __init__(self, dropout: float, positional: bool = False):
        super().__init__()
        self.qkv = nn.Linear(H * D, 3 * H * D)
        self.dropout, self.positional = dropout, positional

    def forward(self, x):
        b, n = x.shape[:2]
        q, k, v = self.qkv(x).view(b, n, 3, H, D).permute(2, 0, 3, 1, 4)
        if self.positional:           # (q, k, v, attn_mask, dropout_p, is_causal)
            o = F.scaled_dot_product_attention(q, k, v, None, self.dropout, True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True)
        return o.transpose(1, 2).reshape(b, n, H * D)


def _trace(dropout: float, gpu_attention: bool, positional: bool = False):
    with torch.device("meta"):
        model = Attn(dropout, positional)
    return trace_step(model, lambda: (torch.randn(B, L, H * D), None), lambda o, y: o.sum(),
                      lambda ps: torch.optim.SGD(ps, lr=0.1), gpu_attention=gpu_attention)


@pytest.mark.parametrize("positional", [False, True])
def test_attention_dropout_traced_for_a_gpu_is_the_fused_kernel(positional):
    cpu = _trace(0.1, gpu_attention=False, positional=positional)
    gpu = _trace(0.1, gpu_attention=True, positional=positional)
    reference = _trace(0.0, gpu_attention=False)
    # the CPU runs dropout on the math path: scores by bmm, a softmax, a Bernoulli mask
    assert not [o for o in cpu.ops if o.op_class == "attention"]
    assert any("bernoulli" in o.op for o in cpu.ops)
    # for a GPU: the fused kernel, which saves what the kernel without dropout saves
    assert [o.op for o in gpu.ops if o.op_class == "attention"] == \
        [o.op for o in reference.ops if o.op_class == "attention"] != []
    assert not any("bernoulli" in o.op for o in gpu.ops)
    assert gpu.memory["total"] == reference.memory["total"]
    # the math path kept the B x H x L x L scores (fp32) for its backward; the fused kernel does not
    assert cpu.memory["total"] - gpu.memory["total"] >= 4 * B * H * L * L


def test_the_fused_kernel_is_planned_only_for_parts_whose_sdpa_has_it():
    assert fuses_dropout_attention(catalog.get("h100-sxm"))
    assert fuses_dropout_attention(catalog.get("mi300x"))
    assert not fuses_dropout_attention(catalog.get("tpu-v5p"))


FACTORY = f"""
import torch.nn.functional as F
from torch import nn


class Attn(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.qkv, self.dropout = nn.Linear({H * D}, {3 * H * D}), dropout

    def forward(self, x):
        b, n = x.shape[:2]
        q, k, v = self.qkv(x).view(b, n, 3, {H}, {D}).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True).sum((1, 3))


def with_dropout():
    return Attn(0.1)


def without_dropout():
    return Attn(0.0)
"""


def test_plan_of_a_users_model_with_attention_dropout_takes_the_gpus_kernel(tmp_path, monkeypatch, capsys):
    import json

    from tensorpilot.cli import main

    (tmp_path / "attnmodel.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    total = {}
    for factory, gpu in (("with_dropout", "h100-sxm"), ("without_dropout", "h100-sxm"), ("with_dropout", "tpu-v5p")):
        assert main(["plan", "--model", f"attnmodel:{factory}", "--gpu", gpu, "--input-shape", f"{L},{H * D}",
                     "--batch-size", str(B), "--loss", "sum", "--json"]) == 0
        total[factory, gpu] = json.loads(capsys.readouterr().out)["memory_bytes"]["total"]
    assert total["with_dropout", "h100-sxm"] == total["without_dropout", "h100-sxm"]
    # a TPU's SDPA is not modelled: the trace keeps the CPU's math path and its B x H x L x L scores
    assert total["with_dropout", "tpu-v5p"] - total["with_dropout", "h100-sxm"] >= 4 * B * H * L * L


def _gemm_trace(out_features: int):
    with torch.device("meta"):
        model = nn.Linear(64, out_features, bias=False)
    return trace_step(model, lambda: (torch.randn(256, 64), None), lambda o, y: o.float().sum(),
                      lambda ps: torch.optim.SGD(ps, lr=0.1), autocast_dtype=torch.bfloat16)


def test_a_16_bit_gemm_over_an_unaligned_width_runs_at_the_parts_misaligned_share():
    acc = catalog.get("h100-sxm")
    dev = costs.catalog_costs(acc)
    share = cal.MISALIGNED_GEMM_SPEED[cal.calibration_key(acc)]
    assert dev.misaligned_gemm_speed == share < 1
    odd, even = _gemm_trace(1001), _gemm_trace(1000)      # 1001 x 2 bytes is not a multiple of 16
    for phase in ("forward", "backward"):
        mm_odd = [o for o in odd.ops if o.op_class == "matmul" and o.phase == phase]
        mm_even = [o for o in even.ops if o.op_class == "matmul" and o.phase == phase]
        assert mm_odd and all(costs.gemm_misaligned(o) for o in mm_odd), phase
        assert mm_even and not any(costs.gemm_misaligned(o) for o in mm_even), phase
    fwd = next(o for o in odd.ops if o.op_class == "matmul" and o.phase == "forward")
    # by hand: the rate the op would get aligned (bf16 rate x the depth factor k / (k + half)),
    # times the share; the memory time is below the compute time at these sizes
    key = "bf16"
    depth = costs._reduction_depth(fwd)
    rate = dev.compute_flops_per_s[key] * depth / (depth + dev.gemm_half_depth[key]) * share
    assert dev.op_time_s(fwd) == pytest.approx(fwd.flops / rate + dev.op_overhead_s, rel=1e-9)
    # an unmeasured part keeps the aligned rate
    assert costs.catalog_costs(catalog.get("tpu-v5p")).misaligned_gemm_speed == 1.0


def test_fp32_gemms_are_not_treated_as_misaligned():
    with torch.device("meta"):
        model = nn.Linear(64, 1001, bias=False)
    trace = trace_step(model, lambda: (torch.randn(256, 64), None), lambda o, y: o.sum(),
                       lambda ps: torch.optim.SGD(ps, lr=0.1))
    assert not any(costs.gemm_misaligned(o) for o in trace.ops if o.op_class == "matmul")


def test_a_pure_bf16_step_traces_its_model_in_bf16():
    """Pure bf16 (the model cast, no autocast) against the same step in fp32, by hand: weights,
    gradients, saved activations and Adam's two moments take half the bytes."""
    from tensorpilot.modelplan import planner, sources

    src = sources.load("mlp")
    pure = planner.trace_source(src, batch_size=64, precision="bf16-pure", optimizer="adamw")
    fp32 = planner.trace_source(src, batch_size=64, precision="fp32", optimizer="adamw")
    n = pure.params
    assert fp32.memory["parameters"] == 4 * n and pure.memory["parameters"] == 2 * n
    for part in ("gradients", "activations"):        # give or take the scalar loss
        assert pure.memory[part] == pytest.approx(fp32.memory[part] / 2, abs=16), part
    assert 4 * n <= pure.memory["optimizer"] < 4 * n + 64          # exp_avg, exp_avg_sq + step counts
    # a real pure step on this CPU: its allocator sees the same tensors plus oneDNN's bf16 GEMM
    # workspace (about 0.1 MB here, which a trace of PyTorch's tensors does not see)
    measured = planner.measure_step(src, batch_size=64, precision="bf16-pure", optimizer="adamw", steps=1, warmup=1)
    assert pure.memory["total"] <= measured["peak_bytes"] < 1.15 * pure.memory["total"]
