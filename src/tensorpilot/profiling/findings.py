"""From a measured step to ranked findings, each with its evidence and the train flag that
addresses it. Pure functions of the breakdown (breakdown.StepTimes), the roofline rows
(roofline.py) and the run's facts (``RunFacts``): tested with hand-made numbers and fake devices.

Kinds (a stable vocabulary; profile.json ``findings[].kind``):

    data_loading   the step waits for its next batch             -> DataLoader workers
    host_overhead  Python, dispatch and launches, not kernels     -> a larger micro-batch / compile
    precision      fp32 matmuls on a device with fast bf16 units  -> --precision bf16
    memory_bound   memory-bound kernels (elementwise, norms, ...) -> compile (fusion)
    attention      attention on a slow kernel (SDPA's math path)  -> the attention implementation
    communication  collectives the step waits for                 -> fewer all-reduces per sample
    recompute      activation checkpointing's recomputation       -> checkpointing off
    optimizer      a large optimizer step, not fused              -> --optim.impl fused

``share_of_step`` is the share of the (profiler-corrected) step spent in the symptom, and the
list is ranked by it; a kind is reported only above its threshold (THRESHOLDS) and only when its
flag would change something in this run. ``flag`` pastes onto `tensorpilot train` (and
`tensorpilot profile`); ``setting`` is the same as dotted settings for --apply and the Python API.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("data_loading", "host_overhead", "precision", "memory_bound", "attention", "communication",
         "recompute", "optimizer")

# Minimum share of the step before a symptom is a finding. Host overhead of an eager CPU step is
# commonly 15-25 % (Python module calls and autograd between kernels), so it needs more.
THRESHOLDS = {"data_loading": 0.10, "host_overhead": 0.30, "precision": 0.10, "memory_bound": 0.30,
              "attention": 0.10, "communication": 0.10, "recompute": 0.10, "optimizer": 0.10}
# attention below this fraction of the step's own matmul rate is on a slow path
SLOW_ATTENTION = 0.5
# bf16 must beat fp32 by this much (measured ceilings) before fp32 is called a finding
PRECISION_GAIN = 1.3


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What the findings need to know about the run and the device (all plain values)."""

    device_kind: str = "cpu"                 # cpu | cuda | mps | xpu
    precision: str = "fp32"                  # the run's resolved precision
    bf16_fast: bool = False                  # DeviceCaps.supports_bf16_fast
    bf16_over_fp32: float | None = None      # measured bf16 / fp32 matmul ceiling, when known
    compiled: bool = False
    can_compile: bool = True                 # a C++ compiler (CPU) or a GPU for inductor
    attention_mode: str = "auto"             # engine.attention
    num_workers: int = 0
    user_loader: bool = False                # the user passed a DataLoader: our workers do not apply
    micro_batch: int = 1
    grad_accum: int = 1
    world_size: int = 1
    checkpointing: bool = False
    optimizer_name: str = "adamw"
    optimizer_impl: str = "fused"
    cpu_count: int = 1
    peak_memory_bytes: float | None = None
    device_memory_bytes: float | None = None


@dataclass(slots=True)
class Finding:
    kind: str
    share_of_step: float
    evidence: str
    fix: str
    flag: str
    setting: dict[str, Any] = field(default_factory=dict)   # dotted setting -> value

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def flag_for(setting: dict[str, Any]) -> str:
    """The command-line form of dotted settings: {"data.num_workers": 4} -> "--data.num_workers 4";
    booleans as --x / --no-x (train's BooleanOptionalAction)."""
    parts = []
    for dotted, value in setting.items():
        if isinstance(value, bool):
            parts.append(f"--{dotted}" if value else f"--no-{dotted}")
        else:
            parts.append(f"--{dotted} {shlex.quote(str(value))}")
    return " ".join(parts)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def _make(kind: str, share: float, evidence: str, fix: str, setting: dict[str, Any]) -> Finding:
    return Finding(kind, share, evidence, fix, flag_for(setting), setting)


def data_loading(step, facts: RunFacts) -> Finding | None:
    share = step.share("data_loading")
    if share < THRESHOLDS["data_loading"] or facts.user_loader:
        return None
    workers = max(2, min(8, facts.cpu_count)) if facts.num_workers == 0 else min(facts.num_workers * 2, 64)
    return _make("data_loading", share,
                 f"{_ms(step.seconds['data_loading'])} of a {_ms(step.wall_s)} step waiting for the next batch "
                 f"(DataLoader __next__, {facts.num_workers} worker processes)",
                 f"load batches in {workers} worker processes while the step computes (prefetched, and pinned "
                 "memory on GPUs); if the dataset's __getitem__ itself is slow, cache or pre-process it",
                 {"data.num_workers": workers})


def host_overhead(step, facts: RunFacts) -> Finding | None:
    share = step.share("host_overhead")
    if share < THRESHOLDS["host_overhead"]:
        return None
    evidence = (f"{_ms(step.seconds['host_overhead'])} of a {_ms(step.wall_s)} step is Python, module calls, "
                "autograd and dispatch between kernels (wall time no kernel accounts for)")
    if facts.device_kind == "cuda" and not facts.compiled and facts.can_compile:
        return _make("host_overhead", share, evidence,
                     "compile the model: fewer, fused kernels and far fewer launches (CUDA graphs with "
                     "--optimize auto); or a larger micro-batch gives each launch more work",
                     {"engine.compile": "on"})
    bigger = facts.micro_batch * 4
    return _make("host_overhead", share, evidence,
                 f"a micro-batch of {bigger} spreads the same per-step overhead over {bigger} samples "
                 "(the global batch grows: scale the learning rate); torch.compile (--compile on) removes "
                 "Python and dispatch between fused kernels",
                 {"data.batch_size": bigger})


def precision(step, facts: RunFacts) -> Finding | None:
    if facts.precision not in ("fp32", "tf32") or not facts.bf16_fast:
        return None
    if facts.bf16_over_fp32 is not None and facts.bf16_over_fp32 < PRECISION_GAIN:
        return None
    share = step.share("matmul_conv") + step.share("attention")
    if share < THRESHOLDS["precision"]:
        return None
    ratio = f"; its measured bf16 matmul ceiling is {facts.bf16_over_fp32:.1f}x fp32's" \
        if facts.bf16_over_fp32 else ""
    return _make("precision", share,
                 f"{share:.0%} of the step in {facts.precision} matmuls/convolutions/attention on a device with "
                 f"fast bf16 units{ratio}",
                 "train in bf16 autocast (weights and optimizer stay fp32): matmuls run on the low-precision "
                 "units at a multiple of the fp32 rate",
                 {"engine.precision": "bf16"})


def memory_bound(step, facts: RunFacts, roofline: list[dict] | None = None) -> Finding | None:
    from tensorpilot.profiling.breakdown import MEMORY_BOUND

    if facts.compiled or not facts.can_compile:
        return None
    share = sum(step.share(c) for c in MEMORY_BOUND)
    if share < THRESHOLDS["memory_bound"]:
        return None
    rates = [f"{r['op_class']} {r['achieved_bytes_per_s'] / 1e9:,.1f} GB/s" for r in roofline or ()
             if r["op_class"] in MEMORY_BOUND and r.get("achieved_bytes_per_s")]
    return _make("memory_bound", share,
                 f"{share:.0%} of the step in memory-bound kernels (elementwise, normalization, softmax/loss, "
                 "copies), each reading and writing its whole tensor" + (f": {', '.join(rates)}" if rates else ""),
                 "compile the model: inductor fuses chains of elementwise ops into one pass over memory",
                 {"engine.compile": "on"})


def attention(step, facts: RunFacts, roofline: list[dict] | None = None) -> Finding | None:
    share = step.share("attention")
    if share < THRESHOLDS["attention"]:
        return None
    paths = ", ".join(k.removeprefix("aten::") for k in step.attention_paths) or "SDPA"
    if any("math" in k for k in step.attention_paths) and facts.attention_mode != "blocked":
        # SDPA's unfused fallback (on a CPU: any dropout; auto times the kernels without dropout,
        # so it can keep SDPA and still land here): the blocked path computes the same thing,
        # dropout included, and skips the masked half of causal scores
        return _make("attention", share,
                     f"{share:.0%} of the step in attention ({paths}: PyTorch's unfused math fallback)",
                     "route SDPA calls to tensorpilot's blocked matmuls (engine.attention blocked): the same "
                     "result, dropout included, without computing the masked half of causal scores",
                     {"engine.attention": "blocked"})
    from tensorpilot.attention import resolved_mode

    if facts.attention_mode != "sdpa" or resolved_mode("auto", facts.device_kind) == "sdpa":
        # auto already chose per shape; blocked was asked for; where auto runs as SDPA (on an
        # accelerator), suggesting it would change nothing
        return None
    rows = {r["op_class"]: r for r in roofline or ()}
    att, mm = rows.get("attention", {}), rows.get("matmul_conv", {})
    if not (att.get("achieved_flops_per_s") and mm.get("achieved_flops_per_s")):
        return None
    ratio = att["achieved_flops_per_s"] / mm["achieved_flops_per_s"]
    if ratio >= SLOW_ATTENTION:
        return None
    return _make("attention", share,
                 f"{share:.0%} of the step in attention ({paths}), at {ratio:.0%} of the step's matmul FLOP/s",
                 "let tensorpilot time SDPA against blocked matmuls per call shape and keep the faster "
                 "(engine.attention auto)",
                 {"engine.attention": "auto"})


def communication(step, facts: RunFacts) -> Finding | None:
    share = step.share("communication")
    if share < THRESHOLDS["communication"] or facts.world_size < 2:
        return None
    accum = max(facts.grad_accum * 4, 4)
    return _make("communication", share,
                 f"{_ms(step.seconds['communication'])} of a {_ms(step.wall_s)} step in communication the step "
                 f"waits for (collective calls, gradient bucket copies, waits) across {facts.world_size} processes; "
                 f"the collectives themselves ran {_ms(step.comm_total_s)}, {_ms(step.comm_overlapped_s)} of it "
                 "hidden behind compute",
                 f"accumulate {accum} micro-batches per step: one gradient all-reduce per {accum} micro-batches "
                 "(the global batch grows); or shard with --parallel.sharding fsdp, or tune overlap with "
                 "--parallel.bucket_mb",
                 {"engine.grad_accum": accum})


def recompute(step, facts: RunFacts) -> Finding | None:
    if not facts.checkpointing:
        return None
    share = step.recompute_s / step.wall_s if step.wall_s else 0.0
    if share < THRESHOLDS["recompute"]:
        return None
    room = ""
    if facts.peak_memory_bytes and facts.device_memory_bytes:
        room = (f"; the step's peak is {facts.peak_memory_bytes / 2**30:,.2f} GiB of "
                f"{facts.device_memory_bytes / 2**30:,.0f} GiB")
    return _make("recompute", share,
                 f"{_ms(step.recompute_s)} of a {_ms(step.wall_s)} step recomputes checkpointed blocks' forward "
                 f"in backward{room}",
                 "turn activation checkpointing off where the activations fit (tensorpilot plan predicts "
                 "the memory; train checks it before allocating)",
                 {"engine.activation_checkpointing": False})


def optimizer(step, facts: RunFacts) -> Finding | None:
    # the whole optimizer step, its Python included: a for-loop AdamW's cost is mostly dispatch
    spent = max(step.optimizer_step_s, step.seconds.get("optimizer", 0.0))
    share = spent / step.wall_s if step.wall_s else 0.0
    if share < THRESHOLDS["optimizer"] or facts.optimizer_name != "adamw" or facts.optimizer_impl == "fused":
        return None
    return _make("optimizer", share,
                 f"{_ms(spent)} of a {_ms(step.wall_s)} step in the optimizer step "
                 f"({facts.optimizer_impl} AdamW: kernels launched per parameter tensor and operation)",
                 "the fused AdamW kernel updates all parameters in one pass",
                 {"optim.impl": "fused"})


def find(step, facts: RunFacts, roofline: list[dict] | None = None) -> list[Finding]:
    """The findings of one (profiler-corrected, typical) step, largest share first."""
    found = [data_loading(step, facts), host_overhead(step, facts), precision(step, facts),
             memory_bound(step, facts, roofline), attention(step, facts, roofline), communication(step, facts),
             recompute(step, facts), optimizer(step, facts)]
    return sorted((f for f in found if f is not None), key=lambda f: -f.share_of_step)
