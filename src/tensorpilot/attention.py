"""Attention on the fastest correct kernel, for any model that calls
``F.scaled_dot_product_attention`` (SDPA): the built-in gpt, nanoGPT-style code, Hugging Face
models with ``attn_implementation="sdpa"``, timm's ViTs.

The mechanism is a ``torch.overrides.TorchFunctionMode`` (``FastAttention``) that the trainer
enters around forward passes: every SDPA call made while it is active comes to its
``__torch_function__``. Calls it can compute exactly -- no ``attn_mask``, queries and keys of the
same length, as many key/value heads as query heads -- run on whichever of SDPA and
``blocked_attention`` measured faster for that call's shape, dtype and causality (both are timed
forward and backward the first time a shape is seen; the choice is kept for the rest of the
process). Every other call -- masks, grouped-query heads, nested tensors, cross-attention of
unequal lengths -- goes to SDPA untouched. The model's code, parameters and state dict never
change; ``engine.attention=sdpa`` turns the mode off.

Why: PyTorch's CPU flash kernel is slow in bf16 at head_dim 64 (the blocked matmuls below run up
to ~1.8x faster there, benchmarks/cpu_kernels.py) while in fp32 on the same CPU it can win:
measuring per shape gets each case right. On GPUs the fused kernels win (an H100 timed them
1.6-12x faster at every training shape tried, benchmarks/RESULTS.md), so the trainer enters the
mode on CPUs only when engine.attention is auto (``router``).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

# Largest attention-score tensor (B x H x T x T elements) the blocked path materialises; above
# it SDPA is used regardless (2**28 bf16 scores + fp32 softmax ~ 1.5 GiB).
MAX_SCORES = 2**28

# Query rows per block: small enough for a block's scores to stay in cache, large enough for
# efficient matmuls; smaller blocks skip more of the masked half but run more, smaller matmuls
# (benchmarks/cpu_kernels.py compares block sizes and SDPA's CPU kernel).
QUERY_BLOCK = 128

MODES = ("auto", "sdpa", "blocked")


def blocked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                      is_causal: bool = True, scale: float | None = None,
                      block: int = QUERY_BLOCK) -> torch.Tensor:
    """Attention with the scores materialised by plain matmuls: (B, H, T, D) x 3 -> (B, H, T, D),
    the same result as ``F.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
    scale=scale)`` without a mask.

    The queries go in blocks of ``block`` rows. Causal: block [s, e) attends to keys [0, e) only,
    so the fully masked upper triangle right of the diagonal block is never computed (about
    (n-1)/(2n) of the scores for n blocks), and each block's (B, H, block, e) scores stay small
    enough to be reused from cache between the matmul, softmax and matmul. The mask is an additive
    (e-s, e) bias of 0 / -inf built from index comparisons and added in place to the fresh scores
    (the matmul saves its inputs, not its output, so in place is safe for autograd; its backward
    is the identity): no masked copy of the scores forward and no masking kernel backward, which
    ``masked_fill`` costs (benchmarks/cpu_kernels.py). Under inductor the bias is computed
    in-register. The scale goes on the queries (D columns, not e). Softmax stays in the input
    dtype: PyTorch's CPU kernel and inductor both sum the exponentials in fp32 for bf16/fp16
    inputs. Against an fp64 reference the output error equals an explicit fp32 softmax's, dq's is
    ~1.5x larger, all within 2x of fused SDPA's (tests/unit/test_attention.py)."""
    T, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    rows = torch.arange(max(T, S), device=q.device)
    outs = []
    for s in range(0, T, block):
        e = min(s + block, T)
        keys = e if is_causal else S                                           # causal: keys [0, e)
        att = (q[..., s:e, :] * scale) @ k[..., :keys, :].transpose(-2, -1)    # (B, H, e-s, keys)
        if is_causal:
            future = rows[None, :keys] > rows[s:e, None]                       # (e-s, keys) key after query
            bias = torch.zeros(future.shape, dtype=att.dtype, device=att.device).masked_fill_(future, float("-inf"))
            att = att.add_(bias)
        att = torch.softmax(att, dim=-1)                                       # fp32 sums inside
        if dropout_p:
            att = F.dropout(att, dropout_p)
        outs.append(att @ v[..., :keys, :])                                    # (B, H, e-s, D)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _bind(args: tuple, kwargs: dict) -> dict | None:
    """SDPA's arguments by name (its signature: query, key, value, attn_mask=None, dropout_p=0.0,
    is_causal=False, scale=None, enable_gqa=False); None when the call has names we don't know."""
    if len(args) > len(_SDPA_PARAMS) or set(kwargs) - set(_SDPA_PARAMS):
        return None
    bound = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
    bound.update(zip(_SDPA_PARAMS, args))
    bound.update(kwargs)
    return bound


def handles(a: dict) -> bool:
    """Whether ``blocked_attention`` computes this SDPA call exactly: no mask, plain dense
    tensors of one dtype, 4-D (B, H, T, D), equal query and key lengths and head counts,
    a modest score tensor."""
    q, k, v = a["query"], a["key"], a["value"]
    if a["attn_mask"] is not None or not all(type(t) is torch.Tensor for t in (q, k, v)):
        return False            # masks, and tensor subclasses (DTensor, nested, fake) keep SDPA
    if q.dim() != 4 or k.shape != q.shape or v.shape[:-1] != q.shape[:-1] or q.is_nested:
        return False
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        return False
    B, H, T, _ = q.shape
    return B * H * T * T <= MAX_SCORES and T > 0


@dataclass(slots=True)
class Decision:
    impl: str                    # "blocked" | "sdpa"
    blocked_ms: float | None     # measured forward (+ backward) time of one call
    sdpa_ms: float | None
    calls: int = 0


def _key(a: dict, grad: bool) -> tuple:
    q = a["query"]
    return (q.device.type, str(q.dtype).removeprefix("torch."), tuple(q.shape), bool(a["is_causal"]),
            float(a["dropout_p"]) > 0, grad)


def _keep(t: torch.Tensor) -> torch.Tensor:
    return t


def _time_call(fn, q, k, v, grad: bool, reps: int = 2) -> float:
    """Seconds of one call of ``fn`` (forward, and backward when training), best of ``reps``
    after a warm-up, on fresh leaves so the model's graph is untouched."""
    q, k, v = (t.detach().requires_grad_(grad) for t in (q, k, v))
    best = math.inf
    for i in range(reps + 1):
        t0 = time.perf_counter()
        out = fn(q, k, v)
        if grad:
            out.backward(torch.ones_like(out))
        else:
            out.sum().item()                     # wait for asynchronous devices
        if q.device.type == "cuda":
            torch.cuda.synchronize(q.device)
        if i:
            best = min(best, time.perf_counter() - t0)
    return best


_entered = threading.local()         # .routers: the FastAttention modes entered in this thread


def recompute_context():
    """``context_fn`` of ``torch.utils.checkpoint``: the forward runs as it is; the recomputation
    in backward, which autograd runs outside any torch function mode, re-enters the router the
    forward ran under, so both take the same attention path (checkpoint checks that they save the
    same tensors)."""
    routers = getattr(_entered, "routers", None)
    return contextlib.nullcontext(), (routers[-1] if routers else contextlib.nullcontext())


# engine.attention=auto on an accelerator: SDPA as the model calls it, no routing mode. On an H100
# (torch 2.11) SDPA's fused kernels ran 1.6-12x faster than blocked matmuls at each of the five
# training shapes auto timed (benchmarks/RESULTS.md, "First GPU lease"); blocked matmuls win only
# against CPU flash kernels, and a mode costs every torch call of the forward its dispatch.
AUTO_ON_ACCELERATORS = ("auto: SDPA's fused kernels, as the model calls them (on GPUs they beat blocked "
                        "matmuls at every shape timed; the per-shape trials run on CPUs)")


def resolved_mode(mode: str, device_type: str) -> str:
    """The mode ``engine.attention`` ``mode`` runs as on a ``device_type`` device: auto times SDPA
    against blocked matmuls on CPUs only (AUTO_ON_ACCELERATORS); an explicit mode is kept."""
    return "sdpa" if mode == "auto" and device_type != "cpu" else mode


def router(mode: str, device_type: str) -> "FastAttention":
    """The mode a trainer enters around forward passes (resolved_mode)."""
    return FastAttention(resolved_mode(mode, device_type))


class FastAttention(TorchFunctionMode):
    """Routes SDPA calls to the faster correct implementation (see the module docstring).
    ``mode``: "auto" (measure per shape), "blocked" (blocked wherever it applies) or "sdpa"
    (count calls only). ``decisions`` maps a call's (device, dtype, shape, causal, dropout,
    training) to its ``Decision``; ``fallbacks`` counts calls left to SDPA untouched."""

    def __init__(self, mode: str = "auto"):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"attention mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.decisions: dict[tuple, Decision] = {}
        self.fallbacks = 0

    def __enter__(self):
        if not hasattr(_entered, "routers"):
            _entered.routers = []
        _entered.routers.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _entered.routers.pop()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or self.mode == "sdpa":
            return func(*args, **kwargs)
        a = _bind(args, kwargs)
        if a is None or not handles(a):
            self.fallbacks += 1
            return func(*args, **kwargs)
        q, k, v = a["query"], a["key"], a["value"]
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        key = _key(a, grad)
        d = self.decisions.get(key)
        if d is None:
            d = self.decisions[key] = self._decide(a, grad)
        d.calls += 1
        if d.impl == "sdpa":
            return func(*args, **kwargs)
        if torch.compiler.is_compiling():
            return blocked_attention(q, k, v, a["dropout_p"], bool(a["is_causal"]), a["scale"])
        # a profiler sees plain matmuls and a softmax here: the marker names them attention
        # (tensorpilot profile); ~1 us per call when no profiler runs
        with torch.profiler.record_function("tensorpilot.attention"):
            return blocked_attention(q, k, v, a["dropout_p"], bool(a["is_causal"]), a["scale"])

    def _decide(self, a: dict, grad: bool) -> Decision:
        if self.mode == "blocked" or torch.compiler.is_compiling():
            # while compiling nothing can be timed: blocked fuses well under inductor
            return Decision("blocked", None, None)
        causal, scale = bool(a["is_causal"]), a["scale"]
        # timed without dropout: both paths then compute the same thing at the same cost. The
        # innermost saved-tensor hooks apply: plain ones keep the trial calls out of an enclosing
        # activation-checkpoint region, whose recomputation (decision cached, no trials) would
        # otherwise save fewer tensors than its forward did and fail checkpoint's check.
        with torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
            blocked = _time_call(lambda q, k, v: blocked_attention(q, k, v, 0.0, causal, scale),
                                 a["query"], a["key"], a["value"], grad)
            sdpa = _time_call(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale),
                              a["query"], a["key"], a["value"], grad)
        return Decision("blocked" if blocked < sdpa else "sdpa", blocked * 1e3, sdpa * 1e3)

    def report(self) -> list[dict]:
        """One entry per call shape seen: what ran, the measured times, how many calls."""
        out = [{"device": k[0], "dtype": k[1], "shape": list(k[2]), "causal": k[3], "dropout": k[4],
                "training": k[5], "impl": d.impl, "blocked_ms": d.blocked_ms, "sdpa_ms": d.sdpa_ms,
                "calls": d.calls} for k, d in self.decisions.items()]
        if self.fallbacks:
            out.append({"impl": "sdpa (not handled: mask, GQA, unequal lengths or subclass)",
                        "calls": self.fallbacks})
        return out

    def describe(self) -> str:
        """One line for the console."""
        if self.mode == "sdpa":
            return "sdpa: PyTorch's kernels as the model calls them (engine.attention=sdpa)"
        parts = []
        for k, d in self.decisions.items():
            if not k[5] and any(kk[:5] == k[:5] and kk[5] for kk in self.decisions):
                continue                          # evaluation twin of a training shape
            times = (f" ({d.blocked_ms:.1f} vs {d.sdpa_ms:.1f} ms)" if d.blocked_ms is not None else "")
            parts.append(f"{d.impl} for {'x'.join(map(str, k[2]))} {k[1]}{' causal' if k[3] else ''}{times}")
        if self.fallbacks:
            parts.append(f"{self.fallbacks} call(s) left to sdpa (masks or shapes blocked does not handle)")
        return "; ".join(parts) or "no scaled_dot_product_attention calls seen"
