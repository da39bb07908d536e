"""A workload: a model, its train/validation data and its loss — everything the engine trains."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn


@dataclass(kw_only=True)
class Workload:
    model: nn.Module
    train_data: Any                     # map-style Dataset (with __getitems__ ideally) or DataLoader
    val_data: Any = None
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # (output, target)
    tokens_per_sample: int | None = None   # language models: tokens in one sample, for tokens/s
    kind: str = "custom"                # "gpt" | "mlp" | "cnn" | "custom"
    meta: dict[str, Any] = field(default_factory=dict)  # facts for summary/generate (e.g. vocab)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (self.loss_fn or cross_entropy)(output, target)


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The default loss. Classification / next-token: (..., C) logits vs (...) class indices."""
    return nn.functional.cross_entropy(output.flatten(0, -2).float(), target.flatten())
