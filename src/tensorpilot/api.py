"""The public Python API. The CLI is a thin layer over these functions."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, Callable

from tensorpilot.config import RunConfig, apply_mapping, overrides_to_mapping
from tensorpilot.errors import CheckpointError, ConfigError


def train(model=None, data=None, loss_fn: Callable | None = None, *, val_data=None,
          config: RunConfig | None = None, tokens_per_sample: int | None = None,
          overrides: dict[str, Any] | None = None, console=None) -> dict[str, Any]:
    """Train and return the summary (also written to ``<run_dir>/summary.json``).

    ``model`` may be an ``nn.Module`` (then give ``data``: a map-style Dataset of (input, target)
    samples or a DataLoader, and optionally ``loss_fn(output, target)``, default cross-entropy),
    a :class:`tensorpilot.Workload`, or None for the workload ``config.model`` names.
    ``overrides`` are dotted settings, e.g. ``{"train.steps": 100, "optim.lr": 1e-3}``.

    >>> import torch, tensorpilot                                           # doctest: +SKIP
    >>> data = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))
    >>> tensorpilot.train(torch.nn.Linear(8, 2), data, overrides={"train.steps": 20})
    """
    from tensorpilot.training.trainer import Trainer

    cfg, workload = _run(model, data, loss_fn, val_data, config, tokens_per_sample, overrides, "train")
    return Trainer(cfg, workload, console=console).fit()


def _run(model, data, loss_fn, val_data, config, tokens_per_sample, overrides, verb: str):
    """(RunConfig, Workload or None) of a train()/profile() call."""
    from tensorpilot.workloads.base import Workload

    # the caller's config is theirs: the run works on a copy (RunConfig is never changed by a run)
    cfg = copy.deepcopy(config) if config is not None else RunConfig()
    if overrides:
        apply_mapping(cfg, overrides_to_mapping(overrides))
    workload = None
    if isinstance(model, Workload):
        workload = model
    elif model is not None:
        if data is None:
            raise ConfigError(f"{verb}(model, data): give the training data with the model.")
        workload = Workload(model=model, train_data=data, val_data=val_data, loss_fn=loss_fn,
                            tokens_per_sample=tokens_per_sample)
    if workload is not None and ":" not in cfg.model.name:
        # name the user's model in summaries and checkpoints, e.g. "python:MyNet"
        cfg.model.name = f"python:{type(workload.model).__name__}"
    return cfg.validate(), workload


def profile(model=None, data=None, loss_fn: Callable | None = None, *, config: RunConfig | None = None,
            overrides: dict[str, Any] | None = None, steps: int = 5, warmup: int = 3, out: str | Path = "profile",
            apply: bool = False, top_k: int = 10, tokens_per_sample: int | None = None,
            console=None) -> dict[str, Any]:
    """Profile the run ``train`` would do with the same arguments and return the diagnosis (also
    written to ``<out>/profile.json``, with ``trace.json.gz`` and ``profile.png``): the step's
    ``breakdown`` (category -> seconds and share), ``roofline``, top ``modules`` and ranked
    ``findings`` [{kind, share_of_step, evidence, fix, flag, setting}]; with ``apply=True`` also
    ``apply``: the step time before and after the top finding's setting. See docs/profile.md.

    >>> import torch, tensorpilot                                           # doctest: +SKIP
    >>> data = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))
    >>> tensorpilot.profile(torch.nn.Linear(8, 2), data, out="prof")["findings"]
    """
    from tensorpilot.profiling.run import ProfileOptions
    from tensorpilot.profiling.run import profile as run_profile

    if not 0 < steps <= 1000 or warmup < 0:
        raise ConfigError(f"profile(steps=...) must be from 1 to 1000 and warmup >= 0, got {steps} and {warmup}.")
    cfg, workload = _run(model, data, loss_fn, None, config, tokens_per_sample, overrides, "profile")
    if console is None:
        from rich.console import Console

        console = Console(quiet=True)
    return run_profile(cfg, workload, ProfileOptions(steps=steps, warmup=warmup, out=str(out), top_k=top_k,
                                                     apply=apply), console)


def generate(run: str | Path, prompt: str = "", max_new_tokens: int = 200, temperature: float = 0.8,
             top_k: int | None = 40, seed: int = 0, device: str = "auto") -> str:
    """Sample text from the newest checkpoint of a gpt run (or from a checkpoint directory)."""
    import torch

    from tensorpilot.hardware.device import resolve_device
    from tensorpilot.training import checkpoint as ckpt_io
    from tensorpilot.workloads import specs

    if max_new_tokens <= 0:
        raise ConfigError(f"--tokens must be a positive integer, got {max_new_tokens}.")
    if not (temperature >= 0 and math.isfinite(temperature)) or (top_k is not None and top_k < 0):
        raise ConfigError("temperature must be a finite number >= 0 and top_k an integer >= 0.")
    dev = torch.device(resolve_device(device))
    ckpt = ckpt_io.find_checkpoint(run)
    meta = ckpt_io.read_meta(ckpt)
    workload = meta.get("workload")
    kind = workload.get("kind") if isinstance(workload, dict) else None
    spec = specs.get(kind if isinstance(kind, str) else None)
    if spec.serving != "generate" or not isinstance(workload.get(spec.kind), dict):
        raise CheckpointError(f"{str(run)!r} is not a run of a text model: generate samples from gpt "
                              "checkpoints only.")
    build, _ = spec.rebuild(workload[spec.kind], ckpt)
    ckpt_io.require_one_process(str(run), ckpt, meta, "generate")
    ckpt_io.verify(ckpt, meta)
    # meta.json's sizes are data: the model is allocated only once they match the weights file
    model = ckpt_io.build_checked(ckpt, build)
    ckpt_io.load_weights(ckpt, model)
    model.to(dev).eval()
    # a prompt from a command line may hold undecodable bytes (kept by Python as surrogates)
    ids = list(prompt.encode("utf-8", errors="surrogateescape")) or [ord("\n")]
    idx = torch.tensor([ids], dtype=torch.long, device=dev)
    g = torch.Generator(device=dev).manual_seed(seed)
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=g)
    return bytes(out[0].tolist()).decode("utf-8", errors="replace")
