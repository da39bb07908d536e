"""How one training step is split over devices: the single ``Layout`` type that the planner
predicts for (tensorpilot.plan), the parallel runtime builds (tensorpilot.parallel) and the run
summary reports. Standard library only.

One sharding vocabulary, after ZeRO's stages (Rajbhandari et al. 2020):

    none    every data-parallel rank holds the whole model (DDP: gradients all-reduced)
    zero1   optimizer state sharded over dp
    zero2   + gradients sharded (reduce-scatter instead of all-reduce)
    fsdp    + parameters sharded, gathered per block (ZeRO-3; FSDP2 ``fully_shard`` in train)

``ddp`` (what ``--parallel.sharding`` says) and ``zero3`` are accepted as the names of ``none``
and ``fsdp``; a Layout always holds the canonical name.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorpilot.errors import ConfigError

__all__ = ["Layout", "SHARDINGS", "SHARDING_ALIASES", "SCHEDULES", "canonical_sharding"]

SHARDINGS = {"none": 0, "zero1": 1, "zero2": 2, "fsdp": 3}      # name -> ZeRO stage
SHARDING_ALIASES = {"ddp": "none", "zero3": "fsdp"}
SCHEDULES = ("1f1b", "gpipe", "interleaved")


def canonical_sharding(name: str) -> str:
    """'ddp' -> 'none', 'zero3' -> 'fsdp'; a canonical name unchanged; anything else a ConfigError."""
    name = SHARDING_ALIASES.get(name, name)
    if name not in SHARDINGS:
        raise ConfigError(f"unknown sharding {name!r}: use {', '.join(SHARDINGS)} (or ddp, zero3).")
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Degrees of each kind of parallelism (``dp * tp * pp`` devices) and how the step runs on
    them; ``name`` is the short form ('dp', 'fsdp x tp', ...)."""

    tp: int = 1                      # tensor-parallel ranks (inside a node)
    pp: int = 1                      # pipeline stages
    dp: int = 1                      # data-parallel replicas (or ZeRO/FSDP shards)
    sharding: str = "none"           # see the module docstring
    sequence_parallel: bool = False  # Megatron sequence parallelism (needs tp > 1)
    micro_batch: int = 1             # sequences per micro-batch per replica
    schedule: str = "1f1b"           # pipeline schedule: 1f1b | gpipe | interleaved
    virtual_stages: int = 1          # model chunks per stage (interleaved schedule)
    recompute: str = "none"          # activation recomputation: none | selective | full

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharding", canonical_sharding(self.sharding))

    @property
    def n_devices(self) -> int:
        return self.tp * self.pp * self.dp

    world = n_devices                # the process count, as torch.distributed calls it

    @property
    def zero_stage(self) -> int:
        return SHARDINGS[self.sharding]

    @property
    def name(self) -> str:
        parts = []
        if self.dp > 1 or (self.tp == 1 and self.pp == 1):
            parts.append("dp" if self.sharding == "none" else self.sharding)
        parts += [n for n, k in (("tp", self.tp), ("pp", self.pp)) if k > 1]
        return " x ".join(parts)

    @property
    def tag(self) -> str:
        """The degrees in one word, for labels: 'dp2', 'fsdp2xtp2', 'pp2', 'single'."""
        data = {"none": "dp", "fsdp": "fsdp"}.get(self.sharding, f"{self.sharding}dp")
        parts = [f"{data}{self.dp}" if self.dp > 1 else "", f"tp{self.tp}" if self.tp > 1 else "",
                 f"pp{self.pp}" if self.pp > 1 else ""]
        return "x".join(p for p in parts if p) or "single"

    def describe(self) -> str:
        extra = " sp" if self.sequence_parallel else ""
        sched = f" {self.schedule}" + (f"/{self.virtual_stages}" if self.virtual_stages > 1 else "") \
            if self.pp > 1 else ""
        return (f"tp={self.tp} pp={self.pp} dp={self.dp} {self.sharding}{extra} mb={self.micro_batch}"
                f" recompute={self.recompute}{sched}")
