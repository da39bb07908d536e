"""One registered spec per workload kind: everything the rest of tensorpilot knows about a model
that is not in its ``nn.Module`` (in the spirit of torchtitan's ``TrainSpec``).

    build            (ModelConfig, DataConfig, seed, fits) -> Workload, for the kinds a config
                     names (gpt, mlp, cnn); None for the generic spec of a user's module
    tensor_parallel  (model, tp, sequence_parallel) -> [(module, {name: ParallelStyle})], or None
    pipeline_stage   (model, pp, pp_rank) -> this rank's stage module (its blocks in a ModuleDict
                     ``blocks``), or None
    no_parallel      why tensor/pipeline parallelism is not offered (when they are None)
    planner          workload meta -> (plan.models.ModelSpec, tokens per sample) for the
                     planner's memory and step-time prediction, or None (no planner model yet)
    serving          "generate" (token ids in, next-token logits out, text generation routes) or
                     "classify" (a tensor in, a tensor out)
    rebuild          builds the module again from what a run recorded (serve, generate):
                     gpt: (workload.gpt, where); classifiers: (ints, input_shape, classes), where
                     ``ints(key, empty_ok)`` reads a checked list of positive integers
    input_rank       dimensions of one input sample a classifier needs (cnn: 3, C x H x W)
    bits_per_byte    a byte-level language model: report validation loss as bits per byte

``get(kind)`` answers any kind, unknown ones (a user's module, "custom", "python:MyNet") with the
generic spec. Add a workload by writing its builder and registering one spec here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

from tensorpilot.config import BUILTIN_MODELS
from tensorpilot.errors import ConfigError

__all__ = ["WorkloadSpec", "SPECS", "GENERIC", "get", "builtin_names", "check_model_name"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    kind: str
    description: str
    build: Callable[..., Any] | None = None
    tensor_parallel: Callable[..., list] | None = None
    pipeline_stage: Callable[..., Any] | None = None
    no_parallel: str = "its layers have no split registered"
    planner: Callable[[dict], tuple[Any, int] | None] | None = None
    serving: str = "classify"
    rebuild: Callable[..., Any] | None = None
    input_rank: int | None = None
    bits_per_byte: bool = False

    def tp_plan(self, model, tp: int, sequence_parallel: bool) -> list:
        if self.tensor_parallel is None:
            raise ConfigError(f"tensor parallelism (--parallel.tp) is not available for the {self.kind} "
                              f"workload: {self.no_parallel}; use data parallelism (--parallel.sharding fsdp "
                              "shards a model too large for one device).")
        return self.tensor_parallel(model, tp, sequence_parallel)

    def stage(self, model, pp: int, pp_rank: int):
        if self.pipeline_stage is None:
            raise ConfigError(f"pipeline parallelism (--parallel.pp) is not available for the {self.kind} "
                              f"workload: {self.no_parallel}; use data parallelism (--parallel.sharding fsdp "
                              "shards a model too large for one device).")
        return self.pipeline_stage(model, pp, pp_rank)

    def plan_model(self, meta: dict) -> tuple[Any, int] | None:
        """(ModelSpec, tokens per sample) for the planner, or None when it has no model of this."""
        return self.planner(meta) if self.planner is not None else None


def _builder(name: str) -> Callable[..., Any]:
    """The registry's ``build_<name>``, imported when a run builds it (it imports torch)."""
    def build(mcfg, dcfg, seed, fits):
        from tensorpilot.workloads import registry

        return getattr(registry, f"build_{name}")(mcfg, dcfg, seed, fits)
    return build


# ------------------------------------------------------------------------------- the gpt
def _gpt_tp(model, tp, sequence_parallel):
    from tensorpilot.workloads.gpt_parallel import tensor_parallel_plan

    return tensor_parallel_plan(model, tp, sequence_parallel)


def _gpt_stage(model, pp, pp_rank):
    from tensorpilot.workloads.gpt_parallel import pipeline_stage

    return pipeline_stage(model, pp, pp_rank)


def _gpt_planner(meta: dict):
    shape = meta.get("gpt")
    if not isinstance(shape, dict):
        return None
    from tensorpilot.plan.models import model_spec_from_gpt_config

    return model_spec_from_gpt_config(SimpleNamespace(**shape)), shape["seq_len"]


def _gpt_rebuild(shape: Any, where: Any):
    """(build, GPTConfig) from a run's recorded ``workload.gpt`` (checked field by field)."""
    from tensorpilot.workloads.gpt import GPT, gpt_config_from_meta

    gcfg = gpt_config_from_meta(shape, where)
    return (lambda: GPT(gcfg)), gcfg


# ------------------------------------------------------------------------ classifiers
def _mlp_rebuild(ints: Callable[[str, bool], list[int]], shape: tuple[int, ...], classes: int):
    from tensorpilot.workloads.vision import MLPNet, num_features

    hidden = ints("hidden", True)
    return lambda: MLPNet(num_features(list(shape)), hidden, classes)


def _cnn_rebuild(ints: Callable[[str, bool], list[int]], shape: tuple[int, ...], classes: int):
    from tensorpilot.workloads.vision import CNN

    channels = ints("channels", False)
    return lambda: CNN(shape[0], channels, classes)


_DENSE = "a classifier this small gains nothing from splitting its layers"

SPECS: dict[str, WorkloadSpec] = {s.kind: s for s in (
    WorkloadSpec(kind="gpt", description="byte-level decoder-only transformer (GPT-2 style)",
                 build=_builder("gpt"), tensor_parallel=_gpt_tp, pipeline_stage=_gpt_stage,
                 planner=_gpt_planner, serving="generate", rebuild=_gpt_rebuild, bits_per_byte=True),
    WorkloadSpec(kind="mlp", description="multi-layer perceptron classifier", build=_builder("mlp"),
                 no_parallel=_DENSE, rebuild=_mlp_rebuild),
    WorkloadSpec(kind="cnn", description="residual convolutional image classifier", build=_builder("cnn"),
                 no_parallel=_DENSE, rebuild=_cnn_rebuild, input_rank=3),
)}

# any user nn.Module: trained, checkpointed, data-parallel and FSDP-sharded like the built-ins
# (its repeated blocks are found by tensorpilot.modules.repeated_blocks); tensor and pipeline
# splits need knowledge of its layers that a generic module does not give
GENERIC = WorkloadSpec(kind="custom", description="your own nn.Module (package.module:factory or tensorpilot.train)",
                       no_parallel="tensorpilot knows no split of its layers (a spec registered for the "
                                   "model could give one)")


if set(BUILTIN_MODELS) != {k for k, s in SPECS.items() if s.build is not None}:
    raise RuntimeError("config.BUILTIN_MODELS and the registered workload specs disagree")


def get(kind: str | None) -> WorkloadSpec:
    """The spec of ``kind``; the generic one for anything not registered."""
    return SPECS.get(kind or "", GENERIC)


def check_model_name(name: str) -> None:
    """A ConfigError for a plain model name no spec builds (a factory or a python: name passes)."""
    if ":" not in name and get(name).build is None:
        raise ConfigError(f"unknown model {name!r}: use {', '.join(builtin_names())} or package.module:factory.")


def builtin_names() -> tuple[str, ...]:
    """The kinds a run config can name by itself (``--model gpt``)."""
    return BUILTIN_MODELS
