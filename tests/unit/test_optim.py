"""AdamW construction, the warm-up + cosine schedule, and freezing by name pattern."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tensorpilot.config import OptimConfig
from tensorpilot.errors import ConfigError
from tensorpilot.training.optim import build_optimizer, build_scheduler, freeze, lr_factor
from tensorpilot.workloads.gpt import GPT, GPTConfig


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, seq_len=8, n_layer=2, n_head=2, d_model=16))


# ------------------------------------------------------------------------------ schedule

W, TOTAL, MIN = 10, 110, 0.1          # 10 warm-up steps, cosine over the next 100


@pytest.mark.parametrize("step, expected", [
    (0, 0.1),            # first warm-up step: (0 + 1) / 10
    (4, 0.5),            # (4 + 1) / 10
    (9, 1.0),            # last warm-up step: (9 + 1) / 10
    (10, 1.0),           # cosine starts at its peak: 0.1 + 0.9 * 0.5 * (1 + cos 0)
    (60, 0.55),          # midpoint: 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = (1 + 0.1) / 2
    (35, 0.1 + 0.9 * 0.5 * (1 + math.sqrt(0.5))),   # a quarter in: cos(pi/4) = sqrt(1/2)
    (110, 0.1),          # end: 0.1 + 0.9 * 0.5 * (1 + cos(pi)) = min_ratio
    (500, 0.1),          # past the end it stays at the floor
])
def test_lr_factor_at_known_points(step, expected):
    assert lr_factor(step, warmup_steps=W, total_steps=TOTAL, min_ratio=MIN) == pytest.approx(expected, abs=1e-12)


def test_lr_factor_without_warmup_starts_at_peak():
    assert lr_factor(0, warmup_steps=0, total_steps=100, min_ratio=0.0) == 1.0
    assert lr_factor(100, warmup_steps=0, total_steps=100, min_ratio=0.0) == pytest.approx(0.0, abs=1e-12)


def test_lr_factor_is_monotone_in_decay():
    f = [lr_factor(s, warmup_steps=W, total_steps=TOTAL, min_ratio=MIN) for s in range(W, TOTAL + 1)]
    assert all(a >= b for a, b in zip(f, f[1:]))


def test_scheduler_drives_the_optimizer_lr():
    model = nn.Linear(4, 4)
    cfg = OptimConfig(lr=1e-3, warmup_steps=4, min_lr_ratio=0.1, impl="loop")
    opt, _ = build_optimizer(model, cfg, "cpu")
    sched = build_scheduler(opt, cfg, total_steps=14)
    lrs = []
    for _ in range(15):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(2.5e-4)      # 1e-3 * 1/4
    assert lrs[3] == pytest.approx(1e-3)        # 1e-3 * 4/4
    assert lrs[9] == pytest.approx(5.5e-4)      # midpoint of 10 cosine steps: 1e-3 * (1 + 0.1)/2
    assert lrs[14] == pytest.approx(1e-4)       # 1e-3 * 0.1
    assert all(g["lr"] == lrs[-1] for g in opt.param_groups)


def test_scheduler_clamps_warmup_to_a_short_run():
    # 50 warm-up steps in a 3-step run would never reach the peak: warm-up shrinks to 2
    model = nn.Linear(4, 4)
    cfg = OptimConfig(lr=1.0, warmup_steps=50, impl="loop")
    opt, _ = build_optimizer(model, cfg, "cpu")
    sched = build_scheduler(opt, cfg, total_steps=3)
    lrs = []
    for _ in range(2):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.5, 1.0])     # (0+1)/2, (1+1)/2


# ------------------------------------------------------------------------- weight decay

def test_weight_decay_only_on_matrices():
    model = tiny_gpt()
    opt, _ = build_optimizer(model, OptimConfig(weight_decay=0.1), "cpu")
    by_decay = {g["weight_decay"]: {id(p) for p in g["params"]} for g in opt.param_groups}
    assert set(by_decay) == {0.1, 0.0}
    # independent reference: embeddings and linear weights are matrices; biases and LayerNorm
    # gains/shifts are vectors
    matrices = {id(p) for n, p in model.named_parameters() if n.endswith("weight") and "ln" not in n}
    vectors = {id(p) for n, p in model.named_parameters() if n.endswith("bias") or "ln" in n}
    assert by_decay[0.1] == matrices and by_decay[0.0] == vectors
    assert len(matrices) == 2 + 2 * 4            # tok_emb, pos_emb (+ tied head) + 4 Linear per block


def test_optimizer_keeps_betas_and_lr():
    opt, _ = build_optimizer(nn.Linear(3, 3), OptimConfig(lr=2e-4, betas=[0.8, 0.9]), "cpu")
    assert opt.defaults["lr"] == 2e-4 and opt.defaults["betas"] == (0.8, 0.9)


def test_fused_chosen_on_cpu():
    opt, impl = build_optimizer(nn.Linear(3, 3), OptimConfig(), "cpu")
    assert impl == "fused"
    assert all(g["fused"] for g in opt.param_groups)


@pytest.mark.parametrize("impl, foreach", [("foreach", True), ("loop", False)])
def test_explicit_impl(impl, foreach):
    opt, used = build_optimizer(nn.Linear(3, 3), OptimConfig(impl=impl), "cpu")
    assert used == impl
    assert all(g["foreach"] is foreach and not g["fused"] for g in opt.param_groups)


def test_implementations_agree_numerically():
    # fused, foreach and loop AdamW are the same algorithm: one step from equal starts agrees
    results = []
    for impl in ("fused", "foreach", "loop"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
        opt, _ = build_optimizer(model, OptimConfig(impl=impl, lr=1e-2), "cpu")
        model(torch.ones(2, 8)).pow(2).sum().backward()
        opt.step()
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(results[0], results[1])
    torch.testing.assert_close(results[0], results[2])


# ------------------------------------------------------------------------------- freeze

def test_freeze_matching_names():
    model = tiny_gpt()
    frozen = freeze(model, ["tok_emb.*", "blocks.0.*"])
    expected = [n for n, _ in model.named_parameters() if n == "tok_emb.weight" or n.startswith("blocks.0.")]
    assert frozen == expected and len(expected) == 1 + 12       # 12 tensors in one block
    for name, p in model.named_parameters():
        assert p.requires_grad is (name not in expected), name
    # frozen parameters are left out of the optimizer
    opt, _ = build_optimizer(model, OptimConfig(), "cpu")
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_opt == {id(p) for n, p in model.named_parameters() if n not in expected}


def test_freeze_pattern_matching_nothing():
    with pytest.raises(ConfigError, match="blocks.9"):
        freeze(tiny_gpt(), ["tok_emb.*", "blocks.9.*"])


def test_freeze_is_case_sensitive():
    with pytest.raises(ConfigError):
        freeze(tiny_gpt(), ["TOK_EMB.*"])


def test_freezing_everything_is_an_error():
    with pytest.raises(ConfigError, match="every parameter"):
        freeze(tiny_gpt(), ["*"])
