"""Optimizer state in the memory estimates: the planner's per-parameter table, and the lighter
optimizer the memory check suggests (and --optimize auto takes) when AdamW's state is the excess."""

from __future__ import annotations

import pytest
import torch

from tensorpilot.plan import memory as pm
from tensorpilot.training import fits

GIB = 2**30


def test_planner_state_bytes_per_optimizer():
    # AdamW: m and v in fp32; 8-bit: one byte each plus an fp32 scale per 256-element block
    assert pm.precision("fp32", "adamw").optim_bytes == 8
    assert pm.precision("bf16-amp", "adamw8bit").optim_bytes == pytest.approx(2 + 8 / 256)
    assert pm.precision("fp32", "adafactor").optim_bytes < 0.1
    n = 1e9
    adam = pm.model_state_bytes(n, pm.precision("fp32", "adamw"))["optimizer"]
    eight = pm.model_state_bytes(n, pm.precision("fp32", "adamw8bit"))["optimizer"]
    assert eight / adam == pytest.approx((2 + 8 / 256) / 8)


def test_adafactor_state_bound_matches_torch_for_a_square_matrix():
    """The planner's 0.05 B/param bounds torch's Adafactor on a 160 x 160 matrix (rows + columns)."""
    w = torch.nn.Parameter(torch.randn(160, 160))
    opt = torch.optim.Adafactor([w])
    w.grad = torch.randn_like(w)
    opt.step()
    st = opt.state[w]
    per_param = (st["row_var"].numel() + st["col_var"].numel()) * 4 / w.numel()
    assert per_param == pytest.approx(0.05)


def est(params: float, acts: float, optimizer="adamw") -> fits.MemoryEstimate:
    return fits.MemoryEstimate(params * fits.state_bytes_per_param(optimizer), acts, "test", params, optimizer)


@pytest.mark.parametrize("budget_gib, expected", [
    (100, "adamw8bit"),     # 1e9 params: AdamW 16 GB of states; 8-bit ~10 GB
    (9.0, "adafactor"),     # only Adafactor's ~8 GB fits
    (5.0, None),            # weights and gradients alone exceed it
])
def test_smaller_optimizer_is_the_one_with_most_state_that_fits(budget_gib, expected):
    e = est(1e9, 0.1 * GIB)
    budget = budget_gib * GIB if budget_gib != 100 else e.total_bytes - 1   # just too small for AdamW
    assert fits.smaller_optimizer(e, budget) == expected


def test_does_not_fit_names_the_lighter_optimizer(monkeypatch):
    e = est(1e9, 0.1 * GIB)
    monkeypatch.setattr(fits, "free_bytes", lambda device: (int(9 * GIB), "available host memory"))
    with pytest.raises(fits.DoesNotFit) as info:
        fits.check(e, torch.device("cpu"))
    assert info.value.lighter == "adafactor" and "--optim.name adafactor" in str(info.value)
