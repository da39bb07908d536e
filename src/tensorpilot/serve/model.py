"""The model being served and what its inputs look like.

Weights come from safetensors only (a run's ``model.safetensors`` after its SHA-256 check, or a
file given with ``--weights``): nothing is unpickled. A run directory is untrusted data: a
built-in network (gpt, cnn, mlp) is rebuilt from the sizes its ``meta.json`` records, type-checked
and compared with the weights file before any memory is allocated; any other network is built by
the ``package.module:factory`` the user names on the command line, never by one the run names.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorpilot.errors import CheckpointError, UsageError, first_line
from tensorpilot.files import existing_path

# KServe v2 datatype names <-> torch dtype names (the subset a model input can have)
V2_DTYPES = {"FP32": "float32", "FP16": "float16", "BF16": "bfloat16", "FP64": "float64",
             "INT64": "int64", "INT32": "int32", "INT16": "int16", "INT8": "int8", "UINT8": "uint8",
             "BOOL": "bool"}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output: v2 name, v2 datatype and the shape of one sample (row).

    ``sample_shape`` entries of -1 are free (e.g. a prompt's length); ``max_dim`` bounds them."""

    name: str
    datatype: str                      # "FP32", "INT64", ...
    sample_shape: tuple[int, ...]      # without the batch dimension
    max_dim: int | None = None         # bound on free (-1) dimensions, e.g. gpt seq_len
    min_value: int | None = None       # integer inputs: allowed id range [min_value, max_value]
    max_value: int | None = None

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, *self.sample_shape]}

    @property
    def full_sample_shape(self) -> tuple[int, ...]:
        """The largest sample: free dimensions at their bound (what warm-up runs)."""
        return tuple(self.max_dim if d == -1 else d for d in self.sample_shape)


@dataclass(kw_only=True)
class ServedModel:
    name: str
    kind: str                          # a workload kind (tensorpilot.workloads.specs), or "custom"
    module: Any                        # torch.nn.Module in eval mode, on its device
    input: TensorSpec
    output: TensorSpec
    device: str = "cpu"
    source: str = ""                   # checkpoint or weights path, for the start-up line
    last_position_only: bool = False   # "generate" signature: infer returns next-token logits (B, V)

    def forward(self, x):
        """(B, *sample_shape) -> (B, *output.sample_shape); the plain fp32 model."""
        y = self.module(x)
        return y[:, -1, :] if self.last_position_only else y

    def example(self, batch: int, seed: int = 0):
        """A deterministic batch of the full sample shape, for warm-up and accuracy checks."""
        import torch

        g = torch.Generator().manual_seed(seed)
        shape = (batch, *self.input.full_sample_shape)
        if self.input.datatype == "FP32":
            return torch.randn(shape, generator=g).to(self.device)
        hi = (self.input.max_value if self.input.max_value is not None else 127) + 1
        return torch.randint(self.input.min_value or 0, hi, shape, generator=g).to(self.device)


# ---------------------------------------------------------------------------- user input

MAX_INPUT_DIMS = 8
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def _shown(value: Any, limit: int = 80) -> str:
    """repr() of a value from the user or a file, cut short: messages stay one readable line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``--input-shape 3,32,32`` -> (3, 32, 32); None when not given."""
    if text is None:
        return None
    try:
        shape = tuple(int(s) for s in text.replace("x", ",").split(",") if s.strip())
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape) or len(shape) > MAX_INPUT_DIMS:
        raise UsageError(f"--input-shape {_shown(text)} must be 1 to {MAX_INPUT_DIMS} positive integers "
                         "like 3,32,32 (one sample, without the batch dimension).")
    return shape


def check_name(name: str | None) -> None:
    if name is not None and not NAME.fullmatch(name):
        raise UsageError(f"--name {_shown(name)} must be 1-128 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit: it is part of the URL.")


def check_sample_fits(shape: tuple[int, ...], max_request_bytes: int, what: str) -> None:
    """A sample must fit in one request: every value takes at least 2 bytes of JSON ("0,"). This
    also bounds what warm-up allocates, before anything is allocated."""
    values = math.prod(shape)
    if 2 * values > max_request_bytes:
        raise UsageError(f"{what} {list(shape)} has {values:,} values per sample: one sample as JSON "
                         f"(2 or more bytes a value) would exceed --max-request-bytes "
                         f"({max_request_bytes:,}).")


# ---------------------------------------------------------------------------- a run's meta.json
# A run directory is data, possibly someone else's: meta.json says which built-in network and
# which sizes, never which code to run, and every field is type-checked before use.

_REQUIRED = object()
MAX_META_INT = 2**31 - 1      # any size field; products of two stay within int64 shapes


class _Meta:
    """Typed reads of one checkpoint's meta.json; a wrong field is one CheckpointError sentence."""

    def __init__(self, meta: dict, ckpt: Path):
        self.meta, self.ckpt = meta, ckpt

    def bad(self, where: str, expected: str, value: Any) -> CheckpointError:
        return CheckpointError(f"checkpoint {str(self.ckpt)!r} has a malformed meta.json: {where} must "
                               f"be {expected}, got {_shown(value)}.")

    def get(self, obj: dict, key: str, kind: type, where: str, default: Any = _REQUIRED) -> Any:
        if key not in obj and default is not _REQUIRED:
            return default
        value = obj.get(key)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.bad(where, {dict: "an object", str: "a string", bool: "true or false"}[kind], value)
        return value

    def positive(self, value: Any, where: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_META_INT:
            raise self.bad(where, f"a positive integer up to {MAX_META_INT}", value)
        return value

    def positives(self, value: Any, where: str, empty_ok: bool = False) -> list[int]:
        if not isinstance(value, list) or not (empty_ok or value):
            raise self.bad(where, "a list of positive integers", value)
        return [self.positive(v, f"{where}[{i}]") for i, v in enumerate(value)]

    def kind_and_name(self) -> tuple[str, str]:
        """(workload kind, model name the run recorded: a built-in kind or a factory string)."""
        wl = self.get(self.meta, "workload", dict, "workload", default={})
        model = self.get(self.get(self.meta, "config", dict, "config", default={}), "model", dict,
                         "config.model", default={})
        kind = self.get(wl, "kind", str, "workload.kind", default="custom")
        return kind, self.get(model, "name", str, "config.model.name", default=kind)


def check_one_process(run: str, ckpt: Path, meta: dict) -> None:
    from tensorpilot.training.checkpoint import require_one_process

    require_one_process(run, ckpt, meta, "serving")


def describe_run(meta: dict, ckpt: Path) -> tuple[str, str]:
    """(kind, recorded model name) of a checkpoint, type-checked (also used by deploy k8s)."""
    return _Meta(meta, ckpt).kind_and_name()


def _spec(kind: str):
    from tensorpilot.workloads import specs

    return specs.get(kind)


def _builtin(kind: str) -> bool:
    """A kind whose model tensorpilot builds itself from what the run recorded."""
    return _spec(kind).rebuild is not None


def _generator_parts(spec, m: _Meta):
    """A token model's (build, input spec, output spec): ids up to its context, next-token logits."""
    wl = m.get(m.meta, "workload", dict, "workload")
    build, gcfg = spec.rebuild(m.get(wl, spec.kind, dict, f"workload.{spec.kind}"), m.ckpt)
    spec_in = TensorSpec("input_ids", "INT64", (-1,), max_dim=gcfg.seq_len, min_value=0,
                         max_value=gcfg.vocab_size - 1)
    return build, spec_in, TensorSpec("logits", "FP32", (gcfg.vocab_size,))


def _classifier_parts(spec, m: _Meta, input_shape: tuple[int, ...] | None):
    kind = spec.kind
    wl = m.get(m.meta, "workload", dict, "workload")
    data = m.get(wl, "data", dict, "workload.data", default={})
    cfg_data = m.get(m.get(m.meta, "config", dict, "config", default={}), "data", dict, "config.data",
                     default={})
    shape = input_shape
    if shape is None:
        recorded = data.get("input_shape") or cfg_data.get("input_shape")
        if not recorded:
            raise UsageError(f"the run does not record its input shape: give --input-shape (e.g. 3,32,32) "
                             f"for this {kind} model.")
        shape = tuple(m.positives(recorded, "workload.data.input_shape"))
    classes = m.positive(data.get("classes") or cfg_data.get("num_classes"), "workload.data.classes")
    if spec.input_rank is not None and len(shape) != spec.input_rank:
        raise UsageError(f"a {kind} takes samples of {spec.input_rank} dimensions (images: C, H, W): the "
                         f"input shape {list(shape)} has {len(shape)} dimensions.")
    default = {True: [], False: None}

    def ints(key: str, empty_ok: bool) -> list[int]:
        return m.positives(wl.get(key, default[empty_ok]), f"workload.{key}", empty_ok=empty_ok)

    build = spec.rebuild(ints, tuple(shape), classes)
    return build, TensorSpec("input", "FP32", tuple(shape)), TensorSpec("logits", "FP32", (classes,))


# ---------------------------------------------------------------------------- building

def _call_factory(spec: str):
    """The module the user's ``package.module:factory`` (named on the command line) returns."""
    from torch import nn

    from tensorpilot.workloads.base import Workload
    from tensorpilot.workloads.registry import call_factory

    made = call_factory(spec)                  # its import or call failing is one sentence
    if isinstance(made, Workload):
        made = made.model
    if not isinstance(made, nn.Module):
        raise UsageError(f"{spec} must return an nn.Module or a tensorpilot.Workload, got {type(made).__name__}.")
    return made


def _output_spec(module, spec_in: TensorSpec, device: str) -> TensorSpec:
    """Run one example row to learn the output's per-sample shape (custom models)."""
    import torch

    x = torch.zeros((1, *spec_in.full_sample_shape), dtype=getattr(torch, V2_DTYPES[spec_in.datatype]),
                    device=device)
    try:
        with torch.inference_mode():
            y = module(x)
    except Exception as exc:
        raise UsageError(f"the model does not accept inputs of shape {list(x.shape)}: "
                         f"{first_line(exc)} (check --input-shape).") from None
    if not isinstance(y, torch.Tensor) or y.dim() < 1 or y.shape[0] != 1:
        raise UsageError("the model must return one tensor whose first dimension is the batch.")
    return TensorSpec("output", "FP32", tuple(y.shape[1:]))


def _is_factory(name: str) -> bool:
    return ":" in name and not name.startswith("python:")


def check_factory(run: str, kind: str, recorded: str, factory: str | None) -> None:
    """The user's --model against the run's kind: required for a run of a custom model (the run
    only names its factory), refused for a built-in one, and never different from the factory the
    run recorded (its weights were trained for that one)."""
    if _builtin(kind):
        if factory:
            raise UsageError(f"--model is for runs of your own model; {run!r} is a run of the built-in "
                             f"{kind} model: leave --model out.")
        return
    if not factory:
        raise UsageError(f"{run!r} is a run of your own model (it records {_shown(recorded)}): give its "
                         "factory with --model package.module:factory; a run directory never decides "
                         "which code runs.")
    if _is_factory(recorded) and recorded != factory:
        raise UsageError(f"--model {factory} is not the factory this run was trained with "
                         f"({_shown(recorded)}); give that factory if it is the code you mean to run.")


def _run_checkpoint(run: str, factory: str | None, shape: tuple[int, ...] | None) -> tuple[Path, _Meta, str]:
    """(checkpoint directory, its meta.json, kind) of ``--run``, with --model and --input-shape
    checked against it: no torch needed yet."""
    from tensorpilot.training import checkpoint as ckpt_io

    ckpt = ckpt_io.find_checkpoint(existing_path(run, "--run", kind="dir"))
    m = _Meta(ckpt_io.read_meta(ckpt), ckpt)
    check_one_process(run, ckpt, m.meta)
    kind, recorded = m.kind_and_name()
    check_factory(run, kind, recorded, factory)
    if _spec(kind).serving == "generate" and shape is not None:
        raise UsageError(f"--input-shape does not apply to a {kind} run: it takes token ids up to its "
                         "context length.")
    return ckpt, m, kind


def _from_run(run: str, factory: str | None, shape: tuple[int, ...] | None):
    """(module with its weights, kind, model name, input spec or None, output spec or None, source)."""
    from tensorpilot.training import checkpoint as ckpt_io

    ckpt, m, kind = _run_checkpoint(run, factory, shape)
    meta = m.meta
    spec = _spec(kind)
    if _builtin(kind):
        build, spec_in, spec_out = _generator_parts(spec, m) if spec.serving == "generate" \
            else _classifier_parts(spec, m, shape)
        ckpt_io.verify(ckpt, meta)
        # built for real only once every shape matches model.safetensors' header: a doctored size
        # in meta.json ends here, before anything is allocated
        try:
            module = ckpt_io.build_checked(ckpt, build)
        except (RuntimeError, ValueError, TypeError, OverflowError) as exc:   # sizes torch refuses
            raise CheckpointError(f"checkpoint {str(ckpt)!r}: the model its meta.json describes cannot be "
                                  f"built ({first_line(exc)}).") from None
        model_name = kind
    else:
        ckpt_io.verify(ckpt, meta)
        module, spec_in, spec_out, model_name = _call_factory(factory), None, None, factory
    ckpt_io.load_weights(ckpt, module)
    return module, kind, model_name, spec_in, spec_out, str(ckpt)


def _from_weights(factory: str, weights: str):
    from safetensors import safe_open
    from safetensors.torch import load_model

    path = existing_path(weights, "--weights", kind="file")
    try:
        with safe_open(str(path), framework="pt") as fh:
            fh.keys()
    except Exception as exc:                   # safetensors raises its own types for a bad header
        raise CheckpointError(f"--weights {weights!r} is not a readable safetensors file "
                              f"({first_line(exc)}); weights are read from safetensors only, "
                              "never unpickled.") from None
    module = _call_factory(factory)
    try:
        load_model(module, str(path), strict=True)
    except Exception as exc:
        detail = " ".join(str(exc).split())[:300]        # torch's message spans lines
        raise CheckpointError(f"weights {weights!r} do not fit this model: {detail}") from None
    return module


def _factory_input(module, shape: tuple[int, ...] | None, input_dtype: str) -> TensorSpec:
    if shape is None:
        attr = getattr(module, "input_shape", None)
        if attr is None:
            raise UsageError("give --input-shape (one sample, e.g. 3,32,32) for a model built by a factory.")
        shape = parse_shape(",".join(map(str, attr)) if isinstance(attr, (list, tuple)) else str(attr))
    return TensorSpec("input", input_dtype, tuple(shape))


def check_options(run: str | None = None, factory: str | None = None, weights: str | None = None,
                  input_shape: str | None = None, input_dtype: str = "FP32", name: str | None = None,
                  max_request_bytes: int | None = None) -> tuple[int, ...] | None:
    """Every check that needs no model (run before torch is even imported); returns the parsed
    input shape."""
    shape = parse_shape(input_shape)
    if input_dtype not in ("FP32", "INT64"):
        raise UsageError(f"--input-dtype must be FP32 or INT64, got {_shown(input_dtype)}.")
    check_name(name)
    if shape is not None and max_request_bytes:
        check_sample_fits(shape, max_request_bytes, "--input-shape")
    if factory is not None and not FACTORY.fullmatch(factory):
        raise UsageError(f"--model {_shown(factory)} must look like package.module:factory.")
    if run:
        if weights:
            raise UsageError("--weights is for --model without --run: a run's weights are its checkpoint's "
                             "model.safetensors.")
        _run_checkpoint(run, factory, shape)
    elif factory:
        if not weights:
            raise UsageError("--model package.module:factory needs --weights FILE.safetensors, or --run "
                             "DIR of a run trained with it.")
        existing_path(weights, "--weights", kind="file")
    else:
        raise UsageError("give --run DIR or --model package.module:factory --weights FILE.safetensors.")
    return shape


def load(run: str | None = None, factory: str | None = None, weights: str | None = None,
         input_shape: str | None = None, input_dtype: str = "FP32", device: str = "cpu",
         name: str | None = None, max_request_bytes: int | None = None) -> ServedModel:
    """Build the model from a run directory (or checkpoint directory; a custom model's factory
    comes from ``factory``, never from the run), or from a factory + safetensors weights.
    ``max_request_bytes``: refuse input shapes no request of that size could carry."""
    shape = check_options(run, factory, weights, input_shape, input_dtype, name, max_request_bytes)
    fits = (lambda s, what: check_sample_fits(s, max_request_bytes, what)) if max_request_bytes else \
        (lambda s, what: None)
    if run:
        module, kind, model_name, spec_in, spec_out, source = _from_run(run, factory, shape)
    else:
        module = _from_weights(factory, weights)
        kind, model_name, spec_in, spec_out, source = "custom", factory, None, None, weights
    module = module.to(device).eval()
    if spec_in is None:
        spec_in = _factory_input(module, shape, input_dtype)
        fits(spec_in.full_sample_shape, "the input shape")
        spec_out = _output_spec(module, spec_in, device)
    else:
        fits(spec_in.full_sample_shape, "the run's input shape")
    return ServedModel(name=name or default_model_name(model_name, kind), kind=kind, module=module,
                       input=spec_in, output=spec_out, device=device, source=source,
                       last_position_only=_spec(kind).serving == "generate")


def default_model_name(model_name: str, kind: str) -> str:
    """A URL-safe model name: 'cnn', 'gpt', or the factory's function name."""
    base = model_name.rsplit(":", 1)[-1] if ":" in model_name else model_name or kind
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "-" for c in base)[:128].strip("-._")
    return cleaned or "model"


def numel(shape) -> int:
    return math.prod(shape)
