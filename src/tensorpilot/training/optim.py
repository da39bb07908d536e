"""AdamW with decoupled weight decay on matrices only, a warm-up + cosine schedule, and
parameter freezing by name pattern."""

from __future__ import annotations

import fnmatch
import math

import torch
from torch import nn

from tensorpilot.config import OptimConfig
from tensorpilot.errors import ConfigError


def freeze(model: nn.Module, patterns: list[str]) -> list[str]:
    """Set requires_grad=False on parameters matching any glob; returns the frozen names."""
    names = [n for n, _ in model.named_parameters()]
    for pat in patterns:
        if not any(fnmatch.fnmatchcase(n, pat) for n in names):
            raise ConfigError(f"optim.freeze pattern {pat!r} matches no parameter "
                              f"(names look like {names[0]!r}).")
    frozen = []
    for name, p in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, pat) for pat in patterns):
            p.requires_grad_(False)
            frozen.append(name)
    if len(frozen) == len(names):
        raise ConfigError("optim.freeze froze every parameter: nothing would train.")
    return frozen


def build_optimizer(model: nn.Module, cfg: OptimConfig, device_kind: str) -> tuple[torch.optim.AdamW, str]:
    """AdamW over trainable parameters; returns (optimizer, implementation used)."""
    params = [p for p in model.parameters() if p.requires_grad]
    # weight decay on matrices (linear, embedding, conv weights), not on biases and norm gains
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # tensor parallelism leaves some parameters plain and makes others DTensors; one foreach/fused
    # kernel call cannot mix the two, so they go to separate groups (one group per kind otherwise)
    groups = [{**g, "params": [p for p in g["params"] if hasattr(p, "placements") == dt]}
              for g in groups for dt in (False, True)]
    groups = [g for g in groups if g["params"]]
    impl = cfg.impl
    if impl == "auto":
        impl = "fused" if device_kind in ("cuda", "cpu", "mps", "xpu") else "foreach"
    kwargs = dict(lr=cfg.lr, betas=tuple(cfg.betas))
    if impl == "fused":
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs), "fused"
        except (RuntimeError, ValueError):   # dtype/device without a fused kernel
            impl = "foreach"
    return torch.optim.AdamW(groups, foreach=impl == "foreach", **kwargs), impl


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine decay to ``min_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(opt: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int):
    warmup = min(cfg.warmup_steps, max(0, total_steps - 1))
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, warmup_steps=warmup, total_steps=total_steps, min_ratio=cfg.min_lr_ratio))
