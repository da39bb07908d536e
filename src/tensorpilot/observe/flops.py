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
    """Tensors of a (nested) batch as meta tensors."""
    return _map(obj, lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t)


def train_step_flops(model: nn.Module, inputs, targets, loss_fn: Callable) -> int:
    """FLOPs of forward + loss + backward for one micro-batch (inputs as the model takes them):
    counted on a meta copy (no memory, no compute). A model that meta tensors cannot run (it
    reads a value: ``.item()``, data-dependent shapes, as some Hugging Face models do) is counted
    on two real samples instead (BatchNorm needs more than one) and scaled to the micro-batch."""
    try:
        m = meta_copy(model)
        m.train()
        return _count(m, to_meta(inputs), to_meta(targets), loss_fn)
    except Exception:  # noqa: BLE001 - any op meta tensors cannot run
        pass
    n = _batch_size(inputs)
    k = min(n, 2)
    # the samples go where the model is: the loader's batch is still on the host
    where = next(iter(model.parameters()), torch.empty(0)).device
    head = lambda t: (t[:k] if t.dim() else t).to(where) if isinstance(t, torch.Tensor) else t    # noqa: E731
    x, y = _map(inputs, head), _map(targets, head)
    grads = {p: p.grad for p in model.parameters()}
    buffers = [b.detach().clone() for b in model.buffers()]       # BatchNorm statistics
    with torch.random.fork_rng(devices=[]):                        # dropout draws are not the run's
        flops = _count(model, x, y, loss_fn)
    for p, g in grads.items():
        p.grad = g
    with torch.no_grad():
        for b, saved in zip(model.buffers(), buffers):
            b.copy_(saved)
    return flops * n // k


def _count(m: nn.Module, x, y, loss_fn: Callable) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        out = m(*x) if isinstance(x, (tuple, list)) else m(x)
        loss = loss_fn(out, y)
        if loss.requires_grad:
            loss.backward()
    return int(counter.get_total_flops())


def _map(obj, fn):
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return fn(obj)


def _batch_size(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.shape[0] if obj.dim() else 1
    if isinstance(obj, (tuple, list)) and obj:
        return _batch_size(obj[0])
    if isinstance(obj, dict) and obj:
        return _batch_size(next(iter(obj.values())))
    return 1


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
