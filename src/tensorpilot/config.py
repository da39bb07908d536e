"""Run configuration: one small dataclass per component, composed into :class:`RunConfig`.

Precedence, lowest first: field defaults < model size preset < ``--config run.toml`` < command
line. Every field's ``doc`` becomes its ``--help`` text, and every field is reachable from the
command line as ``--section.field`` (e.g. ``--optim.lr 1e-3``), the way torchtitan's job config
works. Validation runs before anything heavy is imported, so a bad value costs no time.

Pure standard library: importing this module must not import torch.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tensorpilot.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


def _f(default: Any, doc: str, **kw: Any) -> Any:
    """A dataclass field whose ``doc`` is its --help text."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"doc": doc, **kw})
    return field(default=default, metadata={"doc": doc, **kw})


# Bounds on settings whose absurd values would exhaust the machine instead of failing
MAX_WORKERS = 256                 # DataLoader processes (each a copy of the dataset's process)
MAX_PROCESSES = 4096              # processes per node, and tp / pp degrees
MAX_TIMEOUT_S = 7 * 86400.0       # a week; timedelta and the backends' millisecond counters overflow far above
MAX_BUCKET_MB = 65536.0           # DDP's bucket size is a C++ int64 of bytes
MAX_SEED = 2**63 - 1              # torch.manual_seed takes a 64-bit integer
MAX_EVAL_BATCHES = 1_000_000      # per evaluation; more would outlast any training run
MAX_GRAD_ACCUM = 65_536           # micro-batches per step (published runs use up to a few hundred)
MAX_DIM = 2**24                   # widths and lengths; the planner's bound (plan/limits.py)
MAX_GRID_G_PER_KWH = 1e4          # g CO2/kWh; the dirtiest grids emit ~1,100 (the planner's bound, plan/limits.py)

# the workloads a config names by themselves; each has its spec in tensorpilot.workloads.specs
# (which checks at import that the two agree)
BUILTIN_MODELS = ("gpt", "mlp", "cnn")

PrecisionName = Literal["auto", "fp32", "tf32", "bf16", "fp16"]
Switch = Literal["auto", "on", "off"]


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    name: str = _f("gpt", "Workload: gpt, mlp, cnn, or package.module:factory for your own model.")
    size: str = _f("tiny", "Size preset of the built-in model (gpt: tiny, small, medium, large; "
                   "mlp/cnn: tiny, small, medium).")
    n_layer: int | None = _f(None, "gpt: number of transformer blocks (default: from --size).")
    n_head: int | None = _f(None, "gpt: attention heads (default: from --size).")
    d_model: int | None = _f(None, "gpt: embedding width (default: from --size).")
    seq_len: int | None = _f(None, "gpt: context length in bytes (default: from --size).")
    tie_head: bool = _f(True, "gpt: share the output head's weights with the token embedding.")
    dropout: float = _f(0.0, "Dropout probability (gpt).")
    hidden: list[int] = _f([], "mlp: hidden widths, comma separated (default: from --size).")
    channels: list[int] = _f([], "cnn: channels per stage, comma separated (default: from --size).")

    def validate(self) -> None:
        for key in ("n_layer", "n_head", "d_model", "seq_len"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise ConfigError(f"model.{key} must be a positive integer, got {value}.")
        if self.n_head and self.d_model and self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head}).")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}.")
        for key in ("n_layer", "n_head", "d_model", "seq_len"):
            value = getattr(self, key)
            if value is not None and value > MAX_DIM:
                raise ConfigError(f"model.{key} must be at most {MAX_DIM:,}, got {value:,}.")
        if any(not 0 < w <= MAX_DIM for w in self.hidden + self.channels):
            raise ConfigError(f"model.hidden and model.channels must hold integers from 1 to {MAX_DIM:,}.")
        if self.name not in BUILTIN_MODELS and ":" not in self.name:
            raise ConfigError(
                f"unknown model {self.name!r}: use {', '.join(BUILTIN_MODELS)} or package.module:factory.")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    path: str | None = _f(None, "Training data. gpt: a text file or a directory of text files "
                          "(default: the Python standard library's source). mlp/cnn: a .pt, .npz "
                          "or .npy file of inputs (default: synthetic data).")
    targets_path: str | None = _f(None, "mlp/cnn with a .npy inputs file: the .npy file of "
                                  "integer class targets.")
    batch_size: int = _f(32, "Micro-batch size: samples per forward/backward pass.")
    num_workers: int = _f(0, "DataLoader worker processes (0: load in the training process).")
    val_fraction: float = _f(0.05, "Share of the data held out for validation (by file for text).")
    max_bytes: int = _f(16_000_000, "gpt: read at most this many bytes of text (keeps start-up "
                        "fast on big corpora).")
    input_shape: list[int] = _f([], "mlp/cnn synthetic data: shape of one input (default: "
                                "[256] for mlp, [3, 32, 32] for cnn).")
    num_classes: int = _f(10, "mlp/cnn synthetic data: number of classes.")
    synthetic_samples: int = _f(50_000, "mlp/cnn synthetic data: size of the training set.")

    def validate(self) -> None:
        if self.batch_size <= 0:
            raise ConfigError(f"data.batch_size must be a positive integer, got {self.batch_size}.")
        if not 0 <= self.num_workers <= MAX_WORKERS:
            raise ConfigError(f"data.num_workers must be between 0 and {MAX_WORKERS}, got {self.num_workers}.")
        if not 0.0 < self.val_fraction < 0.5:
            raise ConfigError(f"data.val_fraction must be in (0, 0.5), got {self.val_fraction}.")
        if self.max_bytes <= 0 or self.synthetic_samples <= 0 or self.num_classes < 2:
            raise ConfigError("data.max_bytes and data.synthetic_samples must be positive and "
                              "data.num_classes at least 2.")
        if any(not 0 < d <= MAX_DIM for d in self.input_shape):
            raise ConfigError(f"data.input_shape must hold integers from 1 to {MAX_DIM:,}.")
        for key in ("path", "targets_path"):
            value = getattr(self, key)
            if value is not None:
                from tensorpilot.files import existing_path

                p = existing_path(value, f"data.{key}", "file" if key == "targets_path" else "any")
                if p.is_file() and p.stat().st_size == 0:
                    raise ConfigError(f"data.{key} {value!r} is empty.")


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    name: Literal["adamw", "adafactor", "adamw8bit"] = _f(
        "adamw", "Optimizer: adamw (8 bytes of state per parameter), adafactor (factored second "
        "moment: a few bytes per matrix row, torch.optim.Adafactor) or adamw8bit (~2 bytes per "
        "parameter, torchao; pip install 'tensorpilot[lowbit]').")
    lr: float = _f(3e-3, "Peak learning rate.")
    min_lr_ratio: float = _f(0.1, "Cosine schedule floor as a fraction of the peak rate.")
    warmup_steps: int = _f(50, "Linear warm-up steps before the cosine decay.")
    weight_decay: float = _f(0.1, "Decoupled weight decay, applied to matrices only "
                             "(not to biases, norms).")
    betas: list[float] = _f([0.9, 0.95], "AdamW betas, comma separated.")
    grad_clip: float = _f(1.0, "Clip the global gradient norm to this value (0: off).")
    impl: Literal["auto", "fused", "foreach", "loop"] = _f(
        "auto", "AdamW implementation: fused where the device supports it, else foreach.")
    freeze: list[str] = _f([], "Freeze parameters whose name matches any of these glob patterns "
                           "(comma separated, e.g. 'tok_emb.*,blocks.0.*').")

    def validate(self) -> None:
        if not 0 < self.lr <= 1e3:       # finite: coerce refuses nan and inf
            raise ConfigError(f"optim.lr must be positive (and at most 1000), got {self.lr}.")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}.")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError("optim.warmup_steps, optim.weight_decay and optim.grad_clip "
                              "must not be negative.")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {self.betas}.")


@dataclass(kw_only=True, slots=True)
class EngineConfig:
    precision: PrecisionName = _f("auto", "Numeric precision: auto picks what the device does "
                                  "fast (bf16 on AVX512-BF16/AMX CPUs and Ampere+ GPUs, fp16 with "
                                  "loss scaling on older CUDA GPUs, else fp32).")
    compile: Switch = _f("auto", "torch.compile the model: auto compiles when the run is long "
                         "enough to repay compilation; falls back to eager if compilation fails.")
    activation_checkpointing: bool = _f(False, "Recompute each block's activations in backward "
                                        "(less memory, ~1/3 more compute).")
    grad_accum: int = _f(1, "Micro-batches accumulated per optimizer step.")
    attention: Literal["auto", "sdpa", "blocked"] = _f(
        "auto", "Where the model's F.scaled_dot_product_attention calls run: auto times PyTorch's "
        "kernel against blocked matmuls per call shape and keeps the faster; sdpa leaves the calls "
        "alone; blocked uses blocked matmuls wherever they compute the call exactly.")
    optimize: Literal["off", "auto"] = _f(
        "off", "auto: choose precision, micro-batch x accumulation (at the global batch "
        "data.batch_size x grad_accum), activation checkpointing and compilation by prediction, "
        "then brief measured trials; see docs/autotune.md.")
    tune_budget: float = _f(0.0, "optimize=auto: seconds the trials may take (0: a tenth of the run "
                            "at the first trial's speed).")
    tune_cache: bool = _f(True, "optimize=auto: reuse the choice cached for this model, batch "
                          "and machine instead of trying again.")
    retain_host_memory: bool = _f(True, "CPU training on Linux: glibc malloc keeps freed memory for "
                                  "reuse instead of returning it to the OS (saves a page fault per "
                                  "4 KiB of activations each step; the process keeps its peak memory).")

    def validate(self) -> None:
        if not 0 < self.grad_accum <= MAX_GRAD_ACCUM:    # the step holds its micro-batches at once
            raise ConfigError(f"engine.grad_accum must be an integer from 1 to {MAX_GRAD_ACCUM:,}, "
                              f"got {self.grad_accum:,}.")
        if self.tune_budget < 0:
            raise ConfigError(f"engine.tune_budget must not be negative, got {self.tune_budget}.")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    steps: int = _f(500, "Optimizer steps to train for.")
    device: str = _f("auto", "Device: auto (cuda > mps > xpu > cpu), or cpu, cuda, cuda:1, mps, xpu.")
    seed: int = _f(1337, "Seed for initialisation and data order.")
    eval_interval: int = _f(100, "Evaluate on the validation split every N steps (and at the end).")
    eval_batches: int = _f(16, "Validation micro-batches per evaluation.")
    log_interval: int = _f(10, "Write metrics every N steps.")
    max_bad_steps: int = _f(5, "Stop after this many consecutive steps with non-finite "
                            "loss or gradients (each is skipped).")
    deterministic: bool = _f(False, "Use deterministic algorithms (slower on GPU).")
    memory_check: bool = _f(True, "Before allocating the model, estimate the run's memory (weights, "
                            "gradients, optimizer state, one micro-batch's activations) and stop with "
                            "a message if it exceeds what the device has free; off to try anyway.")
    predict: bool = _f(True, "Trace the step before training and put the planner's step time and peak "
                       "memory beside the measured ones (summary.json 'predicted'); the measured ratios "
                       "refit this machine's planner calibration (`tensorpilot plan calibration`).")
    grid_intensity: float | None = _f(None, "Carbon intensity of the electricity grid in g CO2 per kWh "
                                      "(your region's figure, e.g. 400); summary.json then gives co2_g "
                                      "for the run's energy (docs/energy.md).")

    def validate(self) -> None:
        if self.grid_intensity is not None and not 0 <= self.grid_intensity <= MAX_GRID_G_PER_KWH:
            raise ConfigError(f"train.grid_intensity must be from 0 to {MAX_GRID_G_PER_KWH:,.0f} g CO2 per "
                              f"kWh, got {self.grid_intensity:g}.")
        if self.steps <= 0:
            raise ConfigError(f"train.steps must be a positive integer, got {self.steps}.")
        for key in ("eval_interval", "eval_batches", "log_interval", "max_bad_steps"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"train.{key} must be a positive integer, got {getattr(self, key)}.")
        if self.eval_batches > MAX_EVAL_BATCHES:          # validation sets of the built-ins are endless
            raise ConfigError(f"train.eval_batches must be at most {MAX_EVAL_BATCHES:,}, got {self.eval_batches:,}.")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"train.seed must be between 0 and 2**63 - 1, got {self.seed}.")
        check_device_name(self.device)


def check_device_name(name: str) -> None:
    """A device name torch and tensorpilot take, or one sentence (train, generate, serve)."""
    if not re.fullmatch(r"(auto|mps)|(cpu|cuda|xpu)(:\d{1,4})?", name):
        raise ConfigError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N, mps, xpu or xpu:N.")


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    interval: int = _f(250, "Save a checkpoint every N steps (and at the end).")
    keep: int = _f(2, "Keep the newest N checkpoints (older ones are deleted after a save succeeds).")
    enabled: bool = _f(True, "Write checkpoints at all.")

    def validate(self) -> None:
        if self.interval <= 0 or self.keep <= 0:
            raise ConfigError("checkpoint.interval and checkpoint.keep must be positive integers.")


@dataclass(kw_only=True, slots=True)
class LoggingConfig:
    tensorboard: bool = _f(True, "Write TensorBoard event files under <run-dir>/tensorboard.")
    progress: Literal["auto", "bar", "lines", "off"] = _f(
        "auto", "Progress display: a live bar on a terminal, periodic lines otherwise.")

    def validate(self) -> None:
        pass


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """How one run is spread over processes (layout) and how those processes are launched.
    The layout names (dp, tp, pp, sharding) are the planner's; see docs/distributed.md."""

    dp: int = _f(0, "Data-parallel degree (0: all processes not used by tp x pp).")
    tp: int = _f(1, "Tensor-parallel degree (built-in gpt: column/row-wise DTensor plan).")
    pp: int = _f(1, "Pipeline-parallel degree: the gpt's blocks split into this many stages.")
    sharding: Literal["ddp", "fsdp"] = _f(
        "ddp", "Data parallelism: ddp replicates the model and all-reduces gradients in buckets; "
        "fsdp shards parameters, gradients and optimizer state per block (FSDP2 fully_shard).")
    reshard_after_forward: bool = _f(True, "fsdp: free gathered parameters after forward "
                                     "(less memory, one more all-gather in backward).")
    param_dtype: Literal["auto", "fp32", "bf16", "fp16"] = _f(
        "auto", "fsdp: dtype parameters are gathered and computed in (auto: the run's precision); "
        "gradients are reduced in fp32.")
    cpu_offload: bool = _f(False, "fsdp: keep sharded parameters and optimizer state in host memory.")
    sequence_parallel: bool = _f(False, "tp: also shard LayerNorm/dropout activations along the sequence.")
    pp_schedule: Literal["gpipe", "1f1b"] = _f("1f1b", "pp: pipeline schedule.")
    pp_microbatches: int = _f(0, "pp: micro-batches per batch (0: twice the stages); must divide "
                              "data.batch_size.")
    bucket_mb: float = _f(25.0, "ddp: gradient bucket size in MiB (all-reduce overlaps backward per bucket).")
    timeout_s: float = _f(300.0, "Seconds a collective or the rendezvous may wait before the run "
                          "stops with an error instead of hanging.")
    nproc: int = _f(1, "Processes per node; above 1, train re-launches itself through torchrun.")
    nnodes: str = _f("1", "Nodes (or MIN:MAX for elastic runs).")
    node_rank: int = _f(0, "This node's rank (static rendezvous without --rdzv-endpoint).")
    rdzv_endpoint: str = _f("", "Rendezvous host:port shared by all nodes (default: this host, a free port).")
    max_restarts: int = _f(0, "Restart the whole group this many times after a worker fails; each "
                           "restart resumes from the newest checkpoint.")

    def validate(self) -> None:
        for key in ("tp", "pp", "nproc"):
            if not 0 < getattr(self, key) <= MAX_PROCESSES:
                raise ConfigError(f"parallel.{key} must be an integer from 1 to {MAX_PROCESSES}, "
                                  f"got {getattr(self, key)}.")
        if self.dp < 0 or self.pp_microbatches < 0 or self.max_restarts < 0 or self.node_rank < 0:
            raise ConfigError("parallel.dp, parallel.pp_microbatches, parallel.max_restarts and "
                              "parallel.node_rank must not be negative.")
        if not 1 <= self.timeout_s <= MAX_TIMEOUT_S:     # torchrun takes whole seconds
            raise ConfigError(f"parallel.timeout_s must be from 1 to {MAX_TIMEOUT_S:g} seconds "
                              f"(a week), got {self.timeout_s:g}.")
        if not 0 < self.bucket_mb <= MAX_BUCKET_MB:
            raise ConfigError(f"parallel.bucket_mb must be positive and at most {MAX_BUCKET_MB:g}, "
                              f"got {self.bucket_mb:g}.")
        lo, _, hi = self.nnodes.partition(":")
        if not (re.fullmatch(r"\d{1,6}", lo) and int(lo) > 0
                and (not hi or (re.fullmatch(r"\d{1,6}", hi) and int(hi) >= int(lo)))):
            raise ConfigError(f"parallel.nnodes must be N or MIN:MAX, got {self.nnodes!r}.")
        if self.node_rank >= int((hi or lo)):
            raise ConfigError(f"parallel.node_rank must be below the number of nodes ({hi or lo}), "
                              f"got {self.node_rank}.")
        if self.rdzv_endpoint and not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:\d{1,5}", self.rdzv_endpoint):
            raise ConfigError(f"parallel.rdzv_endpoint must be HOST:PORT, got {self.rdzv_endpoint!r}.")


@dataclass(kw_only=True, slots=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    run_dir: str | None = _f(None, "Run directory (default: a new directory under runs/).")
    resume: str | None = _f(None, "Continue from the newest checkpoint of a run directory, or "
                            "from one checkpoint directory.")

    def validate(self) -> RunConfig:
        for section in SECTIONS:
            getattr(self, section).validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = ("model", "data", "optim", "engine", "train", "checkpoint", "logging", "parallel")


# ---------------------------------------------------------------------------------------------
# Typed conversion shared by TOML and the command line.

def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _kind(value: Any) -> str:
    """How a TOML value reads to a user: 'a list', 'a table', 'a date', ..."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (datetime.date, datetime.time)):   # datetime is a date too
        return "a date or time"
    return repr(value)


def _integer(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                number = float(value)               # accept "1e3"
            except ValueError:
                number = math.nan
            if math.isfinite(number) and number.is_integer():
                return int(number)
    raise ValueError(f"expected an integer, got {_kind(value)}")


def _number(value: Any) -> float:
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            number = float(value)
        except (ValueError, OverflowError):
            raise ValueError(f"expected a number, got {_kind(value)}") from None
        if not math.isfinite(number):               # nan/inf never make sense as a setting
            raise ValueError(f"expected a finite number, got {_kind(value)}")
        return number
    raise ValueError(f"expected a number, got {_kind(value)}")


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert a TOML value or command-line string to the field type ``tp``, or raise ConfigError."""
    tp, optional = _strip_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() == "none"):
        if optional:
            return None
        raise ConfigError(f"{where} must not be empty.")
    origin = typing.get_origin(tp)
    try:
        if origin is Literal:
            choices = typing.get_args(tp)
            if not isinstance(value, (str, bool)):
                raise ValueError(f"expected one of {', '.join(choices)}, got {_kind(value)}")
            text = str(value).lower() if not isinstance(value, bool) else ("on" if value else "off")
            if text not in choices:
                raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
            return text
        if origin is list:
            (item_tp,) = typing.get_args(tp)
            if not isinstance(value, (str, list, tuple)):
                raise ValueError(f"expected a list (comma separated on the command line), got {_kind(value)}")
            items = value.split(",") if isinstance(value, str) else list(value)
            items = [i.strip() if isinstance(i, str) else i for i in items]
            return [coerce(i, item_tp, where) for i in items if i != ""]
        if tp is bool:
            if isinstance(value, bool):
                return value
            if not isinstance(value, str):
                raise ValueError(f"expected true or false, got {_kind(value)}")
            return _parse_bool(value)
        if tp is int:
            return _integer(value)
        if tp is float:
            return _number(value)
        if tp is str:
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError(f"expected a string, got {_kind(value)}")
            text = str(value)
            if any(c in text for c in "\x00\n\r"):
                raise ValueError("expected one line of text, got a line break or a NUL character")
            return text
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}.") from None
    raise TypeError(f"unsupported config type {tp!r} for {where}")  # a bug, not user input


def _apply(section_obj: Any, values: dict[str, Any], where: str) -> None:
    hints = _hints(type(section_obj))
    names = {f.name for f in dataclasses.fields(section_obj)}
    for key, value in values.items():
        if key not in names:
            raise ConfigError(f"unknown setting {where}{key!r}; see `tensorpilot train --help`.")
        setattr(section_obj, key, coerce(value, hints[key], f"{where}{key}"))


def load_toml(path: str | Path) -> dict[str, Any]:
    from tensorpilot.files import read_text

    text = read_text(path, "config file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}.") from None
    except RecursionError:
        raise ConfigError(f"config file {str(path)!r} is nested too deeply.") from None


def apply_mapping(cfg: RunConfig, data: dict[str, Any], source: str = "") -> RunConfig:
    """Apply a nested mapping ({section: {key: value}, run_dir: ..., resume: ...}) onto ``cfg``."""
    top_hints = _hints(RunConfig)
    for key, value in data.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{source}[{key}] must be a table of settings.")
            _apply(getattr(cfg, key), value, f"{source}{key}.")
        elif key in ("run_dir", "resume"):
            setattr(cfg, key, coerce(value, top_hints[key], f"{source}{key}"))
        else:
            raise ConfigError(f"unknown setting {source}{key!r}; sections are {', '.join(SECTIONS)}.")
    return cfg


def overrides_to_mapping(overrides: dict[str, Any]) -> dict[str, Any]:
    """{'optim.lr': 1e-3, 'run_dir': 'x'} -> {'optim': {'lr': 1e-3}, 'run_dir': 'x'}."""
    nested: dict[str, Any] = {}
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        if key:
            nested.setdefault(section, {})[key] = value
        else:
            nested[section] = value
    return nested


def field_docs() -> list[tuple[str, str, Any, Any]]:
    """(dotted name, doc, type, default) of every setting, for --help and the docs."""
    out = []
    for section in SECTIONS:
        cls = _hints(RunConfig)[section]
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out.append((f"{section}.{f.name}", f.metadata.get("doc", ""), hints[f.name], default))
    return out


_TOML_ESCAPES = {"\\": "\\\\", '"': '\\"'}


def to_toml(cfg: RunConfig) -> str:
    """The effective configuration as TOML that `--config` reads back."""

    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):     # a TOML basic string: control characters as \\uXXXX
            return '"' + "".join(_TOML_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 or c == "\x7f"
                                                          else c) for c in v) + '"'
        if isinstance(v, list):
            return "[" + ", ".join(fmt(i) for i in v) + "]"
        return repr(v)

    lines = []
    for key in ("run_dir", "resume"):
        value = getattr(cfg, key)
        lines.append(f"{key} = {fmt(value)}" if value is not None else f"# {key} = (unset)")
    for section in SECTIONS:
        lines.append(f"\n[{section}]")
        for f in dataclasses.fields(getattr(cfg, section)):
            value = getattr(getattr(cfg, section), f.name)
            lines.append(f"{f.name} = {fmt(value)}" if value is not None
                         else f"# {f.name} = (from preset)")
    return "\n".join(lines) + "\n"
