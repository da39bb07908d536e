"""The execution plan: how this run executes on this hardware, as one frozen value.

The trainer is built from one (``Trainer.setup``) and changes only through ``Trainer.apply(plan)``,
which undoes and redoes what the difference needs; ``--optimize auto`` (tensorpilot.training.
autotune) only *produces* plans. ``summary.json`` records the plan the run ended with, with the
reason for each choice. The run's configuration (RunConfig) holds what was asked; this holds what
was decided. Standard library only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tensorpilot.layout import Layout

__all__ = ["ExecutionPlan", "run_label", "PRECISIONS", "COMPILE", "MEMORY_FORMATS", "CHECKPOINTING"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
COMPILE = ("off", "on", "pending")          # pending: compile=auto, decided once an eager step is timed
COMPILE_MODES = ("default", "reduce-overhead")
COMPILE_SCOPES = ("blocks", "model")         # per repeated block (regional), or the whole model
MEMORY_FORMATS = ("contiguous", "channels_last")
CHECKPOINTING = ("none", "blocks")           # activation checkpointing of every repeated block


def run_label(precision: str, micro_batch: int, grad_accum: int, checkpointing: bool, compiled: bool,
              compile_mode: str, channels_last: bool) -> str:
    """'bf16 16x2 ckpt compile+cudagraphs channels_last': how a plan or an autotune candidate is
    named in tables and summaries."""
    parts = [precision, f"{micro_batch}x{grad_accum}"]
    if checkpointing:
        parts.append("ckpt")
    if compiled:
        parts.append("compile" + ("+cudagraphs" if compile_mode == "reduce-overhead" else ""))
    if channels_last:
        parts.append("channels_last")
    return " ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionPlan:
    device: str                                  # "cpu", "cuda:0", ...
    precision: str                               # see PRECISIONS (resolved: never "auto")
    micro_batch: int                             # samples per forward/backward on this rank
    grad_accum: int                              # micro-batches per optimizer step
    activation_checkpointing: str = "none"       # see CHECKPOINTING
    compile: str = "off"                         # see COMPILE
    compile_mode: str = "default"                # "reduce-overhead" adds CUDA graphs
    compile_scope: str = "blocks"                # see COMPILE_SCOPES
    memory_format: str = "contiguous"            # see MEMORY_FORMATS (4-D weights and inputs)
    optimizer: str = "fused"                     # optimizer implementation: fused | foreach | loop | torchao
    attention: str = "auto"                      # auto | sdpa | blocked (tensorpilot.attention)
    num_workers: int = 0                         # DataLoader worker processes
    layout: Layout = field(default_factory=Layout)
    reasons: tuple[tuple[str, str], ...] = ()    # (setting, why), the newest reason of each last

    def __post_init__(self) -> None:
        for name, allowed in (("precision", PRECISIONS), ("compile", COMPILE), ("compile_mode", COMPILE_MODES),
                              ("compile_scope", COMPILE_SCOPES), ("memory_format", MEMORY_FORMATS),
                              ("activation_checkpointing", CHECKPOINTING)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"ExecutionPlan.{name} must be one of {', '.join(allowed)}, "
                                 f"not {getattr(self, name)!r}")
        if self.micro_batch < 1 or self.grad_accum < 1 or self.num_workers < 0:
            raise ValueError("ExecutionPlan needs micro_batch >= 1, grad_accum >= 1 and num_workers >= 0")
        # the layout's per-step fields follow the plan's, so the planner sees this very step
        object.__setattr__(self, "layout", dataclasses.replace(
            self.layout, micro_batch=self.micro_batch, recompute="full" if self.checkpointing else "none"))

    def same_devices(self, other: ExecutionPlan) -> bool:
        """Same device and the same split over devices (the per-step fields aside)."""
        a, b = self.layout, other.layout
        return self.device == other.device and (a.dp, a.tp, a.pp, a.sharding, a.sequence_parallel, a.schedule) \
            == (b.dp, b.tp, b.pp, b.sharding, b.sequence_parallel, b.schedule)

    def replace(self, *, why: dict[str, str] | None = None, **changes: Any) -> ExecutionPlan:
        """A copy with ``changes``; ``why`` adds or replaces the reasons of settings."""
        reasons = dict(self.reasons)
        reasons.update(why or {})
        return dataclasses.replace(self, reasons=tuple(reasons.items()), **changes)

    def reason(self, setting: str, default: str = "") -> str:
        return dict(self.reasons).get(setting, default)

    @property
    def compiled(self) -> bool:
        return self.compile == "on"

    @property
    def checkpointing(self) -> bool:
        return self.activation_checkpointing != "none"

    @property
    def samples_per_step(self) -> int:
        """Samples of one optimizer step over all data-parallel ranks (the global batch)."""
        return self.micro_batch * self.grad_accum * self.layout.dp

    def label(self) -> str:
        """Short form, e.g. 'bf16 16x2 ckpt compile'."""
        return run_label(self.precision, self.micro_batch, self.grad_accum, self.checkpointing, self.compiled,
                         self.compile_mode, self.memory_format == "channels_last")

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("layout", "reasons")}
        lay = self.layout
        out["layout"] = {"name": lay.name, "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "sharding": lay.sharding,
                         "sequence_parallel": lay.sequence_parallel, "schedule": lay.schedule}
        out["label"] = self.label()
        out["reasons"] = dict(self.reasons)
        return out
