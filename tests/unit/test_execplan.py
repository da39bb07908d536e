"""The execution plan, the trainer's one door (``Trainer.apply``), the workload spec registry, and
what a run leaves as it found it (the caller's RunConfig, signal handlers)."""

from __future__ import annotations

import copy
import dataclasses
import json
import signal

import pytest
import torch

import tensorpilot
from tensorpilot import modules
from tensorpilot.config import RunConfig
from tensorpilot.errors import ConfigError
from tensorpilot.layout import Layout
from tensorpilot.training.execplan import ExecutionPlan
from tensorpilot.training.trainer import Trainer
from tensorpilot.workloads import specs
from tensorpilot.workloads.base import Workload


class Blocks(torch.nn.Module):
    """Two repeated blocks (what checkpointing and regional compile act on) and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
                                          for _ in range(2))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def data(n=128):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())


def config(tmp_path, **over) -> RunConfig:
    cfg = RunConfig()
    cfg.run_dir = str(tmp_path / "run")
    cfg.engine.precision, cfg.engine.compile, cfg.engine.grad_accum = "fp32", "off", 2
    cfg.data.batch_size = 8
    cfg.train.steps, cfg.train.eval_interval, cfg.train.eval_batches = 6, 1000, 2
    cfg.logging.progress, cfg.logging.tensorboard = "off", False
    cfg.checkpoint.enabled = False
    for k, v in over.items():
        section, key = k.split("__")
        setattr(getattr(cfg, section), key, v)
    return cfg.validate()


# ----------------------------------------------------------------------------- the value
def test_plan_rejects_unknown_settings_and_keeps_its_layout_in_step():
    with pytest.raises(ValueError, match="precision"):
        ExecutionPlan(device="cpu", precision="auto", micro_batch=4, grad_accum=1)
    with pytest.raises(ValueError, match="compile"):
        ExecutionPlan(device="cpu", precision="fp32", micro_batch=4, grad_accum=1, compile="maybe")
    p = ExecutionPlan(device="cpu", precision="bf16", micro_batch=4, grad_accum=2, layout=Layout(dp=2),
                      activation_checkpointing="blocks")
    # the layout the planner sees is this very step: micro-batch and recomputation follow the plan
    assert (p.layout.micro_batch, p.layout.recompute) == (4, "full")
    assert p.samples_per_step == 4 * 2 * 2
    q = p.replace(micro_batch=8, grad_accum=1, why={"micro_batch": "tuned"})
    assert (q.layout.micro_batch, q.samples_per_step, q.reason("micro_batch")) == (8, 16, "tuned")
    assert p.micro_batch == 4                                  # frozen: replace made a copy
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.micro_batch = 2
    d = json.loads(json.dumps(q.to_dict()))
    assert d["layout"]["dp"] == 2 and d["label"] == "bf16 8x1 ckpt"


def test_layout_has_one_sharding_vocabulary():
    assert Layout(sharding="ddp").sharding == "none" and Layout(sharding="zero3").sharding == "fsdp"
    assert Layout(dp=2, sharding="zero3").name == "fsdp" and Layout(dp=2, tp=2).name == "dp x tp"
    with pytest.raises(ConfigError, match="unknown sharding"):
        Layout(sharding="zero-9")


# -------------------------------------------------------------------------- the one door
def test_apply_changes_the_running_trainer_and_nothing_else(tmp_path):
    cfg = config(tmp_path)
    before = copy.deepcopy(cfg.to_dict())
    t = Trainer(cfg, Workload(model=Blocks(), train_data=data()))
    t.setup()
    try:
        assert (t.plan.micro_batch, t.plan.grad_accum, t.plan.precision) == (8, 2, "fp32")
        x, _ = next(t.batches)
        assert x.shape[0] == 8
        weights = {k: v.clone() for k, v in t.model.state_dict().items()}

        t.apply(t.plan.replace(micro_batch=4, grad_accum=4, activation_checkpointing="blocks", precision="bf16"))
        assert next(t.batches)[0].shape[0] == 4               # the loader follows the plan
        assert t.ac_blocks == 2 and all(
            isinstance(b.__dict__.get("forward"), __import__("functools").partial) for b in t.model.blocks)
        assert t.choice.autocast == "bfloat16"
        for k, v in t.model.state_dict().items():             # training state untouched
            assert torch.equal(v, weights[k]), k

        t.apply(t.plan.replace(activation_checkpointing="none", precision="fp32"))
        assert t.ac_blocks == 0 and all("forward" not in b.__dict__ for b in t.model.blocks)
        assert t.choice.autocast is None

        with pytest.raises(ValueError, match="cannot change"):
            t.apply(t.plan.replace(device="cuda:0"))
        with pytest.raises(ValueError, match="cannot change"):
            t.apply(t.plan.replace(layout=Layout(dp=2)))
        assert cfg.to_dict() == before                       # the configuration is never changed
    finally:
        t.metrics.close()
        t._lock.release()


def test_optimize_auto_produces_plans_and_leaves_the_config_alone(tmp_path):
    cfg = config(tmp_path, engine__optimize="auto", engine__precision="auto", engine__grad_accum=1,
                 data__batch_size=16, train__steps=40, engine__tune_cache=False)
    before = copy.deepcopy(cfg.to_dict())
    summary = tensorpilot.train(Blocks(), data(512), config=cfg)
    assert cfg.to_dict() == before
    chosen, plan = summary["autotune"]["chosen"], summary["execution_plan"]
    # the plan the run ended with is the tuner's choice, and the summary reports it
    assert (plan["micro_batch"], plan["grad_accum"], plan["precision"]) == \
        (chosen["micro_batch"], chosen["grad_accum"], chosen["precision"])
    assert summary["grad_accum"] == plan["grad_accum"]
    assert plan["micro_batch"] * plan["grad_accum"] == 16     # the global batch is kept


def test_a_failing_run_restores_the_callers_signal_handlers(tmp_path):
    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 3)

        def forward(self, x):
            raise ValueError("a bug in the user's forward")

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGINT, mine)
    try:
        with pytest.raises(ValueError, match="a bug in the user's forward"):
            tensorpilot.train(Broken(), data(), config=config(tmp_path, train__memory_check=False))
        assert signal.getsignal(signal.SIGINT) is mine
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, previous)


def test_api_train_does_not_change_the_config_it_is_given(tmp_path):
    cfg = config(tmp_path, train__steps=2)
    before = copy.deepcopy(cfg.to_dict())
    tensorpilot.train(Blocks(), data(), config=cfg, overrides={"train.steps": 3})
    assert cfg.to_dict() == before


# ------------------------------------------------------------------------ the spec registry
def test_every_kind_has_a_spec_and_others_get_the_generic_one():
    assert set(specs.builtin_names()) <= set(specs.SPECS)
    assert specs.get("python:MyNet") is specs.GENERIC and specs.get(None) is specs.GENERIC
    with pytest.raises(ConfigError, match="tensor parallelism .* not available for the custom"):
        specs.GENERIC.tp_plan(Blocks(), 2, False)
    with pytest.raises(ConfigError, match="pipeline parallelism .* not available for the mlp"):
        specs.get("mlp").stage(Blocks(), 2, 0)
    with pytest.raises(ConfigError, match="unknown model 'resnet'"):
        specs.check_model_name("resnet")
    specs.check_model_name("pkg.mod:make")                   # a factory passes


def test_gpt_spec_describes_the_model_it_builds():
    """The gpt's planner description counts the parameters the built model has (an independent
    count: the module's own tensors), and its tensor-parallel plan names modules that exist."""
    pytest.importorskip("torch.distributed.tensor.parallel")
    from tensorpilot.workloads.gpt import GPT, GPTConfig

    gcfg = GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=16, tie_head=False)
    model = GPT(gcfg)
    spec = specs.get("gpt")
    planned, tokens = spec.plan_model({"gpt": {k: getattr(gcfg, k) for k in gcfg.__slots__}})
    assert tokens == 16
    assert planned.n_params == sum(p.numel() for p in model.parameters())
    plans = spec.tp_plan(model, 2, sequence_parallel=True)
    for module, plan in plans:
        for name in plan:
            module.get_submodule(name)                       # raises if the name is wrong
    stage = spec.stage(model, 2, 1)                          # the last stage: blocks 1.., head
    assert list(stage.blocks) == ["1"] and hasattr(stage, "head") and not hasattr(stage, "tok_emb")


def test_memory_format_trials_follow_the_model_not_its_name():
    """A user's conv net (any nn.Conv2d) gets channels_last candidates like the built-in cnn."""
    from tensorpilot.hardware.device import DeviceCaps
    from tensorpilot.training import autotune as at

    caps = DeviceCaps(kind="cpu", name="cpu", cpu_flags=frozenset({"avx512_bf16"}))
    conv = at.enumerate_candidates(caps, global_batch=8, convolutional=True)
    dense = at.enumerate_candidates(caps, global_batch=8, convolutional=False)
    assert {c.channels_last for c in conv} == {False, True} and {c.channels_last for c in dense} == {False}


def test_peak_memory_is_reset_after_tuning_on_linux():
    """After a 256 MiB transient (what a batch-size probe leaves), reset_peak makes the reported
    peak the current resident size again. A fresh interpreter: this process's allocator may keep
    freed memory (engine.retain_freed_host_memory), which is resident and rightly counted."""
    import subprocess
    import sys
    from pathlib import Path

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("the process peak can be reset on Linux only")
    code = ("import torch, json\n"
            "from tensorpilot.observe import memory as mem\n"
            "big = torch.ones(256 * 2**20 // 4); del big\n"
            "high = mem.peak_memory('cpu')[0]; mem.reset_peak('cpu')\n"
            "print(json.dumps([high, *mem.peak_memory('cpu')]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    high, low, method = json.loads(out.stdout.strip().splitlines()[-1])
    assert "VmHWM" in method and low < high - 128 * 2**20
    assert modules.repeated_blocks(Blocks())                  # (the shared helper module imports)
