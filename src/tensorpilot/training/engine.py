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


_RUNNING_STATS = (nn.modules.batchnorm._BatchNorm,)


def apply_activation_checkpointing(model: nn.Module) -> tuple[int, int]:
    """Recompute each block's activations during backward. Blocks holding BatchNorm are left
    alone: recomputing their forward would update the running statistics a second time.
    Returns (blocks checkpointed, blocks skipped)."""
    blocks = [b for b in repeated_blocks(model) if not any(isinstance(m, _RUNNING_STATS) for m in b.modules())]
    skipped = len(repeated_blocks(model)) - len(blocks)
    for block in blocks:
        # wrap the bound forward instead of the module, so parameter names stay unchanged
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return len(blocks), skipped


def remove_activation_checkpointing(model: nn.Module) -> None:
    """Undo ``apply_activation_checkpointing`` (autotune trials switch it on and off)."""
    for block in repeated_blocks(model):
        if isinstance(block.__dict__.get("forward"), functools.partial):
            del block.forward                      # the class's forward shows through again


# Measured on the 2-core dev CPU (benchmarks/RESULTS.md): compiling the tiny gpt costs ~25 s and
# saves ~25% of a step; the small gpt ~16 s for ~15%. Compilation repays itself after roughly
# 100 s of eager training; 'auto' asks for twice that.
COMPILE_WORTH_S = 200.0


def compile_decision(requested: str, caps: DeviceCaps, remaining_steps: int,
                     eager_step_s: float | None = None) -> tuple[bool | None, str]:
    """Whether to torch.compile, and why. ``None`` means 'time an eager step first': 'auto'
    compiles when the rest of the run, at the measured eager step time, would last longer
    than ``COMPILE_WORTH_S``."""
    if requested == "off":
        return False, "compile off as requested"
    has_cxx = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
    if requested == "on":
        note = "" if has_cxx or caps.kind != "cpu" else " (no C++ compiler found: it will probably fall back)"
        return True, "compile on as requested" + note
    if caps.kind == "cpu" and not has_cxx:
        return False, "auto: not compiling, inductor needs a C++ compiler on CPU and none was found"
    if caps.kind == "mps":
        return False, "auto: not compiling on MPS (inductor support there is experimental)"
    if eager_step_s is None:
        return None, "auto: deciding after timing an eager step"
    rest_s = remaining_steps * eager_step_s
    if rest_s < COMPILE_WORTH_S:
        return False, (f"auto: not compiling, the remaining {remaining_steps} steps take ~{rest_s:.0f} s "
                       f"eager, too short to repay compilation (< {COMPILE_WORTH_S:.0f} s)")
    return True, (f"auto: compiling, the remaining {remaining_steps} steps would take ~{rest_s:.0f} s "
                  "eager, long enough to repay compilation")


def set_attention(model: nn.Module, impl: str) -> int:
    """Switch every attention module that offers a choice (an ``attention_impl`` attribute, like
    the built-in gpt's) to ``impl``; returns how many were switched."""
    mods = [m for m in model.modules() if hasattr(type(m), "attention_impl")]
    for m in mods:
        m.attention_impl = impl
    return len(mods)


def apply_compile(model: nn.Module, mode: str = "default", device_kind: str | None = None) -> nn.Module:
    """``mode="reduce-overhead"`` adds CUDA graphs (replaying a step's kernels in one launch):
    for GPUs with static shapes, where launch overhead dominates small steps. On a CPU the
    attention is switched to the materialised form inductor fuses (faster than the CPU flash
    kernel; ``undo_compile`` switches it back if compilation fails)."""
    if device_kind == "cpu":
        set_attention(model, "math")
    return torch.compile(model, mode=None if mode == "default" else mode)


def undo_compile(model: nn.Module) -> nn.Module:
    """The eager model again, with the attention kernels eager runs fastest."""
    set_attention(model, "sdpa")
    return model
