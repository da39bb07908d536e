"""Model FLOPs of one training step, counted by ``torch.utils.flop_counter`` on a meta copy.

The meta copy shares no storage with the real model (parameters are replaced by meta tensors
through deepcopy's memo), so counting a 70B model costs no memory. Forward, loss and backward
are counted; recomputation from activation checkpointing is not (model FLOPs, as in PaLM's
MFU definition, Chowdhery et al. 2022, appendix B).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def meta_copy(model: nn.Module) -> nn.Module:
    memo = {}
    for t in list(model.parameters()) + list(model.buffers()):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


def to_meta(obj):
    if isinstance(obj, torch.Tensor):
        return obj.to("meta")
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_meta(o) for o in obj)
    if isinstance(obj, dict):
        return {k: to_meta(v) for k, v in obj.items()}
    return obj


def train_step_flops(model: nn.Module, inputs, targets, loss_fn: Callable) -> int:
    """FLOPs of forward + loss + backward for one micro-batch (inputs as the model takes them)."""
    m = meta_copy(model)
    m.train()
    x, y = to_meta(inputs), to_meta(targets)
    counter = FlopCounterMode(display=False)
    with counter:
        out = m(*x) if isinstance(x, (tuple, list)) else m(x)
        loss = loss_fn(out, y)
        if loss.requires_grad:
            loss.backward()
    return int(counter.get_total_flops())


def gpt_train_flops_formula(*, batch: int, seq_len: int, n_layer: int, d_model: int,
                            vocab: int) -> int:
    """Hand formula for the built-in gpt (matmuls only; non-causal attention counted in full,
    as SDPA's math path computes all T x T scores).

    forward per layer: qkv 2BT*C*3C + proj 2BT*C*C + mlp 2 * 2BT*C*4C + scores 2BT*T*C + AV 2BT*T*C
    head: 2BT*C*V. Backward of every matmul is two matmuls of the same size -> step = 3 x forward.
    The formula lives in tensorpilot.plan.flops, shared with the planner.
    """
    from tensorpilot.plan.flops import gpt_train_flops

    return gpt_train_flops(batch=batch, seq_len=seq_len, n_layer=n_layer, d_model=d_model, vocab=vocab)
