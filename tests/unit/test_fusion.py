"""modelplan/fusion.py: a traced step as torch.compile runs it, against hand arithmetic of which
tensors cross a fused kernel's boundary."""

from __future__ import annotations

import torch
from torch import nn

from tensorpilot.modelplan.fusion import fuse
from tensorpilot.observe.trace import COMPUTE_CLASSES, trace_step

B, N = 32, 64
F32 = 4


class Chain(nn.Module):
    """(x * w).exp() * 2: three pointwise ops, no matmul."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(N))

    def forward(self, x):
        return (x * self.w).exp() * 2


def _trace(model, loss=lambda out, y: out.sum(), opt=lambda ps: torch.optim.SGD(ps, lr=0.1)):
    return trace_step(model, lambda: (torch.randn(B, N), None), loss, opt)


def test_a_pointwise_chain_reads_its_inputs_and_writes_what_backward_needs():
    eager = _trace(Chain())
    fused = fuse(eager)
    fwd = [o for o in fused.ops if o.phase == "forward"]
    bwd = [o for o in fused.ops if o.phase == "backward"]
    assert len(fwd) == 1 and len(bwd) == 1                 # one kernel each way: no matmul splits them
    # forward reads x (B x N fp32) and w (N); writes exp's output, which exp's backward reads
    # (d exp(u) = exp(u) du), and the loss scalar that backward's seed reads (ones_like)
    assert fwd[0].bytes_read == B * N * F32 + N * F32
    assert fwd[0].bytes_written == B * N * F32 + F32
    # backward reads the loss, exp's output and x (dw = sum_b grad_u * x); writes dw alone
    assert bwd[0].bytes_read == F32 + 2 * B * N * F32
    assert bwd[0].bytes_written == N * F32
    # the eager forward moved every intermediate: mul, exp, mul each read and wrote B x N
    eager_fwd = sum(o.bytes_read + o.bytes_written for o in eager.ops if o.phase == "forward")
    assert eager_fwd == (B * N + N) * F32 + 5 * B * N * F32 + (B * N + 1) * F32
    # the optimizer is not compiled with the model: its ops are the eager ones
    assert [o.op for o in fused.ops if o.phase == "optimizer"] == \
        [o.op for o in eager.ops if o.phase == "optimizer"]


class Counter(nn.Module):
    """A buffer updated in place (as BatchNorm's running statistics are) beside a pointwise op."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(N))
        self.register_buffer("seen", torch.zeros(N))

    def forward(self, x):
        self.seen.add_(x.detach().mean(0))
        return x * self.w


def test_a_state_updated_in_place_is_written_back():
    fwd = [o for o in fuse(_trace(Counter())).ops if o.phase == "forward"]
    assert len(fwd) == 1
    # reads x, w and the buffer; writes the buffer (N), and the loss (read by backward's seed).
    # x * w itself is used only by the sum inside the kernel, and mean's result only by add_
    assert fwd[0].bytes_read == B * N * F32 + 2 * N * F32
    assert fwd[0].bytes_written == N * F32 + F32


def test_matmuls_stay_and_split_the_fused_kernels():
    model = nn.Sequential(nn.Linear(N, 2 * N), nn.GELU(), nn.LayerNorm(2 * N), nn.Linear(2 * N, N))
    eager = _trace(model, opt=lambda ps: torch.optim.AdamW(ps, foreach=True))
    fused = fuse(eager)
    compute = [(o.op, o.flops) for o in eager.ops if o.op_class in COMPUTE_CLASSES]
    assert [(o.op, o.flops) for o in fused.ops if o.op_class in COMPUTE_CLASSES] == compute
    assert not any(o.op_class == "view" for o in fused.ops if o.phase != "optimizer")
    # between two compute ops (or a phase's ends) at most one fused kernel
    for phase in ("forward", "backward"):
        kinds = "".join("c" if o.op_class in COMPUTE_CLASSES else "m" for o in fused.ops if o.phase == phase)
        assert "c" in kinds and "mm" not in kinds
    # backward: the loss's seed with the last Linear's bias gradient (a sum of the incoming gradient,
    # which no GEMM wrote), its two GEMMs, then norm + GELU backward with the first Linear's bias
    # sum (it reads what GELU's backward wrote, not the weight gradient's GEMM output), its GEMM
    # (the input needs no gradient: no second one)
    kinds = "".join("c" if o.op_class in COMPUTE_CLASSES else "m" for o in fused.ops if o.phase == "backward")
    assert kinds == "mccmc"
    moved = {name: sum(o.bytes_read + o.bytes_written for o in t.ops if o.op_class not in COMPUTE_CLASSES
                       and o.phase != "optimizer") for name, t in (("eager", eager), ("fused", fused))}
    assert moved["fused"] < moved["eager"]
    assert fused.memory == eager.memory
    assert fused.notes[-1].startswith("compiled: ")


def test_a_run_that_compiles_is_compared_with_the_compiled_plan():
    from tensorpilot.training import predicted
    from tensorpilot.workloads.base import cross_entropy

    model = nn.Sequential(nn.Linear(N, 4 * N), nn.GELU(), nn.LayerNorm(4 * N), nn.Linear(4 * N, 10))
    batch = (torch.randn(B, N), torch.randint(0, 10, (B,)))
    pred = predicted.predict_run(model, batch, cross_entropy, name="m", optimizer="adamw",
                                 device=torch.device("cpu"), autocast=None, micro_batch=B, grad_accum=1,
                                 n_devices=1, sharding="none", tokens_per_sample=None)
    assert pred.plan is not None and pred.compiled_plan is not None
    plan = pred.compiled_plan()
    assert plan.memory_bytes == pred.plan.memory_bytes           # the eager trace's peak
    assert plan.time_breakdown_s["compute"] == pred.plan.time_breakdown_s["compute"]
    eager = predicted.compare(pred, measured_step_s=0.01, measured_peak=None, peak_method=None)
    compiled = predicted.compare(pred, measured_step_s=0.01, measured_peak=None, peak_method=None, compiled=True)
    assert eager["step_time_s"] == pred.plan.step_time_s and "fusion" not in eager["method"]
    assert compiled["step_time_s"] == plan.step_time_s and "fusion.py" in compiled["method"]
    assert compiled["measured_over_predicted"] == 0.01 / plan.step_time_s
