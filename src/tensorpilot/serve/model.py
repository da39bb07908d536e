"""The model being served and what its inputs look like.

Weights come from safetensors only (a run's ``model.safetensors`` after its SHA-256 check, or a
file given with ``--weights``): nothing is unpickled. The network is rebuilt from the run's
``meta.json`` (built-in workloads) or by calling the user's ``package.module:factory``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorpilot.errors import CheckpointError, UsageError

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
    kind: str                          # "gpt" | "cnn" | "mlp" | "custom"
    module: Any                        # torch.nn.Module in eval mode, on its device
    input: TensorSpec
    output: TensorSpec
    device: str = "cpu"
    source: str = ""                   # checkpoint or weights path, for the start-up line
    last_position_only: bool = False   # gpt: infer returns next-token logits (B, V), not (B, T, V)

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


# ---------------------------------------------------------------------------- building

def _parse_shape(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        shape = tuple(int(s) for s in text.replace("x", ",").split(",") if s.strip())
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise UsageError(f"--input-shape {text!r} must be positive integers like 3,32,32.")
    return shape


def _classifier_specs(shape: list[int] | tuple[int, ...], classes: int) -> tuple[TensorSpec, TensorSpec]:
    return (TensorSpec("input", "FP32", tuple(shape)), TensorSpec("logits", "FP32", (classes,)))


def _build_builtin(kind: str, meta: dict, input_shape: tuple[int, ...] | None):
    """(module, input spec, output spec) of a built-in workload from its checkpoint meta."""
    wl = meta.get("workload", {})
    cfg = meta.get("config", {})
    if kind == "gpt":
        from tensorpilot.workloads.gpt import GPT, GPTConfig

        gcfg = GPTConfig(**wl["gpt"])
        spec_in = TensorSpec("input_ids", "INT64", (-1,), max_dim=gcfg.seq_len, min_value=0,
                             max_value=gcfg.vocab_size - 1)
        return GPT(gcfg), spec_in, TensorSpec("logits", "FP32", (gcfg.vocab_size,))
    data = wl.get("data", {})
    shape = input_shape or data.get("input_shape") or cfg.get("data", {}).get("input_shape") or None
    classes = data.get("classes") or cfg.get("data", {}).get("num_classes")
    if not shape or not classes:
        raise UsageError(f"the run does not record its input shape or class count: give --input-shape "
                         f"(e.g. 3,32,32) for this {kind} model.")
    if kind == "cnn":
        from tensorpilot.workloads.vision import CNN

        return CNN(shape[0], wl["channels"], classes), *_classifier_specs(shape, classes)
    from tensorpilot.workloads.vision import MLPNet, num_features

    return MLPNet(num_features(shape), wl["hidden"], classes), *_classifier_specs(shape, classes)


def _call_factory(spec: str):
    from torch import nn

    from tensorpilot.workloads.base import Workload
    from tensorpilot.workloads.registry import load_factory

    made = load_factory(spec)()
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
                         f"{str(exc).splitlines()[0][:200]} (check --input-shape).") from None
    if not isinstance(y, torch.Tensor) or y.dim() < 1 or y.shape[0] != 1:
        raise UsageError("the model must return one tensor whose first dimension is the batch.")
    return TensorSpec("output", "FP32", tuple(y.shape[1:]))


def load(run: str | None = None, factory: str | None = None, weights: str | None = None,
         input_shape: str | None = None, input_dtype: str = "FP32", device: str = "cpu",
         name: str | None = None) -> ServedModel:
    """Build the model from a run directory (or checkpoint directory), or from a factory + weights."""
    import torch

    from tensorpilot.training import checkpoint as ckpt_io

    shape = _parse_shape(input_shape)
    if input_dtype not in ("FP32", "INT64"):
        raise UsageError(f"--input-dtype must be FP32 or INT64, got {input_dtype!r}.")
    if run and factory:
        raise UsageError("give either --run or --model/--weights, not both.")
    if run:
        ckpt = ckpt_io.find_checkpoint(run)
        meta = ckpt_io.read_meta(ckpt)
        kind = meta.get("workload", {}).get("kind", "custom")
        model_name = meta.get("config", {}).get("model", {}).get("name", kind)
        if kind in ("gpt", "cnn", "mlp"):
            module, spec_in, spec_out = _build_builtin(kind, meta, shape)
        elif ":" in model_name and not model_name.startswith("python:"):
            module, spec_in, spec_out = _call_factory(model_name), None, None
        else:
            raise UsageError(f"the run's model ({model_name}) was passed to the Python API as an object and "
                             "cannot be rebuilt: serve it with --model package.module:factory --weights "
                             f"{ckpt / 'model.safetensors'}.")
        ckpt_io.verify(ckpt, meta)
        ckpt_io.load_weights(ckpt, module)
        source = str(ckpt)
    elif factory:
        if not weights:
            raise UsageError("--model package.module:factory needs --weights FILE.safetensors.")
        if not Path(weights).is_file():
            raise CheckpointError(f"weights file {weights!r} does not exist.")
        module, spec_in, spec_out = _call_factory(factory), None, None
        from safetensors.torch import load_model

        try:
            load_model(module, weights, strict=True)
        except Exception as exc:
            raise CheckpointError(f"weights {weights!r} do not fit this model: "
                                  f"{str(exc).splitlines()[0][:300]}.") from None
        kind, model_name, source = "custom", factory, weights
    else:
        raise UsageError("give --run DIR or --model package.module:factory --weights FILE.safetensors.")
    module = module.to(device).eval()
    if spec_in is None:
        shape = shape or getattr(module, "input_shape", None)
        if not shape:
            raise UsageError("give --input-shape (one sample, e.g. 3,32,32) for a model built by a factory.")
        spec_in = TensorSpec("input", input_dtype, tuple(shape))
        spec_out = _output_spec(module, spec_in, device)
    served_name = name or _default_name(model_name, kind)
    return ServedModel(name=served_name, kind=kind, module=module, input=spec_in, output=spec_out,
                       device=device, source=source, last_position_only=(kind == "gpt"))


def _default_name(model_name: str, kind: str) -> str:
    """A URL-safe model name: 'cnn', 'gpt', or the factory's function name."""
    base = model_name.rsplit(":", 1)[-1] if ":" in model_name else model_name or kind
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in base)
    return cleaned or "model"


def numel(shape) -> int:
    return math.prod(shape)
