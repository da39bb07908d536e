"""How one training step is split over devices: the single ``Layout`` type that the planner
predicts for (tensorpilot.plan), the parallel runtime builds (tensorpilot.parallel) and the run
summary reports. Standard library only.

One sharding vocabulary, after ZeRO's stages (Rajbhandari et al. 2020):

    none    every data-parallel rank holds the whole model (DDP: gradients all-reduced)
    zero1   optimizer state sharded over dp
    zero2   + gradients sharded (reduce-scatter instead of all-reduce)
    fsdp    + parameters sharded, gathered per block (ZeRO-3; FSDP2 ``fully_shard`` in train)

``ddp`` (what ``--parallel.sharding`` says) and ``zero3`` are accepted as the names of ``none``
and ``fsdp``; a Layout always holds the canonical name. Hybrid sharding (FSDP's HYBRID_SHARD,
HSDP: sharded inside a group of ranks, replicated across groups) is ``fsdp`` with a
``shard_group`` smaller than dp. :func:`normalize_sharding_label` reads the many names papers
and frameworks give these (``fsdp(dp)``, "fully sharded", "distributed optimizer", ``hsdp``...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tensorpilot.errors import ConfigError

__all__ = ["CP_MODES", "Layout", "SHARDINGS", "SHARDING_ALIASES", "SCHEDULES", "SHARDING_LABELS",
           "canonical_sharding", "normalize_sharding_label"]

SHARDINGS = {"none": 0, "zero1": 1, "zero2": 2, "fsdp": 3}      # name -> ZeRO stage
SHARDING_ALIASES = {"ddp": "none", "zero3": "fsdp"}
SCHEDULES = ("1f1b", "gpipe", "interleaved")
# How context-parallel ranks share a sequence's attention: "ring" passes key/value chunks round
# the group (ring attention; Megatron-Core's and torchtitan's context parallelism), "ulysses"
# swaps sequence for heads with all-to-alls around the attention core (DeepSpeed-Ulysses,
# Jacobs et al. 2023, arXiv 2309.14509; Hugging Face Accelerate's sp_backend="deepspeed").
CP_MODES = ("ring", "ulysses")


def canonical_sharding(name: str) -> str:
    """'ddp' -> 'none', 'zero3' -> 'fsdp'; a canonical name unchanged; anything else a ConfigError."""
    name = SHARDING_ALIASES.get(name, name)
    if name not in SHARDINGS:
        raise ConfigError(f"unknown sharding {name!r}: use {', '.join(SHARDINGS)} (or ddp, zero3).")
    return name


# Sharding labels as papers, configs and framework docs write them -> (canonical sharding, hybrid).
# Keys are lower-cased with everything but letters and digits dropped ("ZeRO-3" -> "zero3",
# "fsdp(dp)" -> "fsdpdp"). Sources of the synonyms: ZeRO's P_os / P_os+g / P_os+g+p stages
# (Rajbhandari et al. 2020, Fig. 1); Megatron-LM's "distributed optimizer" shards optimizer state
# and fp32 master weights over dp = ZeRO-1 (Megatron-LM docs, distrib_optimizer.md); PyTorch FSDP's
# ShardingStrategy names (FULL_SHARD, SHARD_GRAD_OP = ZeRO-2, NO_SHARD, HYBRID_SHARD); the Llama 3
# paper's "FSDP within data parallel" (written fsdp(dp)); DeepSpeed's "stage 3".
SHARDING_LABELS: dict[str, tuple[str, bool]] = {
    **{k: ("none", False) for k in ("", "none", "no", "nosharding", "ddp", "ddpnosharding", "dp", "dataparallel",
                                    "distributeddataparallel", "noshard", "replicated", "zero0", "zerostage0",
                                    "stage0")},
    **{k: ("zero1", False) for k in ("zero1", "zerostage1", "stage1", "zeroos", "pos", "os", "distributedoptimizer",
                                     "distopt", "shardedoptimizer", "optimizersharding", "zero1dp")},
    **{k: ("zero2", False) for k in ("zero2", "zerostage2", "stage2", "zeroosg", "posg", "osg", "shardgradop",
                                     "fsdpshardgradop", "zero2dp")},
    **{k: ("fsdp", False) for k in ("zero3", "zerostage3", "stage3", "zeroosgp", "posgp", "osgp", "fsdp", "fsdp1",
                                    "fsdp2", "fsdpfull", "fullshard", "fsdpfullshard", "fullysharded",
                                    "fullyshardeddataparallel", "fullyshard", "fsdpdp", "fsdpwithindp",
                                    "fsdpwithindataparallel", "zero3dp", "zeroinfinity", "megatronfsdp",
                                    "customfsdp")},
    **{k: ("fsdp", True) for k in ("hsdp", "hybridshard", "hybridsharding", "fsdphybrid", "fsdphybridshard",
                                   "hybridshardeddataparallel", "hybridfsdp", "zero3hybrid", "zeroplusplus",
                                   "zeropp", "mics")},
}


def normalize_sharding_label(text: str) -> tuple[str, bool]:
    """A published or user-written sharding label -> (canonical sharding, hybrid within a node).

    'ZeRO-3' -> ('fsdp', False); 'fsdp(dp)' -> ('fsdp', False); 'HSDP' -> ('fsdp', True);
    'DDP (no sharding)' -> ('none', False). A label that is not known whole is tried part by part
    (the text before and inside parentheses: 'ZeRO-3 (FSDP)'); none known -> ConfigError."""
    def key(t: str) -> str:
        return re.sub(r"[^a-z0-9]", "", t.lower().replace("++", "plusplus").replace("+", ""))
    parts = [text, *re.split(r"[()\[\],;/]", text)]
    for part in parts:
        k = key(part)
        if k in SHARDING_LABELS and (k or part is text):
            return SHARDING_LABELS[k]
    raise ConfigError(f"unknown sharding label {text.strip()[:60]!r}: use one of none/ddp, zero1, zero2, "
                      "zero3/fsdp or hsdp (docs/planner.md lists the synonyms read)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Degrees of each kind of parallelism (``dp * tp * pp * cp`` devices) and how the step runs on
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
    # with recompute "full": the blocks of each model chunk that recompute, the others keep their
    # activations (Megatron's --recompute-method block --recompute-num-layers); 0 = every block
    recompute_layers: int = 0
    shard_group: int = 0             # fsdp: ranks a shard group spans (HSDP: a node); 0 = all dp ranks
    cp: int = 1                      # context-parallel ranks: each holds seq_len / cp tokens of every sequence
    cp_mode: str = "ring"            # how they share attention: CP_MODES
    # collectives that frameworks can hide behind compute are hidden: TP all-gathers/reduce-scatters
    # inside the GEMMs they feed (Megatron --tp-comm-overlap, torchtitan async TP) and the ZeRO-1/2
    # weight all-gather behind the next forward (Megatron --overlap-param-gather)
    overlap_comm: bool = False
    # the gradient reduction runs behind backward, bucket by bucket (PyTorch DDP, FSDP, DeepSpeed
    # ZeRO-3); False: after it (DeepSpeed ZeRO-0/1/2's default, overlap_comm false)
    overlap_grad_reduce: bool = True
    # DDP copies each gradient into its all-reduce bucket and back (PyTorch DDP's default
    # gradient_as_bucket_view=False, apex's DDP, Horovod's fusion buffer): a read and a write each
    # way, 4 x the gradient bytes of device traffic a step; False where gradients live in the
    # buckets (gradient_as_bucket_view=True, as tensorpilot's DDP runs; Megatron's grad buffer)
    grad_bucket_copies: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharding", canonical_sharding(self.sharding))
        if not isinstance(self.cp, int) or self.cp < 1:
            raise ConfigError(f"cp must be a positive number of ranks, not {self.cp!r}.")
        if self.cp_mode not in CP_MODES:
            raise ConfigError(f"cp_mode must be one of {', '.join(CP_MODES)}, not {self.cp_mode!r}.")
        if not isinstance(self.recompute_layers, int) or self.recompute_layers < 0:
            raise ConfigError(f"recompute_layers must be 0 (every block) or a positive block count, "
                              f"not {self.recompute_layers!r}.")
        if self.recompute_layers and self.recompute != "full":
            raise ConfigError(f"recompute_layers applies to full recomputation, not to recompute={self.recompute!r}.")
        if self.shard_group < 0:
            raise ConfigError(f"shard_group must be 0 (all dp ranks) or a positive rank count, not {self.shard_group}.")

    @property
    def replicas(self) -> int:
        """Ranks that hold the same weights and reduce their gradients together: dp x cp (the
        context-parallel ranks of a sequence each compute a gradient of their chunk)."""
        return self.dp * self.cp

    @property
    def shard_degree(self) -> int:
        """Ranks one copy of the sharded states is split over: dp x cp, or the hybrid shard group
        (torchtitan and Megatron shard over the data- and context-parallel ranks together)."""
        return min(self.shard_group, self.replicas) if self.shard_group else self.replicas

    @property
    def n_devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    world = n_devices                # the process count, as torch.distributed calls it

    @property
    def zero_stage(self) -> int:
        return SHARDINGS[self.sharding]

    @property
    def name(self) -> str:
        parts = []
        if self.dp > 1 or (self.tp == 1 and self.pp == 1):
            parts.append("dp" if self.sharding == "none" else
                         "hsdp" if self.shard_degree < self.dp else self.sharding)
        parts += [n for n, k in (("tp", self.tp), ("pp", self.pp), ("cp", self.cp)) if k > 1]
        return " x ".join(parts)

    @property
    def tag(self) -> str:
        """The degrees in one word, for labels: 'dp2', 'fsdp2xtp2', 'pp2', 'single'."""
        data = {"none": "dp", "fsdp": "fsdp"}.get(self.sharding, f"{self.sharding}dp")
        parts = [f"{data}{self.dp}" if self.dp > 1 else "", f"tp{self.tp}" if self.tp > 1 else "",
                 f"pp{self.pp}" if self.pp > 1 else "", f"cp{self.cp}" if self.cp > 1 else ""]
        return "x".join(p for p in parts if p) or "single"

    def describe(self) -> str:
        extra = " sp" if self.sequence_parallel else ""
        sched = f" {self.schedule}" + (f"/{self.virtual_stages}" if self.virtual_stages > 1 else "") \
            if self.pp > 1 else ""
        cp = (f" cp={self.cp}" + (" ulysses" if self.cp_mode == "ulysses" else "")) if self.cp > 1 else ""
        overlap = (" overlap" if self.overlap_comm else "") + ("" if self.overlap_grad_reduce else " grad-reduce-after")
        blocks = f"({self.recompute_layers} blocks/chunk)" if self.recompute_layers else ""
        return (f"tp={self.tp} pp={self.pp} dp={self.dp}{cp} {self.sharding}{extra} mb={self.micro_batch}"
                f" recompute={self.recompute}{blocks}{sched}{overlap}")
