"""The engine's training step equals a plain PyTorch loop doing the same thing by hand."""

from __future__ import annotations

import math

import pytest
import torch

import tensorpilot
from tensorpilot.config import RunConfig
from tensorpilot.training.trainer import Trainer
from tensorpilot.workloads.base import Workload
from tensorpilot.workloads.data import ShuffledEpochs


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def make_data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(96, 6, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, 0] * 3).long().clamp(-1, 1) + 1)


def cfg_for(tmp_path, **over) -> RunConfig:
    cfg = RunConfig()
    cfg.run_dir = str(tmp_path / "run")
    cfg.engine.precision, cfg.engine.compile, cfg.engine.grad_accum = "fp32", "off", 2
    cfg.data.batch_size = 4
    cfg.train.steps, cfg.train.eval_interval, cfg.train.seed = 7, 1000, 5
    cfg.optim.warmup_steps, cfg.optim.grad_clip, cfg.optim.lr = 3, 0.5, 1e-2
    cfg.logging.progress, cfg.logging.tensorboard = "off", False
    cfg.checkpoint.enabled = False
    for k, v in over.items():
        section, key = k.split("__")
        setattr(getattr(cfg, section), key, v)
    return cfg


def reference_params(cfg: RunConfig, freeze_first: bool = False):
    """What the engine should compute, written out with plain torch: same sample order
    (ShuffledEpochs), mean of micro-batch losses, clip, AdamW with decay on matrices only,
    linear warm-up then cosine to min_lr_ratio."""
    model = make_model()
    if freeze_first:
        model[0].weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.optim.weight_decay},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=cfg.optim.lr, betas=tuple(cfg.optim.betas))
    data = ShuffledEpochs(make_data(), cfg.train.seed)
    B, A, W, S = cfg.data.batch_size, cfg.engine.grad_accum, cfg.optim.warmup_steps, cfg.train.steps
    seen = 0
    for step in range(S):
        factor = (step + 1) / W if step < W else \
            cfg.optim.min_lr_ratio + (1 - cfg.optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * (step - W) / (S - W)))
        for group in opt.param_groups:
            group["lr"] = cfg.optim.lr * factor
        for _ in range(A):
            batch = [data[i] for i in range(seen, seen + B)]
            seen += B
            x = torch.stack([b[0] for b in batch])
            y = torch.stack([b[1] for b in batch])
            (torch.nn.functional.cross_entropy(model(x), y) / A).backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad()
    return model.state_dict()


@pytest.mark.parametrize("freeze", [False, True])
def test_engine_matches_plain_pytorch(tmp_path, freeze):
    cfg = cfg_for(tmp_path)
    if freeze:
        cfg.optim.freeze = ["0.weight"]
    model = make_model()
    before = model[0].weight.detach().clone()
    Trainer(cfg, Workload(model=model, train_data=make_data())).fit()
    expected = reference_params(cfg, freeze_first=freeze)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-6, msg=name)
    if freeze:
        assert torch.equal(model[0].weight, before)


def test_dataloader_workers_do_not_change_the_run(tmp_path):
    results = []
    for workers in (0, 1):
        cfg = cfg_for(tmp_path / str(workers), data__num_workers=workers)
        model = make_model()
        tensorpilot.train(Workload(model=model, train_data=make_data()), config=cfg)
        results.append(model.state_dict())
    for k in results[0]:
        assert torch.equal(results[0][k], results[1][k]), k


def test_compile_failure_falls_back_to_eager_and_says_so(tmp_path, monkeypatch):
    from torch._inductor.exc import CppCompileError

    from tensorpilot import modules

    class Broken(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            raise CppCompileError(["c++", "kernel.cpp"], "simulated C++ compile error")

    monkeypatch.setattr(modules, "apply_compile", lambda m, *a, **k: Broken(m))
    cfg = cfg_for(tmp_path, engine__compile="on")
    model = make_model()
    summary = Trainer(cfg, Workload(model=model, train_data=make_data())).fit()
    assert summary["compiled"] is False and "fell back to eager" in summary["compile_reason"]
    expected = reference_params(cfg)   # the failed attempt left no trace in the weights
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-6)


def test_an_error_in_a_compiled_step_that_is_not_the_compilers_is_not_hidden(tmp_path, monkeypatch):
    """Only compiler errors fall back to eager: a bug in the step (here a RuntimeError from the
    model, as an OOM or a broken loss would raise) ends the run as itself."""
    from tensorpilot import modules

    class Buggy(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("shape mismatch in the user's model")

    monkeypatch.setattr(modules, "apply_compile", lambda m, *a, **k: Buggy())
    cfg = cfg_for(tmp_path, engine__compile="on")
    with pytest.raises(RuntimeError, match="shape mismatch in the user's model"):
        Trainer(cfg, Workload(model=make_model(), train_data=make_data())).fit()
