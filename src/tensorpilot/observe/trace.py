"""One training step of any ``nn.Module``, run symbolically under ``FakeTensorMode``: no weights,
no memory, no compute. Every aten op is recorded with its FLOPs (``torch.utils.flop_counter``'s
registry), the bytes it reads and writes (from tensor sizes), its module and its phase, and the
memory timeline comes from ``torch.distributed._tools.mem_tracker.MemTracker``.

Why MemTracker for memory: it follows every allocation and free of the step (parameters,
gradients, optimizer state, activations, temporaries such as the optimizer's foreach buffers
and a backward's transient gradients), so its peak is the allocator's peak. Our own accounting
(``accounting``: states from the optimizer table plus every tensor autograd saves) is kept beside
it as a cross-check; it misses temporaries, so it is used only when MemTracker cannot run.

A step is traced twice: the first creates the optimizer's state (AdamW allocates it lazily on
its first step), the second is the steady state whose ops and peak are reported.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

# op classes: how an op's time is modelled (compute-bound ones against a matmul rate)
MATMUL, CONV, ATTENTION, MEMORY, VIEW = "matmul", "conv", "attention", "memory", "view"
COMPUTE_CLASSES = (MATMUL, CONV, ATTENTION)
PHASES = ("forward", "backward", "optimizer")
# Ops a replay on random operands would not time, costed from their FLOPs and bytes instead:
# backward kernels that read their forward kernel's opaque workspace (the fake forward returns
# an empty one, oneDNN's LSTM a (0,); the real kernel run on it writes past its end and corrupts
# the heap), and grouped matmuls, whose group offsets are values (a replay's zeros make every
# group empty).
NOT_REPLAYABLE = frozenset({"aten.mkldnn_rnn_layer_backward", "aten._cudnn_rnn_backward", "aten._grouped_mm"})


@dataclass(slots=True)
class OpRecord:
    op: str                    # aten overload packet, e.g. "aten.addmm"
    module: str                # innermost module, e.g. "layer1.0.conv1" ("" for the model itself)
    phase: str                 # forward | backward | optimizer
    op_class: str
    flops: int
    bytes_read: int
    bytes_written: int
    dtype: str                 # of the first floating-point input ("" if none)
    signature: str             # op + input shapes/strides/dtypes: ops with one signature run alike
    replay: Any = None         # (func, args, kwargs) as tensor specs, to measure the op on a device
    # per tensor operand read: (bytes, bytes the step touched since that storage was last
    # touched) -- its reuse distance; an operand further back than the cache holds comes from memory
    reads: tuple[tuple[int, int], ...] = ()
    # the storages it reads (aligned with ``reads``) and writes, each as a serial number unique to one
    # allocation (an address the allocator reuses gets a new one), and the bytes written to each:
    # which tensors flow between ops, for modelplan/fusion.py's fused kernels
    ins: tuple[int, ...] = ()
    outs: tuple[tuple[int, int], ...] = ()


@dataclass
class StepTrace:
    ops: list[OpRecord]
    memory: dict[str, float]          # MemTracker at the peak: parameters, gradients, optimizer, ...
    memory_method: str
    accounting: dict[str, float]      # our own: states + saved activations + inputs
    params: int
    trainable_params: int
    output_shape: tuple[int, ...] | None = None
    notes: list[str] = field(default_factory=list)
    # the peak with the CPU convolutions' transient buffers (see _onednn_conv_buffers); what a
    # CPU run allocates, while a GPU's cuDNN uses workspaces of its own choosing
    cpu_peak: float = 0.0

    @property
    def flops(self) -> int:
        return sum(o.flops for o in self.ops)

    def by_module(self, depth: int | None = None) -> dict[str, dict[str, float]]:
        """FLOPs, bytes and op count per module (``depth``: module path cut to that many parts)."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: {"flops": 0, "bytes": 0, "ops": 0})
        for o in self.ops:
            name = o.module if depth is None else ".".join(o.module.split(".")[:depth])
            row = out[name or "(model)"]
            row["flops"] += o.flops
            row["bytes"] += o.bytes_read + o.bytes_written
            row["ops"] += 1
        return dict(out)


class TraceError(RuntimeError):
    """The model could not be run symbolically; ``module`` is where it stopped."""

    def __init__(self, message: str, module: str):
        super().__init__(message)
        self.module = module


def _nbytes(t: torch.Tensor) -> int:
    n = t.numel() * t.element_size()
    try:                        # an expanded tensor (stride 0) reads its storage, not numel
        return min(n, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return n


def _is_view(func) -> bool:
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


ONEDNN_CHANNEL_BLOCK = 16


def _onednn_conv_buffers(name: str, args: tuple, out: Any) -> int:
    """Bytes a CPU convolution holds at its peak beyond the memory live after it: oneDNN computes in a
    blocked layout (channels padded to a multiple of 16) and reorders its plain NCHW activation
    operands into it (forward: the input; backward: the output gradient and the input) and the
    result back out of it (the padding of the output). Read off torch.profiler's memory events
    of mkldnn_convolution and its backward on torch 2.x CPU builds."""
    def padded(t) -> int:
        if not isinstance(t, torch.Tensor) or t.dim() < 4:
            return 0
        c = t.shape[1]
        return t.numel() // max(c, 1) * (-(-c // ONEDNN_CHANNEL_BLOCK) * ONEDNN_CHANNEL_BLOCK) * t.element_size()
    outs = [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
    forward = name.endswith(".convolution")
    # forward: blocked input and blocked output live together before the plain output exists;
    # backward: blocked output gradient and blocked input before the gradients exist. The
    # caller's live bytes already hold the op's plain outputs, which did not exist yet.
    held = sum(padded(t) for t in (args[:1] if forward else args[:2])) + (padded(outs[0]) if forward and outs else 0)
    return max(held - sum(t.numel() * t.element_size() for t in outs), 0)


def _mutated_bytes(func, args, kwargs) -> int:
    """Bytes an in-place op writes into its arguments (``add_``, ``_fused_adamw_``), which its
    (empty or aliasing) return value does not show."""
    total = 0
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(a.name)
        total += sum(_nbytes(t) for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor))
    return total


def _spec(x: Any) -> Any:
    """A tensor as (shape, stride, dtype, requires_grad): enough to rebuild it for a replay."""
    if isinstance(x, torch.Tensor):
        return TensorSpec(tuple(x.shape), tuple(x.stride()), x.dtype, x.storage_offset())
    return x


@dataclass(frozen=True, slots=True)
class TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    offset: int = 0


class _Recorder(TorchDispatchMode):
    """Records every aten op; sits above FakeTensorMode, so it sees the ops the model runs."""

    def __init__(self, modules, flop_registry, live_bytes: Callable[[], float] | None = None):
        super().__init__()
        self.modules = modules
        self.registry = flop_registry
        self.live_bytes = live_bytes
        self.phase = "forward"
        self.on = False
        self.ops: list[OpRecord] = []
        self.transient_peak = 0.0
        self.node_module: dict[int, str] = {}
        self.clock = 0                              # bytes read + written by the ops so far
        self.touched: dict[int, int] = {}           # storage -> clock at its last read or write
        self.serial: dict[int, int] = {}            # storage address -> serial of the allocation there
        self.next_serial = 0
        self.failure: tuple[BaseException, str] | None = None   # the last op that raised, and its module

    def _module(self) -> str:
        """The innermost module running this op. Forward: ModuleTracker's deepest parent, also
        remembered for the autograd node the op creates (nodes are numbered before the op is
        dispatched: ``_get_sequence_nr() - 1`` is its node). Backward: the module whose forward
        created the node being run -- backward hooks alone misplace ops between modules. An
        in-place op on a view (``x[mask] = v``) is run backward by a CopySlices node numbered
        right after the op's own node, once the op has returned: it belongs to that op's module."""
        if self.phase == "optimizer":
            return "(optimizer)"
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            seq = node._sequence_nr() if node is not None else -1
            for nr in (seq, seq - 1):
                if nr in self.node_module:
                    return self.node_module[nr]
        parents = [p for p in self.modules.parents if p != "Global"]
        deepest = max(parents, key=lambda p: (p.count("."), len(p))) if parents else ""
        # ModuleTracker names start with the root's class name: "GPT.blocks.0.attn" -> "blocks.0.attn"
        name = deepest.partition(".")[2] if "." in deepest else ""
        if self.phase == "forward":
            self.node_module.setdefault(torch._C._autograd._get_sequence_nr() - 1, name)
        return name

    def failed_module(self, exc: BaseException) -> str:
        """The module whose op raised ``exc`` (or one it was raised from); else the module running now."""
        seen = exc
        while seen is not None and self.failure is not None:
            if seen is self.failure[0]:
                return self.failure[1]
            seen = seen.__cause__ or seen.__context__
        return self._module()

    def _touch(self, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> tuple[tuple[int, int], ...]:
        """Each input's (bytes, reuse distance); then the op's inputs and outputs are the most
        recently touched storages. A storage never touched before is infinitely far."""
        def key(t):
            try:
                return _storage(t)
            except (RuntimeError, NotImplementedError):      # no storage (sparse, nested): never cached
                return None
        keys_in = [key(t) for t in ins]
        reads = tuple((_nbytes(t), self.clock - self.touched[k] if k in self.touched else 1 << 62)
                      for t, k in zip(ins, keys_in))
        self.clock += sum(n for n, _ in reads) + sum(_nbytes(t) for t in outs)
        for k in keys_in + [key(t) for t in outs]:
            if k is not None:
                self.touched[k] = self.clock
        return reads

    def _serials(self, ins: list[torch.Tensor],
                 outs: list[torch.Tensor]) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
        """(serials read, (serial, bytes) written) of a non-view op. An output at an input's address
        is that input written in place; any other is a new allocation, even where a freed one was."""
        def address(t) -> int:
            try:
                return _storage(t)
            except (RuntimeError, NotImplementedError):      # no storage (sparse, nested): its own
                return -id(t)

        def serial(k: int, fresh: bool) -> int:
            if fresh or k not in self.serial:
                self.serial[k] = self.next_serial = self.next_serial + 1
            return self.serial[k]
        got = tuple(serial(address(t), False) for t in ins)
        read_at = {address(t) for t in ins}
        return got, tuple((serial(k, k not in read_at), _nbytes(t)) for t, k in ((t, address(t)) for t in outs))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            out = _grouped_mm_any_dtype(args, kwargs) if func is _GROUPED_MM and _not_bf16(args) \
                else func(*args, **kwargs)
        except Exception as exc:
            # named now: once the exception leaves backward, the autograd node that ran this op is
            # gone and ModuleTracker's parents are those of whichever module backward entered last
            self.failure = (exc, self._module())
            raise
        if func.namespace != "aten":                     # prim.device, profiler markers: no work
            return out
        if not self.on and self.phase == "forward":
            self._module()                               # remembers the node's module: the first step's backward
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        view = _is_view(func)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        reads = () if view else self._touch(ins, outs)  # also before the recorded step: distances span steps
        ins_s, outs_s = ((), ()) if view else self._serials(ins, outs)
        if not self.on:
            return out
        packet = func.overloadpacket
        flops = 0
        if packet in self.registry:
            flops = int(self.registry[packet](*args, **kwargs, out_val=out))
        name = str(packet)
        if view:
            cls = VIEW
        elif "convolution" in name:
            cls = CONV
        elif "attention" in name:
            cls = ATTENTION
        elif flops:
            cls = MATMUL
        else:
            cls = MEMORY
        read = sum(n for n, _ in reads)                  # views: none
        written = 0 if view else sum(t.numel() * t.element_size() for t in outs) + _mutated_bytes(func, args, kwargs)
        floats = [t for t in ins if t.is_floating_point()]
        dtype = str(floats[0].dtype).replace("torch.", "") if floats else ""
        sig = name + str([(tuple(t.shape), tuple(t.stride()), str(t.dtype)) for t in ins]) + str(
            [a for a in tree_flatten((args, kwargs))[0] if not isinstance(a, torch.Tensor)])
        replay = (func, tree_map(_spec, args), tree_map(_spec, kwargs)) \
            if cls != VIEW and name not in NOT_REPLAYABLE else None
        self.ops.append(OpRecord(name, self._module(), self.phase, cls, flops, read, written, dtype, sig, replay,
                                 reads, ins_s, outs_s))
        if cls == CONV and self.live_bytes is not None:
            self.transient_peak = max(self.transient_peak, self.live_bytes() + _onednn_conv_buffers(name, args, out))
        return out


_GROUPED_MM = getattr(torch.ops.aten, "_grouped_mm", None)
_GROUPED_MM = _GROUPED_MM.default if _GROUPED_MM is not None else None


def _not_bf16(args: tuple) -> bool:
    """Both operands of one floating dtype other than bf16 (mixed dtypes: the kernel refuses them too)."""
    dtypes = {t.dtype for t in args[:2] if isinstance(t, torch.Tensor)}
    return len(dtypes) == 1 and next(iter(dtypes)).is_floating_point and torch.bfloat16 not in dtypes


def _grouped_mm_any_dtype(args: tuple, kwargs: dict) -> torch.Tensor:
    """``aten._grouped_mm`` of fp32 operands, as the CPU kernel computes it: torch's meta kernel
    accepts bf16 only (the CUDA kernel's rule), so the fake step of a Mixture-of-Experts layer
    in fp32 -- transformers' MoE experts keep fp32 weights under autocast too -- stopped there.
    The output's shape comes from the meta kernel on bf16 stand-ins, outside every mode (they
    are no memory of the step); its dtype is the operands' (or ``out_dtype``)."""
    from torch.utils._python_dispatch import _disable_current_modes

    def stand_in(t):
        if not isinstance(t, torch.Tensor):
            return t
        dtype = torch.bfloat16 if t.is_floating_point() else t.dtype
        return torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="meta")
    with _disable_current_modes():
        shape = _GROUPED_MM(*tree_map(stand_in, args), **tree_map(stand_in, kwargs)).shape
    return torch.empty(shape, dtype=kwargs.get("out_dtype") or args[0].dtype, device=args[0].device)


def _grouped_mm_flops(a, b, *args, out_val=None, **kwargs) -> int:
    """Every group's (m x k) @ (k x n) over its own rows: 2 x rows x K x N, the jagged dimension
    at its full length (the offsets are values a trace does not have). Both operands 2-D (an
    expert's weight gradient): the contraction is what is split, into the output's groups."""
    k = a.shape[-1]
    out = out_val.numel()
    if a.dim() == 2 and b.dim() == 2:
        return 2 * out * k // max(out_val.shape[0], 1)
    return 2 * out * k


def flop_formulas() -> dict:
    """torch.utils.flop_counter's registry, plus the CPU's fused attention kernels it lacks
    (same FLOPs as the CUDA flash kernels: two (L x E) @ (E x S) matmuls per head forward,
    five backward -- the registry's sdpa formulas, which count the full L x S, causal or not)."""
    from torch.utils import flop_counter as fc

    table = dict(fc.flop_registry)
    aten = torch.ops.aten

    def forward(query, key, value, *args, out_val=None, **kwargs):
        return fc.sdpa_flop_count(query.shape, key.shape, value.shape)

    def backward(grad_out, query, key, value, *args, out_val=None, **kwargs):
        return fc.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)
    cpu = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu is not None:
        table.setdefault(cpu, forward)
        table.setdefault(aten._scaled_dot_product_flash_attention_for_cpu_backward, backward)

    # The registry's convolution_backward counts the weight gradient as a convolution over all
    # C_in input channels against all C_out output channels; with groups each output channel sees
    # C_in / groups of them, so a depthwise convolution's weight gradient came out C_in times too
    # large. The weight-gradient term is counted again here and the excess taken off.
    upstream = table[aten.convolution_backward]

    def conv_backward(grad_out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups,
                      output_mask, *, out_val=None, **kwargs):
        total = upstream(grad_out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups,
                         output_mask, out_val=out_val, **kwargs)
        if groups > 1 and output_mask[1]:
            whole = upstream(grad_out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups,
                             [False, True, False], out_val=out_val, **kwargs)
            total -= whole - whole // groups
        return total
    table[aten.convolution_backward] = conv_backward
    table.update(_rnn_flop_formulas())
    if _GROUPED_MM is not None:
        table.setdefault(aten._grouped_mm, _grouped_mm_flops)
    return table


def _rnn_tokens(x: torch.Tensor) -> int:
    """Time steps x sequences an RNN runs over: (T, B, I), (B, T, I) or packed (sum T, I)."""
    return x.numel() // max(x.shape[-1], 1)


def _rnn_flop_formulas() -> dict:
    """The fused RNN kernels the registry lacks: on a CPU an nn.LSTM runs as one oneDNN
    ``mkldnn_rnn_layer`` per layer and direction, on CUDA as one cuDNN ``_cudnn_rnn``, and
    without these they counted 0 FLOPs. Each time step multiplies its input by W_ih (G*H x I) and
    the previous hidden state by W_hh (G*H x H), G gates: 2 x tokens x (|W_ih| + |W_hh|)
    forward; backward multiplies the gates' gradient by both weights (input and hidden
    gradients) and by the inputs (weight gradients): twice the forward. Gate nonlinearities
    are not counted, as the registry counts no elementwise op."""
    aten = torch.ops.aten

    def matrices(weights) -> int:             # biases (1-D) are not multiplied
        return sum(w.numel() for w in weights if isinstance(w, torch.Tensor) and w.dim() == 2)

    def mkldnn_fwd(x, w_ih, w_hh, *args, out_val=None, **kwargs):
        return 2 * _rnn_tokens(x) * matrices((w_ih, w_hh))

    def mkldnn_bwd(x, w_ih, w_hh, *args, out_val=None, **kwargs):
        return 4 * _rnn_tokens(x) * matrices((w_ih, w_hh))

    def cudnn_fwd(x, weight, *args, out_val=None, **kwargs):      # all layers and directions
        return 2 * _rnn_tokens(x) * matrices(weight)

    def cudnn_bwd(x, weight, *args, out_val=None, **kwargs):
        return 4 * _rnn_tokens(x) * matrices(weight)
    table = {}
    for name, formula in (("mkldnn_rnn_layer", mkldnn_fwd), ("mkldnn_rnn_layer_backward", mkldnn_bwd),
                          ("_cudnn_rnn", cudnn_fwd), ("_cudnn_rnn_backward", cudnn_bwd)):
        packet = getattr(aten, name, None)
        if packet is not None:
            table[packet] = formula
    return table


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata             # one per allocation, also for fake tensors


class _SavedTensors:
    """Bytes of the distinct storages autograd saves for backward, parameters excluded."""

    def __init__(self, exclude: set[int]):
        self.exclude, self.seen, self.bytes, self.batch_bytes = exclude, set(), 0, 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage(t)
        if key not in self.exclude and key not in self.seen:
            self.seen.add(key)
            self.bytes += t.untyped_storage().nbytes()
        return t


def _first_tensor(out: Any) -> torch.Tensor | None:
    """The tensor a loss reads from a model's output: the output itself, a Hugging Face output's
    ``logits`` (else its first tensor), or the first tensor of a tuple/list/dict."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    leaves = [t for t in tree_flatten(dict(out) if hasattr(out, "keys") else out)[0] if isinstance(t, torch.Tensor)]
    return leaves[0] if leaves else None


def trace_step(model: nn.Module, make_batch: Callable[[], tuple[Any, Any]],
               loss_fn: Callable[[torch.Tensor, Any], torch.Tensor],
               make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer | None], *,
               device: str = "cpu", autocast_dtype: torch.dtype | None = None,
               clip_grad_norm: bool = False, gpu_autocast: bool = False,
               gpu_attention: bool = False, param_dtype: torch.dtype | None = None) -> StepTrace:
    """Run forward, ``loss_fn``, backward and the optimizer step of ``model`` symbolically.

    ``model``: built on the meta device or for real; a meta copy is traced, the model is not
    touched. ``make_batch()`` returns (inputs, targets) and is called inside the fake mode:
    what it creates are fake tensors (inputs: one tensor, or a tuple passed positionally, or a
    dict passed as keywords). ``autocast_dtype``: run forward and loss under torch.autocast;
    ``gpu_autocast``: with a GPU's op lists on the CPU (observe/gpu_autocast.py), for a plan of a GPU.
    ``gpu_attention``: SDPA with dropout in the fused kernel a GPU runs (observe/gpu_attention.py).
    ``param_dtype``: the copy's floating-point parameters and buffers cast to it (a pure bf16 run).
    Raises TraceError naming the module where an op could not run symbolically."""
    from tensorpilot.observe.flops import meta_copy

    shadow = meta_copy(model)          # the fake parameters replace the copy's, never the caller's
    if param_dtype is not None:
        shadow.to(param_dtype)
    # warnings the model's code raises are shown once the step traced; a step that failed is
    # reported as one sentence, without them
    with warnings.catch_warnings(record=True) as caught, _quiet_fake_tensor_log():
        rules = contextlib.nullcontext()
        if gpu_autocast and autocast_dtype is not None and device.split(":")[0] == "cpu":
            from tensorpilot.observe.gpu_autocast import gpu_rules

            rules = gpu_rules()
        attention = contextlib.nullcontext()
        if gpu_attention and device.split(":")[0] == "cpu":
            from tensorpilot.observe.gpu_attention import fused_dropout_attention

            attention = fused_dropout_attention()
        with rules, attention:
            trace = _trace(shadow, make_batch, loss_fn, make_optimizer, device, autocast_dtype, clip_grad_norm)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return trace


def _to_fake(model: nn.Module, device: str) -> None:
    """Replace the meta parameters and buffers by empty (here: fake) ones on ``device``, one new
    tensor per old one: tied weights stay tied (``Module.to_empty`` makes one per use)."""
    new: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for slots, param in ((mod._parameters, True), (mod._buffers, False)):
            for name, t in list(slots.items()):
                if t is None:
                    continue
                if id(t) not in new:
                    empty = torch.empty_like(t, device=device)
                    new[id(t)] = nn.Parameter(empty, requires_grad=t.requires_grad) if param else empty
                slots[name] = new[id(t)]


@contextlib.contextmanager
def _quiet_fake_tensor_log():
    """FakeTensorMode logs the traceback of an op it cannot run before raising, and a forward
    that raises makes the trackers' always-called forward hooks fail too, which torch reports
    as a UserWarning; the caller turns the exception into one sentence, so both are silenced
    meanwhile."""
    import logging

    log = logging.getLogger("torch._subclasses.fake_tensor")
    old = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*hook with ``always_call=True`` raised an exception",
                                    category=UserWarning)
            yield
    finally:
        log.setLevel(old)


class _NoHook:
    """The handle of a gradient hook never installed."""

    def remove(self) -> None:
        pass


def _skip_frozen_grad_hooks(tracker, model: nn.Module) -> None:
    """MemTracker hooks every parameter of a module it enters to see its gradient, and a
    parameter that needs none (a frozen backbone, Whisper's fixed position embedding) refuses a
    hook: ``RuntimeError: cannot register a hook on a tensor that doesn't require gradient``.
    Such a parameter gets no gradient to follow; MemTracker is told its hook is installed."""
    handles = getattr(tracker, "_param_to_grad_hook_handles", None)
    if handles is None:                       # a MemTracker that no longer keeps them there
        return
    for p in model.parameters():
        if not p.requires_grad:
            handles[p] = (_NoHook(), _NoHook())


def forward_loss(model: nn.Module, x: Any, y: Any, loss_fn: Callable) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The loss of one forward, and the shape of the output it was taken of. The output itself goes
    out of scope here, before backward, as in the trainer's step: what the loss needs of it is what
    autograd saved (for cross-entropy, the log-softmax, not the logits)."""
    out = model(**x) if isinstance(x, dict) else model(*x) if isinstance(x, (tuple, list)) else model(x)
    logits = _first_tensor(out)
    if logits is None:
        raise TraceError("the model's output holds no tensor for a loss", "")
    return loss_fn(logits, y), tuple(logits.shape)


def _trace(shadow, make_batch, loss_fn, make_optimizer, device, autocast_dtype, clip_grad_norm) -> StepTrace:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.module_tracker import ModuleTracker

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    modules = ModuleTracker()
    out_shape = None
    with mode:
        _to_fake(shadow, device)
        shadow.train()
        params = [p for p in shadow.parameters() if p.requires_grad]
        opt = make_optimizer(params)             # None: forward and backward only
        tracker = MemTracker()
        _skip_frozen_grad_hooks(tracker, shadow)
        tracker.track_external(shadow, *([opt] if opt is not None else []))

        def live() -> float:
            snap = tracker.get_tracker_snapshot("current")
            return float(sum(v.get("Total", 0) for v in snap.values())) if snap else 0.0
        rec = _Recorder(modules, flop_formulas(), live)
        saved = _SavedTensors({_storage(p) for p in shadow.parameters()} | {_storage(b) for b in shadow.buffers()})
        with tracker, modules, rec:
            for it in range(2):
                rec.on = False                       # the batch comes from the loader, not the step
                rec.phase = "forward"
                try:
                    x, y = make_batch()
                    rec.on = it == 1
                    if rec.on:                       # the accounting is of the second step
                        saved.seen, saved.bytes = set(), 0
                    saved.batch_bytes = sum(_nbytes(t) for t in tree_flatten((x, y))[0] if isinstance(t, torch.Tensor))
                    cast = torch.autocast(device.split(":")[0], dtype=autocast_dtype) \
                        if autocast_dtype is not None else contextlib.nullcontext()
                    with cast, torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
                        loss, out_shape = forward_loss(shadow, x, y, loss_fn)
                    rec.phase = "backward"
                    loss.backward()
                except TraceError:
                    raise
                except Exception as exc:   # noqa: BLE001 - any op the fake tensors cannot run
                    where = rec.failed_module(exc)
                    raise TraceError(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
                                     where) from exc
                rec.phase = "optimizer"
                if clip_grad_norm:
                    torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
                if opt is not None:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                else:                                # a forward-backward benchmark's model.zero_grad()
                    for p in params:
                        p.grad = None
                if it == 0:
                    tracker.reset_mod_stats()
                del loss, x, y
        snap = tracker.get_tracker_snapshot("peak")
    per_device = next(iter(snap.values())) if snap else {}
    names = {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients", "Activation": "activations",
             "Temp": "temporaries", "Optstate": "optimizer", "Other": "other"}
    memory = {names.get(getattr(k, "value", k), str(k).lower()): float(v) for k, v in per_device.items()}
    memory["total"] = memory.pop("total", sum(memory.values()))
    n = sum(p.numel() for p in shadow.parameters())
    trainable = sum(p.numel() for p in params)
    # our own accounting, beside MemTracker's timeline: model states plus every tensor autograd
    # saved for backward plus the batch -- no temporaries, no transient gradients
    state = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                if isinstance(t, torch.Tensor)) if opt is not None else 0
    weights = sum(p.numel() * p.element_size() for p in shadow.parameters())
    grads = sum(p.numel() * p.element_size() for p in params)
    accounting = {"parameters": float(weights), "gradients": float(grads), "optimizer": float(state),
                  "saved_activations": float(saved.bytes), "batch": float(saved.batch_bytes)}
    accounting["total"] = sum(accounting.values())
    return StepTrace(rec.ops, memory, "torch.distributed._tools.mem_tracker.MemTracker (peak of the second step)",
                     accounting, n, trainable, out_shape, cpu_peak=max(memory["total"], rec.transient_peak))


