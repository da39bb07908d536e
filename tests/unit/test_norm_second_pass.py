"""modelplan/costs.py on a catalogued device: normalisations whose statistics span several rows
read their operands twice (statistics, then the normalising pass), against hand arithmetic of the
operands' sizes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from tensorpilot.hardware import catalog
from tensorpilot.modelplan.costs import catalog_costs, second_pass_bytes
from tensorpilot.observe.trace import trace_step


def _norm_ops(model: nn.Module, shape: tuple[int, ...]):
    tr = trace_step(model, lambda: (torch.randn(shape), None), lambda out, y: out.sum(),
                    lambda ps: torch.optim.SGD(ps, lr=0.1))
    return tr, catalog_costs(catalog.get("h100-sxm"))


def test_batch_norm_reads_its_input_twice_in_training():
    N, C, H, W = 8, 16, 32, 32
    x_bytes = N * C * H * W * 4
    tr, dc = _norm_ops(nn.BatchNorm2d(C), (N, C, H, W))
    (fwd,) = [o for o in tr.ops if "batch_norm" in o.op and o.phase == "forward"]
    # statistics over N x H x W first, then the normalising pass reads x again
    assert second_pass_bytes(fwd) == x_bytes
    moved = fwd.bytes_read + fwd.bytes_written + x_bytes
    assert dc.op_time_s(fwd) == pytest.approx(moved / dc.bytes_per_s(moved) + dc.op_overhead_s)
    # backward reduces over (dy, x), then its elementwise pass reads both again
    assert [second_pass_bytes(o) for o in tr.ops if o.op == "aten.native_batch_norm_backward"] == [2 * x_bytes]
    # in eval (running statistics) one pass: the same op with training=False
    func, args, kwargs = fwd.replay
    evaluated = dataclasses.replace(fwd, replay=(func, (*args[:5], False, *args[6:]), kwargs))
    assert second_pass_bytes(evaluated) == 0


def test_layer_norm_backward_reads_twice_with_weights_only():
    R, D = 64, 128
    for affine, extra in ((True, 2 * R * D * 4), (False, 0)):   # (dy, x) again for gamma's and beta's sums
        tr, _ = _norm_ops(nn.Sequential(nn.Linear(D, D), nn.LayerNorm(D, elementwise_affine=affine)), (R, D))
        (bwd,) = [o for o in tr.ops if o.op == "aten.native_layer_norm_backward"]
        assert second_pass_bytes(bwd) == extra
        assert not [o for o in tr.ops if o.op != bwd.op and second_pass_bytes(o)]   # the forward: one pass
