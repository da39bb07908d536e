"""Trace a step's attention as a GPU's SDPA runs it, on the CPU.

``torch.nn.functional.scaled_dot_product_attention`` picks a kernel by device. With dropout in
training (Hugging Face's GPT-2, BERT, RoBERTa, T5 pass their ``attn_pdrop`` / attention-probs
dropout, 0.1 in the published configs) the CPU has no fused kernel: its SDPA runs the math path,
which materialises the (batch x heads x L x S) scores, their softmax and the dropout mask and keeps
them for the backward (seen in a dispatch trace on torch 2.13: bmm, softmax, bernoulli, bmm, where
the same call without dropout is one ``_scaled_dot_product_flash_attention_for_cpu``). A GPU's
fused kernels take dropout: FlashAttention-2 and the memory-efficient kernel on NVIDIA parts, the
same through AOTriton on ROCm; they draw the mask from a Philox seed and offset inside the kernel
and save only those, the output and the row log-sum-exp. A CPU trace of a model with attention
dropout therefore plans the scores' memory and traffic that the GPU never writes: GPT-2 small at
8 x 1024 tokens was planned at 26.4 GiB for an H200 step that held 13.7 (benchmarks/RESULTS.md,
"The traced planner against the same ten steps").

``fused_dropout_attention()`` makes the trace take the CPU's fused kernel while it is active: an
SDPA call with dropout is traced with ``dropout_p = 0``. The kernel's FLOPs and saved tensors
are the ones the GPU's fused kernel has; generating the mask inside the kernel costs it some time
that is not modelled.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode

_SDPA = torch.nn.functional.scaled_dot_product_attention
_DROPOUT_AT = 4            # (query, key, value, attn_mask, dropout_p, is_causal, scale, ...)


def fuses_dropout_attention(acc: Any) -> bool:
    """Whether ``acc`` (hardware.catalog.Accelerator) runs SDPA with dropout in a fused kernel:
    NVIDIA (FlashAttention-2, memory-efficient attention) and AMD (AOTriton). Other parts' kernels
    are not modelled: their trace keeps the CPU's path."""
    return acc.vendor in ("NVIDIA", "AMD")


class _NoDropoutSDPA(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is _SDPA:
            if len(args) > _DROPOUT_AT:
                args = (*args[:_DROPOUT_AT], 0.0, *args[_DROPOUT_AT + 1:])
            elif "dropout_p" in kwargs:
                kwargs["dropout_p"] = 0.0
        return func(*args, **kwargs)


@contextlib.contextmanager
def fused_dropout_attention() -> Iterator[None]:
    """While active, SDPA calls with dropout run the fused kernel (``dropout_p`` traced as 0)."""
    with _NoDropoutSDPA():
        yield
