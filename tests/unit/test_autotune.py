"""Autotune: candidates for fake device profiles (no GPU touched), ranking by prediction, the
budget, and the batch-size finder against a brute-force reference."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tensorpilot.hardware.device import DeviceCaps
from tensorpilot.training import autotune as at
from tensorpilot.training import precision

AMPERE = DeviceCaps("cuda", "NVIDIA A100-SXM4-80GB", 0, cuda_capability=(8, 0), memory_bytes=80 * 2**30)
VOLTA = DeviceCaps("cuda", "Tesla V100-SXM2-16GB", 0, cuda_capability=(7, 0), memory_bytes=16 * 2**30)
CPU_BF16 = DeviceCaps("cpu", "AMD EPYC", cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16"}))
CPU_AVX2 = DeviceCaps("cpu", "Intel Core", cpu_flags=frozenset({"avx2", "fma"}))
MPS = DeviceCaps("mps", "Apple M2")
PROFILES = {"ampere": AMPERE, "volta": VOLTA, "cpu-bf16": CPU_BF16, "cpu-avx2": CPU_AVX2, "mps": MPS}


@pytest.mark.parametrize("name,expected", [
    ("ampere", ["bf16", "tf32"]),     # bf16 tensor cores; tf32 the fp32-accuracy fallback
    ("volta", ["fp16", "fp32"]),      # no bf16 units: fp16 with loss scaling
    ("cpu-bf16", ["bf16", "fp32"]),   # AVX512-BF16 dot products
    ("cpu-avx2", ["fp32"]),           # bf16 would be emulated
    ("mps", ["fp16", "fp32"]),
])
def test_precision_options_follow_the_hardware(name, expected):
    assert at.precision_options("auto", PROFILES[name]) == expected
    assert at.precision_options("fp32", PROFILES[name]) == ["fp32"]   # an explicit request is kept


def test_cpu_precision_order_follows_measured_ceilings():
    slow_bf16 = {"bf16": 1.6e11, "fp32": 3.2e11}
    assert at.precision_options("auto", CPU_BF16, slow_bf16) == ["fp32"]        # half as fast: no trial
    assert at.precision_options("auto", CPU_BF16, {"bf16": 4e11, "fp32": 1e11}) == ["bf16"]
    assert at.precision_options("auto", CPU_BF16, {"bf16": 2.4e11, "fp32": 3e11}) == ["fp32", "bf16"]  # close: try both
    assert at.precision_options("auto", AMPERE, slow_bf16) == ["bf16", "tf32"]   # GPUs: by their units
    cands = at.enumerate_candidates(CPU_BF16, global_batch=4, ceilings=slow_bf16)
    assert cands[0].precision == "fp32"


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("kind", ["gpt", "cnn"])
def test_every_candidate_is_a_valid_configuration(name, kind):
    caps = PROFILES[name]
    cands = at.enumerate_candidates(caps, global_batch=24, convolutional=kind == "cnn")
    assert cands
    for c in cands:
        assert c.micro_batch * c.grad_accum == 24
        assert c.grad_accum <= 8
        precision.choose(c.precision, caps)          # raises for a precision the device lacks
        assert not c.compile                         # compilation is decided after the eager trials
    assert {c.activation_checkpointing for c in cands} == {False, True}
    # the memory format is a trial dimension for conv nets only
    assert {c.channels_last for c in cands} == ({False, True} if kind == "cnn" else {False})
    # the micro-batches: 24 itself and the power-of-two divisors with at most 8 accumulation steps
    assert sorted({c.micro_batch for c in cands}) == [4, 8, 24]


def test_micro_batch_options_respect_the_finder_limit():
    assert at.micro_batch_options(64) == [64, 32, 16, 8]
    assert at.micro_batch_options(64, limit=20) == [16, 8]
    assert at.micro_batch_options(7) == [7, 1]


def _pred(table):
    return lambda c: table[(c.micro_batch, c.activation_checkpointing)]


def test_rank_drops_what_does_not_fit_and_recomputation_that_is_not_needed():
    cands = [at.Candidate("bf16", m, 32 // m, ac) for m in (32, 16, 8) for ac in (False, True)]
    table = {(32, False): at.Prediction(False, 1.0, 90e9, "too big"), (32, True): at.Prediction(True, 1.3, 40e9),
             (16, False): at.Prediction(True, 1.1, 60e9), (16, True): at.Prediction(True, 1.4, 30e9),
             (8, False): at.Prediction(True, 1.2, 40e9), (8, True): at.Prediction(True, 1.5, 25e9)}
    fits, out = at.rank(cands, _pred(table))
    assert [c for c, _ in out] == [at.Candidate("bf16", 32, 1, False)]
    # 32 with recomputation stays (its plain twin does not fit); 16/8 with recomputation go
    assert [(c.micro_batch, c.activation_checkpointing) for c, _ in fits] == [(16, False), (8, False), (32, True)]


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_tuner_respects_its_budget_and_picks_the_fastest_it_measured():
    # each candidate has a known step cost; the fake step advances a fake clock by it
    cost = {8: 1.0, 4: 0.6, 2: 0.8, 1: 0.9}
    clock, state = FakeClock(), {}
    trainer = SimpleNamespace(caps=CPU_BF16, opt=None)

    def apply(_, c):
        state["c"] = c

    def step():
        clock.now += cost[state["c"].micro_batch]

    cands = [at.Candidate("bf16", m, 8 // m) for m in (8, 4, 2, 1)]
    predicted = {8: 0.5, 4: 0.55, 2: 0.6, 1: 0.7}        # prediction order: 8, 4, 2, 1
    tuner = at.Tuner(trainer, step, budget_s=7.0, predictor=lambda c: at.Prediction(True, predicted[c.micro_batch]),
                     compile_requested="off", remaining_steps=1000, apply=apply, clock=clock)
    r = tuner.run(cands, at.rule_choices(CPU_BF16, data_in_memory=True))
    # trial 1 (8): 3 steps = 3.0 s; trial 2 (4) expected 3 x 0.55 -> 4.65 s <= 7 runs: 3 x 0.6 -> 4.8 s;
    # trial 3 (2) expected 4.8 + 1.8 = 6.6 <= 7 runs -> 7.2 s; trial 4 would end past 7: not run
    assert [t.candidate.micro_batch for t in r.trials] == [8, 4, 2]
    assert r.chosen == at.Candidate("bf16", 4, 2)           # fastest measured, not the predicted best
    assert state["c"] == r.chosen                           # and applied to the trainer
    # at most one trial past the check, plus the confirmation of the winner: 8 and 4 timed again
    assert r.tuning_s <= 7.0 + cost[2] * (1 + at.TRIAL_STEPS) + (cost[8] + cost[4]) * (1 + at.TRIAL_STEPS)
    assert r.to_dict()["chosen"]["micro_batch"] == 4
    assert [t.steps for t in r.trials] == [6, 6, 3]          # the two compared twice, 2 + 1 warm-up each


def test_a_challenger_that_won_by_luck_is_timed_again_and_loses():
    """Micro-batch 4 is timed during a quiet moment (0.6 s/step), later it runs at its true
    1.05 s/step; the incumbent 8 runs at 1.0 s/step throughout: after timing both again, 8 stays."""
    clock, state, seen = FakeClock(), {}, {"n4": 0}
    trainer = SimpleNamespace(caps=CPU_BF16, opt=None)

    def apply(_, c):
        state["c"] = c

    def step():
        m = state["c"].micro_batch
        if m == 4:
            seen["n4"] += 1
            clock.now += 0.6 if seen["n4"] <= 3 else 1.05
        else:
            clock.now += 1.0

    cands = [at.Candidate("bf16", m, 8 // m) for m in (8, 4)]
    tuner = at.Tuner(trainer, step, budget_s=100.0, predictor=None, compile_requested="off",
                     remaining_steps=1000, apply=apply, clock=clock)
    r = tuner.run(cands, at.rule_choices(CPU_BF16, data_in_memory=True))
    assert r.chosen == at.Candidate("bf16", 8, 1) and state["c"] == r.chosen
    assert seen["n4"] == 6                                   # timed twice: 2 x (warm-up + 2 steps)


def test_tuner_default_budget_is_a_tenth_of_the_run():
    clock, state = FakeClock(), {}
    trainer = SimpleNamespace(caps=CPU_BF16, opt=None)
    step = lambda: setattr(clock, "now", clock.now + 1.0)
    tuner = at.Tuner(trainer, step, budget_s=None, predictor=None, compile_requested="off",
                     remaining_steps=100, apply=lambda _, c: state.update(c=c), clock=clock)
    r = tuner.run([at.Candidate("bf16", m, 8 // m) for m in (8, 4, 2, 1)], at.rule_choices(CPU_BF16, data_in_memory=True))
    assert r.budget_s == pytest.approx(10.0)                 # 10% of 100 steps x 1 s
    assert len(r.trials) == 3 and r.tuning_s <= 10.0         # 3 trials x 3 s; a fourth would reach 12 s


def test_tuner_refuses_when_nothing_fits():
    from tensorpilot.errors import ConfigError

    tuner = at.Tuner(SimpleNamespace(caps=CPU_BF16), lambda: None, budget_s=1, compile_requested="off",
                     predictor=lambda c: at.Prediction(False, 1.0, 50 * 2**30, "needs 50 GiB of 22"),
                     remaining_steps=10, apply=lambda *_: None)
    with pytest.raises(ConfigError, match="no configuration fits"):
        tuner.run([at.Candidate("bf16", 8, 1)], at.rule_choices(CPU_BF16, data_in_memory=True))


def test_rules_keep_cpu_cores_for_compute():
    assert at.rule_choices(CPU_BF16, data_in_memory=True).num_workers == 0
    assert at.rule_choices(AMPERE, data_in_memory=False, cpu_count=32, local_devices=8).num_workers == 3
    assert at.rule_choices(AMPERE, data_in_memory=True).optimizer_impl == "fused"


# ------------------------------------------------------------------------- batch-size finder
def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))


def _try(model, budget):
    def run(n):
        with at.ActivationBudget(budget, model.parameters()):
            model(torch.randn(n, 16)).sum().backward()
        model.zero_grad(set_to_none=True)
    return run


def _fits(model, budget, n):
    try:
        _try(model, budget)(n)
        return True
    except torch.OutOfMemoryError:
        return False


@pytest.fixture
def frozen_heap():
    """find_batch_size collects garbage after every trial (so that freed memory is back before the
    next one); in a test session the collector then walks every object the imports and earlier
    tests left, ~0.3 s a trial. Those are frozen for the test (gc.freeze: kept, not walked); what
    the trials allocate is collected as before."""
    import gc

    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("budget_kib", [8, 40, 120])
def test_batch_size_finder_matches_a_linear_scan(budget_kib, frozen_heap):
    model, budget = _mlp(), budget_kib * 1024
    found = at.find_batch_size(_try(model, budget), start=1, limit=160)
    reference = max((n for n in range(1, 161) if _fits(model, budget, n)), default=0)   # brute force
    assert found == reference
    assert found > 0


def test_batch_size_finder_when_nothing_fits_and_when_everything_fits(frozen_heap):
    model = _mlp()
    assert at.find_batch_size(_try(model, 16), start=1, limit=64) == 0
    assert at.find_batch_size(_try(model, 2**40), start=1, limit=100) == 100


def test_activation_budget_counts_saved_tensors():
    model = nn.Linear(100, 100, bias=False)
    with at.ActivationBudget(2**30, model.parameters()) as b:
        model(torch.randn(8, 100)).sum()
    # Linear saves its input (8 x 100 fp32 = 3200 bytes) for the weight gradient, and its
    # weight (a parameter, not an activation) for the input gradient
    assert b.saved_bytes == 8 * 100 * 4


def test_apply_candidate_switches_recomputation_off_again():
    from tensorpilot import modules
    from tensorpilot.workloads.gpt import GPT, GPTConfig

    m = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=16))
    plain = {n: type(b.__dict__.get("forward")) for n, b in m.named_modules()}
    modules.apply_activation_checkpointing(m)
    modules.remove_activation_checkpointing(m)
    assert {n: type(b.__dict__.get("forward")) for n, b in m.named_modules()} == plain


def test_candidate_labels_are_distinct():
    cands = at.enumerate_candidates(AMPERE, global_batch=16)
    labels = [c.label for c in cands] + [replace(c, compile=True).label for c in cands]
    assert len(set(labels)) == len(labels)


def test_tuner_never_runs_past_the_end_of_a_short_run():
    clock, state, steps = FakeClock(), {}, []
    trainer = SimpleNamespace(caps=CPU_BF16, opt=None)
    step = lambda: (steps.append(1), setattr(clock, "now", clock.now + 1.0))
    cands = [at.Candidate("bf16", m, 8 // m) for m in (8, 4, 2, 1)]
    for remaining in (3, 7, 12):
        steps.clear()
        r = at.Tuner(trainer, step, budget_s=1e9, predictor=None, compile_requested="off",
                     remaining_steps=remaining, apply=lambda _, c: state.update(c=c), clock=clock
                     ).run(cands, at.rule_choices(CPU_BF16, data_in_memory=True))
        assert len(steps) + 1 + at.TRIAL_STEPS <= remaining or not r.trials
        assert state["c"] == r.chosen


def test_a_lower_ranked_candidate_must_beat_the_incumbent_by_more_than_noise():
    clock, state = FakeClock(), {}
    cost = {8: 1.0, 4: 0.99, 2: 0.90}                      # 4 is within noise of 8; 2 is clearly faster
    step = lambda: setattr(clock, "now", clock.now + cost[state["c"].micro_batch])
    r = at.Tuner(SimpleNamespace(caps=CPU_BF16, opt=None), step, budget_s=1e9, predictor=None,
                 compile_requested="off", remaining_steps=1000, apply=lambda _, c: state.update(c=c), clock=clock
                 ).run([at.Candidate("bf16", m, 8 // m) for m in (8, 4, 2)], at.rule_choices(CPU_BF16, data_in_memory=True))
    assert r.chosen.micro_batch == 2
    cost[2] = 0.98
    r = at.Tuner(SimpleNamespace(caps=CPU_BF16, opt=None), step, budget_s=1e9, predictor=None,
                 compile_requested="off", remaining_steps=1000, apply=lambda _, c: state.update(c=c), clock=clock
                 ).run([at.Candidate("bf16", m, 8 // m) for m in (8, 4, 2)], at.rule_choices(CPU_BF16, data_in_memory=True))
    assert r.chosen.micro_batch == 8                       # none beat the first by more than 3%


def compile_tuner(budget_s, eager, compiled, compile_s=20.0):
    """A Tuner over fake steps: ``eager`` / ``compiled`` map micro-batch -> step seconds, and the
    first step after switching to a compiled candidate also pays ``compile_s``."""
    clock, state = FakeClock(), {"fresh": False}

    def apply(_, c):
        state.update(c=c, fresh=c.compile)

    def step():
        c = state["c"]
        clock.now += (compiled if c.compile else eager)[c.micro_batch] + (compile_s if state["fresh"] else 0.0)
        state["fresh"] = False

    tuner = at.Tuner(SimpleNamespace(caps=CPU_BF16, opt=None), step, budget_s=budget_s, predictor=None,
                     compile_requested="on", remaining_steps=10_000, apply=apply, clock=clock)
    cands = [at.Candidate("bf16", m, 32 // m) for m in (32, 16)]
    return tuner.run(cands, at.rule_choices(CPU_BF16, data_in_memory=True)), state


def test_compiled_runner_up_can_win_when_the_budget_holds_a_second_compilation():
    # eagerly 32 x 1 wins (1.00 vs 1.05 s: within the reorder margin); compiled, 16 x 2 is faster
    r, state = compile_tuner(200.0, eager={32: 1.00, 16: 1.05}, compiled={32: 0.95, 16: 0.80})
    assert [(t.candidate.micro_batch, t.candidate.compile) for t in r.trials] == \
        [(32, False), (16, False), (32, True), (16, True)]
    assert r.chosen == at.Candidate("bf16", 16, 2, compile=True) and state["c"] == r.chosen
    assert "fastest of 2 compiled" in r.reason


def test_without_budget_for_a_second_compilation_only_the_eager_winner_is_compiled():
    # 6.15 s of eager trials + 22.85 s for the first compile trial leave 21 s of 50:
    # less than COMPILE_TRIAL_ESTIMATE_S
    r, state = compile_tuner(50.0, eager={32: 1.00, 16: 1.05}, compiled={32: 0.95, 16: 0.80})
    assert [(t.candidate.micro_batch, t.candidate.compile) for t in r.trials] == \
        [(32, False), (16, False), (32, True)]
    assert r.chosen == at.Candidate("bf16", 32, 1, compile=True) and state["c"] == r.chosen
    assert r.extra["compile_trials_skipped"] == ["bf16 16x2 compile"]


def test_a_runner_up_far_behind_eagerly_gets_no_compiled_trial():
    r, _ = compile_tuner(1e9, eager={32: 1.00, 16: 1.30}, compiled={32: 0.95, 16: 0.50})
    assert [(t.candidate.micro_batch, t.candidate.compile) for t in r.trials] == \
        [(32, False), (16, False), (32, True)]
    assert r.chosen == at.Candidate("bf16", 32, 1, compile=True)
