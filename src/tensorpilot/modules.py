"""What is done to a model from outside, shared by the one-device engine (tensorpilot.training)
and the parallel runtime (tensorpilot.parallel): finding its repeated blocks, wrapping them for
activation checkpointing, compiling them. Parameter names never change (forwards are wrapped on
the instance, compiled calls stored on it), so checkpoints load the same with or without these.

Order when combined (reasons in tensorpilot.parallel.runtime): activation checkpointing before
compile, so the compiler sees the checkpoint regions (torch.compile traces through
``torch.utils.checkpoint`` as a higher-order op); data parallelism last.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tensorpilot.attention import recompute_context


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated units of a model -- a transformer's layers, a ResNet's residual blocks --
    found from its structure, whoever wrote it:

    1. the elements of its ``nn.ModuleList``s, when they hold at least half of the parameters
       (nanoGPT's ``transformer.h``, every Hugging Face model's ``layers``/``h``, the built-ins);
    2. else the outermost class of the model's own (not ``torch.nn``) modules that occurs at least
       twice and holds at least 90% of the largest share of parameters any such class holds:
       timm's ``BasicBlock``s inside ``nn.Sequential`` stages, a ViT's ``Block``s. Outermost,
       because a block's attention or MLP repeats as often but covers less, and regions
       should be as large as the repetition allows.

    Returned in module order; [] when nothing repeats."""
    counts: dict[int, int] = {}

    def n_params(m: nn.Module) -> int:
        if id(m) not in counts:
            counts[id(m)] = sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())
        return counts[id(m)]

    total = n_params(model) or 1
    listed = [m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst]
    if listed and sum(n_params(m) for m in listed) >= 0.5 * total:
        return listed
    depth: dict[type, int] = {}
    by_class: dict[type, list[nn.Module]] = {}
    for name, m in model.named_modules():
        cls = type(m)
        if m is model or cls.__module__.startswith("torch."):
            continue
        by_class.setdefault(cls, []).append(m)
        depth[cls] = min(depth.get(cls, 1 << 30), name.count("."))
    share = {cls: sum(n_params(m) for m in ms) for cls, ms in by_class.items() if len(ms) >= 2}
    share = {cls: v for cls, v in share.items() if v > 0}
    if not share:
        return listed
    best = max(share.values())
    cls = min((c for c, v in share.items() if v >= 0.9 * best), key=lambda c: (depth[c], -share[c]))
    inside = {id(sub) for m in by_class[cls] for sub in m.modules() if sub is not m}
    return [m for m in by_class[cls] if id(m) not in inside]


_RUNNING_STATS = (nn.modules.batchnorm._BatchNorm,)


def apply_activation_checkpointing(model: nn.Module) -> tuple[int, int]:
    """Recompute each block's activations during backward. Blocks holding BatchNorm are left
    alone: recomputing their forward would update the running statistics a second time.
    Returns (blocks checkpointed, blocks skipped)."""
    blocks = [b for b in repeated_blocks(model) if not any(isinstance(m, _RUNNING_STATS) for m in b.modules())]
    return checkpoint_blocks(blocks), len(repeated_blocks(model)) - len(blocks)


def checkpoint_blocks(blocks: list[nn.Module]) -> int:
    """Wrap each block's bound forward (not the module, so parameter names stay unchanged) in
    non-reentrant ``torch.utils.checkpoint``; returns how many were wrapped."""
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block.forward)
    return len(blocks)


def _checkpointed(forward, *args, **kwargs):
    if torch.compiler.is_compiling():      # the compiled region replays its own traced forward
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    # eager: the recomputation takes the attention path the forward took (tensorpilot.attention)
    return checkpoint(forward, *args, use_reentrant=False, context_fn=recompute_context, **kwargs)


def remove_activation_checkpointing(model: nn.Module) -> None:
    """Undo ``apply_activation_checkpointing`` (autotune trials switch it on and off)."""
    for block in repeated_blocks(model):
        if isinstance(block.__dict__.get("forward"), functools.partial):
            del block.forward                      # the class's forward shows through again


def compile_blocks(blocks: list[nn.Module], dynamic: bool | None = None) -> None:
    """Regional compilation: each repeated block gets ``nn.Module.compile`` in place. Identical
    blocks share one compiled graph, so a cold compile costs about one block rather than the
    whole model (benchmarks/RESULTS.md, compile_cost); parameter names and the model object stay
    unchanged."""
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
