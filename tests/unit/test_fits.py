"""The memory check before allocation (training/fits.py): two independent estimates agree, the
traced one matches a hand count, and the check refuses exactly what exceeds free memory."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorpilot.errors import ConfigError
from tensorpilot.training import fits
from tensorpilot.workloads.base import cross_entropy
from tensorpilot.workloads.gpt import GPT, SIZES, GPTConfig


def test_traced_estimate_matches_a_hand_count():
    b, d_in, h, d_out = 8, 16, 32, 4
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(d_in, h), nn.ReLU(), nn.Linear(h, d_out))
    x = torch.empty(b, d_in, device="meta")
    y = torch.empty(b, dtype=torch.long, device="meta")
    est = fits.estimate_traced(model, (x, y), cross_entropy)
    params = d_in * h + h + h * d_out + d_out
    assert est.states_bytes == params * (4 + 4 + 8)          # weight, gradient, AdamW m and v
    # saved for backward: the first Linear's input (b, d_in) and ReLU's output (b, h) (the second
    # Linear saves the same tensor); the loss's log-softmax (b, d_out), int64 targets (b) and
    # nll_loss's fp32 total weight (a scalar); plus the output's gradient and fp32 copy and the
    # input batch
    saved = 4 * (b * d_in + b * h) + 4 * b * d_out + 8 * b + 4
    assert est.activations_bytes == saved + 4 * (2 * b * d_out + b * d_in)


@pytest.mark.parametrize("size,batch", [("tiny", 32), ("small", 16)])
def test_planner_and_trace_agree_on_the_built_in_gpt(size, batch):
    # independent methods: the planner's formulas (Korthikanti et al.) and saved tensors counted
    shape = dict(SIZES[size], vocab_size=256, dropout=0.0, tie_head=True)
    planned = fits.estimate_gpt(shape, batch, half_precision=True, materialized_attention=True)
    with torch.device("meta"):
        model = GPT(GPTConfig(**shape))
    x = torch.empty(batch, shape["seq_len"], dtype=torch.long, device="meta")
    traced = fits.estimate_traced(model, (x, x), cross_entropy, act_bytes=2)
    assert planned.states_bytes == pytest.approx(traced.states_bytes, rel=1e-3)
    assert planned.total_bytes == pytest.approx(traced.total_bytes, rel=0.05)


def test_the_check_refuses_exactly_what_exceeds_free_memory():
    free, what = fits.free_bytes(torch.device("cpu"))
    assert free and free > 0 and what
    fits.check(fits.MemoryEstimate(free * 0.5, 0.0, "test"), torch.device("cpu"))
    with pytest.raises(ConfigError, match="does not fit.*--no-train.memory_check"):
        fits.check(fits.MemoryEstimate(free * 0.6, free * 0.6, "test"), torch.device("cpu"))
    with pytest.raises(ConfigError, match="per process"):          # 3 processes share the host
        fits.check(fits.MemoryEstimate(free * 0.5, 0.0, "test"), torch.device("cpu"), share=3)


def test_a_batch_is_described_from_one_sample_without_building_it():
    one = (torch.zeros(1, 3, 8, 8), {"ids": torch.zeros(1, 5, dtype=torch.long)})
    x, extra = fits.expand_batch(one, 10**9)
    assert x.shape == (10**9, 3, 8, 8) and x.is_meta
    assert extra["ids"].shape == (10**9, 5) and extra["ids"].dtype == torch.long
