"""Techniques applied to a model from outside, in this order (each comment says why):

1. ``apply_activation_checkpointing`` — before compile, so the compiler sees the checkpoint
   regions (torch.compile traces through ``torch.utils.checkpoint`` as a higher-order op).
2. ``apply_compile`` — last on one device; (FSDP would wrap after this, issue 6).

The model's own code never changes, and its state_dict keys never change either: checkpoints
load the same with or without these techniques.
"""

from __future__ import annotations

import functools
import shutil

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tensorpilot.hardware.device import DeviceCaps


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The elements of every nn.ModuleList in the model: the 'blocks' of a transformer or net."""
    return [m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst]


def apply_activation_checkpointing(model: nn.Module) -> int:
    """Recompute each block's activations during backward; returns the number of blocks."""
    blocks = repeated_blocks(model)
    for block in blocks:
        # wrap the bound forward instead of the module, so parameter names stay unchanged
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return len(blocks)


def compile_decision(requested: str, caps: DeviceCaps, steps: int) -> tuple[bool, str]:
    """Whether to torch.compile, and why. Compilation costs tens of seconds once on a 2-core CPU
    (measured: benchmarks/RESULTS.md), so 'auto' compiles when the run is long enough to repay it."""
    if requested == "off":
        return False, "compile off as requested"
    if caps.kind == "cpu" and not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        if requested == "on":
            return True, "compile on as requested (no C++ compiler found: it will probably fall back)"
        return False, "auto: not compiling, inductor needs a C++ compiler on CPU and none was found"
    if requested == "on":
        return True, "compile on as requested"
    if caps.kind == "mps":
        return False, "auto: not compiling on MPS (inductor support there is experimental)"
    min_steps = 200 if caps.kind == "cpu" else 100
    if steps < min_steps:
        return False, f"auto: not compiling, {steps} steps are too few to repay compilation (< {min_steps})"
    return True, f"auto: compiling, {steps} steps repay the one-off compilation"


def apply_compile(model: nn.Module) -> nn.Module:
    return torch.compile(model)
