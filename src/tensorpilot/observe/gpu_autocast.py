"""Trace a step as a GPU's autocast runs it, on the CPU.

``torch.autocast`` casts by op, and its op lists differ by device (aten/src/ATen/autocast_mode.h
and autocast_mode.cpp, PyTorch 2.x: ``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE``,
``AT_FORALL_PROMOTE`` for CUDA, ROCm and XPU; a shorter list of its own for the CPU). On a GPU
``layer_norm``, ``group_norm``, ``softmax``, ``log_softmax``, ``pow``, ``exp``, ``log``, ``rsqrt``,
``sum``, ``cumsum`` and the losses run in fp32: a bf16 input is cast up (or, for the ops that
take an output dtype, read in bf16 and written in fp32), and what follows them stays fp32 until
the next GEMM casts it back. Hugging Face's GPT-2 GELU (``0.5 * x * (1 + tanh(... x + 0.044715 *
pow(x, 3)))``) therefore runs its whole chain in fp32 on a GPU and in bf16 on the CPU: a CPU
trace undercounts what the GPU's memory-bound kernels move.

A fake CUDA tensor cannot run autograd on a CPU-only build of torch, so the trace stays on the
CPU, and ``gpu_rules()`` replaces the CPU's rules by the GPU's while it is active: each op whose
policy differs gets a kernel at the ``AutocastCPU`` dispatch key (``torch.library``) that applies
the GPU's policy, and the registrations are removed on exit, which restores the CPU's own.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

# GPU policies (autocast_mode.h). Overload names as torch.ops.aten spells them.
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
)
# run in fp32 through their own output-dtype argument: a bf16 input is read as it is
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)
# norm without a dtype argument is redispatched to its overload with one, fp32
FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put", "tensordot",
           "scatter_add")
# lower precision on the GPU, not listed for the CPU (the CPU's other GEMM entries match the GPU's)
LOWER = ("addmv", "addr", "mv")
# listed for the CPU only: on the GPU autocast passes them through untouched
CPU_ONLY = (
    "avg_pool3d", "polar", "quantile", "quantile.scalar", "nanquantile", "nanquantile.scalar", "stft",
    "stft.center", "grid_sampler_2d", "_grid_sampler_2d_cpu_fallback", "grid_sampler_3d", "trace",
    "view_as_complex", "max_pool3d", "max_unpool2d", "max_unpool3d", "adaptive_avg_pool3d", "reflection_pad1d",
    "reflection_pad2d", "replication_pad1d", "replication_pad2d", "replication_pad3d", "cross_entropy_loss",
    "ctc_loss.IntList", "ctc_loss.Tensor", "fractional_max_pool2d", "fractional_max_pool3d",
    "adaptive_max_pool3d", "stack", "cat", "index_copy", "fft_fft", "fft_ifft", "fft_fft2", "fft_ifft2",
    "fft_fftn", "fft_ifftn", "fft_rfft", "fft_irfft", "fft_rfft2", "fft_irfft2", "fft_rfftn", "fft_irfftn",
    "fft_hfft", "fft_ihfft",
)
KEY = "AutocastCPU"


def _overload(name: str) -> Any | None:
    packet, _, overload = name.partition(".")
    try:
        return getattr(getattr(torch.ops.aten, packet), overload or "default")
    except (AttributeError, RuntimeError):
        return None            # an op this torch does not have


def _eligible(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _cast(obj: Any, dtype: torch.dtype) -> Any:
    if _eligible(obj):
        return obj.to(dtype)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast(o, dtype) for o in obj)
    return obj


def _floats(obj: Any) -> Iterator[torch.Tensor]:
    if _eligible(obj):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _floats(o)


@contextlib.contextmanager
def _below_autocast() -> Iterator[None]:
    # as the C++ wrappers' ExcludeDispatchKeyGuard: what the op calls is not cast again
    with torch.autocast("cpu", enabled=False):
        yield


def _fp32(op) -> Callable:
    def kernel(*args, **kwargs):
        with _below_autocast():
            return op(*_cast(args, torch.float32), **{k: _cast(v, torch.float32) for k, v in kwargs.items()})
    return kernel


def _fp32_set_opt_dtype(op) -> Callable:
    names = [a.name for a in op._schema.arguments]
    at = names.index("dtype")

    def kernel(*args, **kwargs):
        with _below_autocast():
            if not (args and _eligible(args[0])):
                return op(*args, **kwargs)
            if len(args) > at:
                if args[at] is None:
                    args = (*args[:at], torch.float32, *args[at + 1:])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)
    return kernel


def _fp32_append_dtype(target) -> Callable:
    def kernel(self, *args, **kwargs):
        with _below_autocast():
            return target(self, *args, **kwargs, dtype=torch.float32 if _eligible(self) else self.dtype)
    return kernel


def _promote(op) -> Callable:
    def kernel(*args, **kwargs):
        floats = list(_floats(args)) + list(_floats(tuple(kwargs.values())))
        with _below_autocast():
            if any(t.dtype == torch.float32 for t in floats):
                args, kwargs = _cast(args, torch.float32), {k: _cast(v, torch.float32) for k, v in kwargs.items()}
            return op(*args, **kwargs)
    return kernel


def _lower(op) -> Callable:
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype("cpu")
        with _below_autocast():
            return op(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})
    return kernel


def _pass_through(op) -> Callable:
    composite = torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")

    def kernel(*args, **kwargs):
        if composite:          # what it decomposes into is autocast as usual (a fallthrough's behaviour)
            return op.decompose(*args, **kwargs)
        with _below_autocast():
            return op(*args, **kwargs)
    return kernel


def kernels() -> dict[str, Callable]:
    """Op overload name -> the AutocastCPU kernel that applies the GPU's policy to it."""
    out: dict[str, Callable] = {}
    for names, make in ((FP32, _fp32), (FP32_SET_OPT_DTYPE, _fp32_set_opt_dtype), (PROMOTE, _promote),
                        (LOWER, _lower), (CPU_ONLY, _pass_through)):
        for name in names:
            op = _overload(name)
            if op is not None:
                out[name] = make(op)
    for name, target in FP32_APPEND_DTYPE.items():
        op, to = _overload(name), _overload(target)
        if op is not None and to is not None:
            out[name] = _fp32_append_dtype(to)
    return out


@contextlib.contextmanager
def gpu_rules() -> Iterator[None]:
    """While active, ``torch.autocast("cpu", ...)`` casts as ``torch.autocast("cuda", ...)`` does."""
    import warnings

    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # "... operators may also be overridden": on purpose
            for name, kernel in kernels().items():
                lib.impl(name, kernel, KEY)
        yield
    finally:
        lib._destroy()         # the CPU's own kernels are registered again
