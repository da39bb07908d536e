"""Techniques applied to a model from outside, in this order (each comment says why):

1. ``apply_activation_checkpointing`` — before compile, so the compiler sees the checkpoint
   regions (torch.compile traces through ``torch.utils.checkpoint`` as a higher-order op).
2. ``apply_compile`` — last on one device; (FSDP would wrap after this, issue 6).

The model's own code never changes, and its state_dict keys never change either: checkpoints
load the same with or without these techniques.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import shutil

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tensorpilot.hardware.device import DeviceCaps


# glibc mallopt parameters (<malloc.h>)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def retain_freed_host_memory() -> str | None:
    """Ask glibc malloc to keep freed memory for reuse instead of handing it back to the kernel.

    By default glibc serves allocations above its mmap threshold (128 KiB, adapting up to
    32 MiB) with a fresh ``mmap`` and returns them with ``munmap`` on free, and trims the top of
    its heap: each training step's activations then arrive as fresh pages, and every first touch
    of a 4 KiB page is a page fault. Here blocks up to 32 MiB (glibc's own adaptive ceiling) come
    from the heap and the heap is never trimmed. Larger blocks keep their own mappings: serving
    them from the heap too (tried: a 1 GiB threshold) lets aligned allocations of one recurring
    size fragment the heap, which grew to 1.6x the resident memory in a scratch test.
    ``benchmarks/host_memory.py`` (gpt small, bf16, 8 x 256 tokens x 2 micro-batches, 2 cores):
    17-33 thousand page faults per step by default, 1-1,300 with this, same peak resident
    memory; step time 1.00-1.07x over three runs, i.e. within this machine's noise on 2 cores
    (page-fault handling costs more where many threads fault at once). PyTorch's CPU tuning
    guide gets the same effect by preloading jemalloc or tcmalloc; this needs no preload and no
    dependency. The cost: the process keeps its peak heap until it exits. Returns a description,
    or None where not applicable (not Linux/glibc, or mallopt refused)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    ok = (mallopt(_M_MMAP_THRESHOLD, 32 << 20)       # blocks up to 32 MiB from the heap
          and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)   # never give the heap's top back
          and mallopt(_M_TOP_PAD, 64 << 20))          # grow the heap 64 MiB at a time
    return "glibc malloc keeps freed memory for reuse (fewer page faults)" if ok else None


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


# Measured on the 2-core dev CPU, per-block compilation with a cold inductor cache: gpt small
# ~17-20 s to compile. Session 3: 8-10% off an eager step (545 -> 500 ms at 16 x 256 tokens), so
# compilation repaid itself after ~200 s of eager training and 'auto' asks for twice that (a warm
# cache, ~3 s, would pay much sooner, but a first run cannot know it has one). Session 4 sped the
# eager step up (exact GeLU, additive mask) and the gain became small and uncertain: two
# alternating trainer runs, `tensorpilot train --size small --batch-size 16 --steps 40
# --precision bf16 --compile on|off`, compiled 492 / 439 ms vs eager 462 / 461 ms (-6% / +5%);
# benchmarks/techniques.py +12% with a warm cache. Which way it goes is model- and device-specific;
# --optimize auto measures it instead of relying on this rule.
COMPILE_WORTH_S = 400.0


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


def choose_attention(model: nn.Module, device_kind: str) -> str | None:
    """The attention kernels for this device, for models that offer a choice; returns what was
    chosen and why (None: the model offers no choice). On a CPU the blocked, materialised "math"
    attention beats PyTorch's CPU flash kernel, eager and compiled (one gpt-small layer, bf16:
    ~2x, benchmarks/cpu_kernels.py; whole steps in scratch runs: gpt small eager 601 vs 700 ms,
    tiny 44 vs 61 ms, fp32 a tie); elsewhere the fused SDPA kernels (flash / memory-efficient) win."""
    impl = "math" if device_kind == "cpu" else "sdpa"
    if not set_attention(model, impl):
        return None
    return ("math: causal blocks of plain matmuls (faster than the CPU flash kernel)" if impl == "math"
            else "sdpa: fused flash / memory-efficient kernels")


def compile_blocks(blocks: list[nn.Module], dynamic: bool | None = None) -> None:
    """Regional compilation: each repeated block gets ``nn.Module.compile`` in place. Identical
    blocks share one compiled graph, so a cold compile costs about one block (gpt small on the dev
    CPU: 17 s instead of 28 s for the whole model, same step time within 2%); parameter names
    and the model object stay unchanged."""
    for block in blocks:
        block.compile(dynamic=dynamic)


def apply_compile(model: nn.Module, mode: str = "default", dynamic: bool | None = None) -> nn.Module:
    """Returns the module to step. ``mode="default"``: per repeated block (``compile_blocks``),
    or the whole model when it has no repeated blocks. ``mode="reduce-overhead"`` adds CUDA
    graphs (replaying a step's kernels in one launch, for GPUs with static shapes, where launch
    overhead dominates small steps), over the whole model: the larger the region, the fewer
    graph launches. ``dynamic`` as in ``torch.compile`` (None: static first, dynamic after a
    shape changes; False: one static graph per shape)."""
    blocks = repeated_blocks(model)
    if mode == "default" and blocks:
        compile_blocks(blocks, dynamic)
        return model
    return torch.compile(model, mode=None if mode == "default" else mode, dynamic=dynamic)


def undo_compile(model: nn.Module) -> nn.Module:
    """The eager model again (the caller drops a whole-model wrapper; per-block compilation is
    removed here: ``nn.Module.compile`` keeps its compiled call in the instance's
    ``_compiled_call_impl``, whose class default is None)."""
    for block in repeated_blocks(model):
        block.__dict__.pop("_compiled_call_impl", None)
    return model
