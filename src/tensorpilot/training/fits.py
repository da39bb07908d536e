"""Will the run fit? Answered before the model is allocated, so a size that cannot fit ends in
one sentence ("needs X GiB, this machine has Y free") instead of an allocator traceback or the
kernel's OOM killer.

Two estimates, both without memory:

* a model its workload spec describes to the planner (the built-in gpt): the planner's formulas (plan/memory.py: model states per ZeRO's table,
  activations per Korthikanti et al. 2022) from its shape alone -- nothing is built, so even a
  billion layers is answered at once;
* any other model: built on the meta device, one forward pass of a full micro-batch run on meta
  tensors, and every tensor autograd saves for backward counted (``saved_tensors_hooks``), plus
  weights, gradients and the optimizer's state (4 + 4 + 8 bytes per fp32 parameter for AdamW).

Both are estimates of the steady state; allocator overhead and framework buffers come on top,
so a run refused here would not have fitted. ``--no-train.memory_check`` skips the check.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from tensorpilot.errors import ConfigError

__all__ = ["MemoryEstimate", "guard", "estimate_gpt", "estimate_planned", "estimate_traced", "scaled", "expand_batch",
           "free_bytes", "check", "check_class_targets"]



def state_bytes_per_param(optimizer: str) -> float:
    """fp32 weight and gradient plus the optimizer's state (plan/memory.py's table)."""
    from tensorpilot.plan.memory import OPTIMIZER_STATE_BYTES

    return 4 + 4 + OPTIMIZER_STATE_BYTES[optimizer]


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    states_bytes: float            # weights, gradients, optimizer state
    activations_bytes: float       # saved for backward, one micro-batch, plus output and input
    method: str
    trainable_params: float = 0.0  # parameters with optimizer state
    optimizer: str = "adamw"

    @property
    def total_bytes(self) -> float:
        return self.states_bytes + self.activations_bytes


def guard(build: Callable[[], nn.Module], train_data: Any, meta: dict, loss_fn: Callable | None, *,
          device: torch.device, batch_size: int, seed: int, half_precision: bool, grad_accum: int = 1,
          share: int = 1, states_split: int = 1, activations_split: int = 1,
          planner: tuple[Any, int] | None = None, optimizer: str = "adamw") -> nn.Module:
    """Check the run fits, then return ``build()``: a model the planner describes (``planner``:
    its workload spec's (ModelSpec, tokens per sample)) from its shape alone, anything else traced on the meta device -- ``build`` runs once under
    ``torch.device("meta")`` (a user's factory returns its model already built: then a meta copy
    of it is traced). A model meta tensors cannot run goes ahead unchecked. Also checks that a
    tensor dataset's class targets fit the model's outputs (default cross-entropy loss). A step
    holds its ``grad_accum`` micro-batches on the device at once: their inputs count too."""
    batch = meta_batch(train_data, batch_size, seed)
    held = (grad_accum - 1) * _bytes(batch)
    if planner is not None:
        est = estimate_planned(*planner, batch_size, half_precision, materialized_attention=device.type == "cpu",
                               optimizer=optimizer)
        check(scaled(_plus(est, held), states_split, activations_split), device, share=share)
        return build()
    from tensorpilot.observe.flops import meta_copy
    from tensorpilot.workloads.base import cross_entropy

    with torch.device("meta"):
        shadow = build()
    traced = meta_copy(shadow) if any(not p.is_meta for p in shadow.parameters()) else shadow
    outputs: list = []

    def loss(out, y):
        outputs.append(out.shape if isinstance(out, torch.Tensor) else None)
        return (loss_fn or cross_entropy)(out, y)
    try:
        est = estimate_traced(traced, batch, loss, act_bytes=2 if half_precision else None, optimizer=optimizer)
    except Exception:                   # noqa: BLE001 - an op without a meta kernel: no estimate
        est = None
    if est is not None:
        check(scaled(_plus(est, held), states_split, activations_split), device, share=share)
        if loss_fn is None and outputs and outputs[0]:
            check_class_targets(train_data, outputs[0][-1])
    del traced, shadow
    return build()


def _bytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) batch."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_bytes(o) for o in obj.values())
    return 0


def _plus(est: MemoryEstimate, activations_bytes: float) -> MemoryEstimate:
    return dataclasses.replace(est, activations_bytes=est.activations_bytes + activations_bytes)


def meta_batch(train_data: Any, batch_size: int, seed: int) -> Any:
    """One micro-batch of ``train_data`` as meta tensors, from a single real sample: a
    micro-batch of a billion samples is described, never built."""
    from tensorpilot.observe.flops import to_meta
    from tensorpilot.training import loader

    if isinstance(train_data, torch.utils.data.DataLoader):
        return to_meta(next(iter(train_data)))
    one = next(iter(loader.make_loader(train_data, 1, 0, 0, False, seed)))
    return expand_batch(one, batch_size)


def estimate_gpt(shape: dict[str, Any], micro_batch: int, half_precision: bool,
                 materialized_attention: bool) -> MemoryEstimate:
    """The built-in gpt's memory from the planner."""
    from types import SimpleNamespace

    from tensorpilot.plan.models import model_spec_from_gpt_config

    spec = model_spec_from_gpt_config(SimpleNamespace(**shape))
    return estimate_planned(spec, shape["seq_len"], micro_batch, half_precision, materialized_attention)


def estimate_planned(spec: Any, seq_len: int, micro_batch: int, half_precision: bool,
                     materialized_attention: bool, optimizer: str = "adamw", recompute: str = "none") -> MemoryEstimate:
    """The memory of a model the planner describes (``spec``: a plan.models.ModelSpec);
    torch.autocast keeps fp32 weights, gradients and AdamW states: the planner's '*-amp' recipes.
    ``recompute``: the activation checkpointing policy (none, selective, full; plan.memory)."""
    from tensorpilot.plan import memory as pm

    prec = pm.precision("bf16-amp" if half_precision else "fp32", optimizer)
    states = sum(pm.model_state_bytes(spec.n_params, prec).values())
    acts = pm.activation_bytes_per_device(
        spec, seq_len=seq_len, micro_batch=micro_batch, n_micro=1, act_bytes=prec.act_bytes,
        attention="materialized" if materialized_attention else "flash", recompute=recompute)
    return MemoryEstimate(states, acts["activations"] + acts["logits"], f"planner ({spec.name})",
                          spec.n_params, optimizer)


def scaled(est: MemoryEstimate, states_split: int, activations_split: int) -> MemoryEstimate:
    """One process's share under a parallel layout: model states split over tp x pp (and dp
    under FSDP), activations over tp."""
    if states_split == 1 and activations_split == 1:
        return est
    return dataclasses.replace(est, states_bytes=est.states_bytes / states_split,
                               activations_bytes=est.activations_bytes / activations_split,
                               trainable_params=est.trainable_params / states_split)


def expand_batch(one: Any, batch: int) -> Any:
    """A batch of one sample (tensors, or tuples/lists/dicts of them) as meta tensors of
    ``batch`` samples: what the micro-batch will look like, without building it."""
    if isinstance(one, torch.Tensor):
        return torch.empty((batch, *one.shape[1:]), dtype=one.dtype, device="meta")
    if isinstance(one, (tuple, list)):
        return type(one)(expand_batch(o, batch) for o in one)
    if isinstance(one, dict):
        return {k: expand_batch(v, batch) for k, v in one.items()}
    return one


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata        # one StorageImpl per allocation, also on meta


def estimate_traced(model: nn.Module, sample: Any, loss_fn: Callable, act_bytes: int | None = None,
                    optimizer: str = "adamw") -> MemoryEstimate:
    """Trace one forward + loss of ``model`` (on the meta device: build it under
    ``torch.device('meta')``) on ``sample`` (meta tensors of one micro-batch). ``act_bytes``:
    bytes per saved floating-point element under autocast (2 for bf16/fp16), else as traced."""
    params = {_storage_key(p) for p in model.parameters()} | {_storage_key(b) for b in model.buffers()}
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        key = _storage_key(t)
        if key not in params:
            size = t.untyped_storage().nbytes()
            if act_bytes is not None and t.is_floating_point() and t.element_size() > act_bytes:
                size = size * act_bytes // t.element_size()
            saved[key] = size
        return t

    x, y = sample
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*x) if isinstance(x, (tuple, list)) else model(x)
        loss_fn(out, y)
    out_bytes = out.untyped_storage().nbytes() if isinstance(out, torch.Tensor) else 0
    in_bytes = sum(t.untyped_storage().nbytes() for t in (x if isinstance(x, (tuple, list)) else [x])
                   if isinstance(t, torch.Tensor))
    # the output's gradient and its fp32 copy for the loss come on top of what is saved
    acts = sum(saved.values()) + 2 * out_bytes + in_bytes
    states = n_params * state_bytes_per_param(optimizer) + frozen * 4
    return MemoryEstimate(float(states), float(acts), "traced on the meta device", float(n_params), optimizer)


def free_bytes(device: torch.device) -> tuple[int | None, str]:
    """(bytes this process can still allocate on ``device``, where that figure comes from)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), "free GPU memory"
    if device.type != "cpu":
        return None, ""
    available = None
    try:
        for line in open("/proc/meminfo", encoding="ascii"):
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        return None, ""
    # a container's memory limit (cgroup v2) is tighter than the host's free memory
    try:
        limit = open("/sys/fs/cgroup/memory.max", encoding="ascii").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current", encoding="ascii").read())
        if limit != "max" and available is not None:
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available, "available host memory"


def check(est: MemoryEstimate, device: torch.device, *, share: int = 1) -> None:
    """ConfigError when ``est`` exceeds the device's free memory (``share``: processes of this
    run that share the device's memory, e.g. CPU workers on one machine)."""
    free, what = free_bytes(device)
    if free is None:
        return
    budget = free / max(share, 1)
    if est.total_bytes <= budget:
        return
    gib = 2**30
    per = f" per process ({share} share it)" if share > 1 else ""
    lighter = smaller_optimizer(est, budget)
    alt = (f" or --optim.name {lighter} (less optimizer state: it would fit)" if lighter else "")
    raise DoesNotFit(lighter,
        f"this run does not fit: it needs about {est.total_bytes / gib:,.1f} GiB{per} (weights, "
        f"gradients and optimizer state {est.states_bytes / gib:,.1f} GiB, activations of one "
        f"micro-batch {est.activations_bytes / gib:,.1f} GiB; {est.method}) but {device.type} has "
        f"{budget / gib:,.1f} GiB of {what}; use a smaller --batch-size or model{alt}, or "
        f"--no-train.memory_check to try anyway.")


class DoesNotFit(ConfigError):
    """The run does not fit; ``lighter`` names an optimizer with less state with which it would
    (None: none would)."""

    def __init__(self, lighter: str | None, message: str):
        super().__init__(message)
        self.lighter = lighter


def smaller_optimizer(est: MemoryEstimate, budget: float) -> str | None:
    """The optimizer keeping the most state (the closest to AdamW) with which ``est`` fits."""
    from tensorpilot.plan.memory import OPTIMIZER_STATE_BYTES as per_param

    for name in ("adamw8bit", "adafactor"):          # most state first
        saved = est.trainable_params * (per_param[est.optimizer] - per_param[name])
        if saved > 0 and est.total_bytes - saved <= budget:
            return name
    return None


def check_class_targets(train_data: Any, classes: int) -> None:
    """Targets of a tensor dataset must be class indices the model's output can score (cross
    entropy over its last dimension): an index >= ``classes`` fails deep inside the loss."""
    targets = getattr(train_data, "targets", None)
    if not isinstance(targets, torch.Tensor) or targets.numel() == 0 or targets.is_floating_point():
        return
    high = int(targets.max())
    if high >= classes:
        raise ConfigError(f"the targets hold class index {high} but the model outputs {classes} "
                          f"scores per sample (class indices 0..{classes - 1}): give a model with "
                          f"at least {high + 1} outputs or fix the targets.")
