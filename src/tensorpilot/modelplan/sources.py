"""Where the planner's model comes from, and what one micro-batch and its loss look like.

  gpt | mlp | cnn          the built-in workloads at their default sizes
  PKG.MOD:FACTORY          a user's factory (no arguments) returning an nn.Module or a Workload
  timm:NAME                timm.create_model(NAME, pretrained=False)
  hf:config.json           transformers' class named by the config's ``architectures`` (else
                           AutoModel), built from the config with no weights

Models are built on the meta device when their constructor allows it (nothing allocated);
a constructor that reads tensor values (``.tolist()`` of a linspace, as timm's stochastic depth
does) is built for real on the CPU instead, and the trace uses a meta copy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from tensorpilot.errors import ConfigError, first_line

LOSSES = ("ce", "mse", "sum")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "int64": torch.int64, "int32": torch.int32,
          "long": torch.int64, "int": torch.int32}


@dataclass
class ModelSource:
    name: str                                  # as the user wrote it
    model: nn.Module                           # on the meta device, or real when meta failed
    sample_shape: tuple[int, ...] | None       # one sample's input shape (no batch dimension)
    sample_dtype: torch.dtype
    int_high: int = 2                          # integer inputs are drawn from [0, int_high)
    loss_fn: Callable | None = None            # a Workload's own loss
    built_on: str = "meta"
    tokens_per_sample: int | None = None
    build: Callable[[], nn.Module] | None = None   # builds the model again, for real
    no_sample: str = "returned a bare nn.Module"   # why sample_shape is None, for the error that asks for one

    def real_model(self) -> nn.Module:
        """The model with real weights on the CPU (to measure it)."""
        if self.built_on != "meta":
            return self.model
        return self.build()


def _on_meta(build: Callable[[], nn.Module]) -> tuple[nn.Module, str]:
    try:
        with torch.device("meta"):
            return build(), "meta"
    except Exception:       # noqa: BLE001 - a constructor that reads tensor values: build it for real
        return build(), "cpu"


def load(name: str, *, hf_config: str | None = None) -> ModelSource:
    """The model ``name`` names (or the Hugging Face ``hf_config``), one sentence if it cannot be built."""
    if hf_config is not None or name.startswith("hf:"):
        return _hf(hf_config or name[3:])
    if name.startswith("timm:"):
        return _timm(name[5:])
    if name in ("gpt", "mlp", "cnn"):
        return _builtin(name)
    if ":" in name:
        return _factory(name)
    raise ConfigError(f"--model {name!r} is neither a built-in workload (gpt, mlp, cnn), timm:NAME, "
                      "hf:config.json nor package.module:factory (presets such as llama3-8b are planned on a "
                      "catalogued accelerator: --gpu h100-sxm).")


def _builtin(name: str) -> ModelSource:
    from tensorpilot.config import ModelConfig

    if name == "gpt":
        from tensorpilot.workloads.gpt import GPT
        from tensorpilot.workloads.registry import gpt_config

        cfg = gpt_config(ModelConfig())
        model, on = _on_meta(lambda: GPT(cfg))
        return ModelSource(name, model, (cfg.seq_len,), torch.int64, cfg.vocab_size, built_on=on,
                           tokens_per_sample=cfg.seq_len, build=lambda: GPT(cfg))
    from tensorpilot.workloads.vision import CNN, CNN_SIZES, MLP_SIZES, MLPNet

    if name == "mlp":
        build = lambda: MLPNet(256, MLP_SIZES["tiny"], 10)          # noqa: E731
        model, on = _on_meta(build)
        return ModelSource(name, model, (256,), torch.float32, built_on=on, build=build)
    build = lambda: CNN(3, CNN_SIZES["tiny"], 10)                    # noqa: E731
    model, on = _on_meta(build)
    return ModelSource(name, model, (3, 32, 32), torch.float32, built_on=on, build=build)


def _factory(name: str) -> ModelSource:
    from tensorpilot.workloads.base import Workload
    from tensorpilot.workloads.registry import call_factory

    try:
        with torch.device("meta"):
            made, on = call_factory(name), "meta"
    except ConfigError:
        made, on = call_factory(name), "cpu"      # raises the user's error in one sentence
    if isinstance(made, Workload):
        sample = _first_sample(made.train_data)
        x = sample[0] if isinstance(sample, (tuple, list)) else sample
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else None
        dtype = x.dtype if isinstance(x, torch.Tensor) else torch.float32
        high = int(made.meta.get("gpt", {}).get("vocab_size", 2)) if isinstance(made.meta, dict) else 2
        if isinstance(x, torch.Tensor) and not x.is_floating_point() and x.device.type != "meta":
            high = max(high, int(x.max()) + 1)
        return ModelSource(name, made.model, shape, dtype, high, made.loss_fn, on, made.tokens_per_sample,
                           build=lambda: _module_of(call_factory(name)))
    if isinstance(made, nn.Module):
        return ModelSource(name, made, None, torch.float32, built_on=on, build=lambda: call_factory(name))
    raise ConfigError(f"{name} must return an nn.Module or a tensorpilot.Workload, got {type(made).__name__}.")


def _module_of(made: Any) -> nn.Module:
    return made if isinstance(made, nn.Module) else made.model


def _first_sample(data: Any) -> Any:
    try:
        if isinstance(data, torch.utils.data.DataLoader):
            batch = next(iter(data))
            return _map(batch, lambda t: t[0] if isinstance(t, torch.Tensor) else t)
        return data[0]
    except Exception as exc:                  # noqa: BLE001 - the user's dataset
        raise ConfigError(f"reading the first sample of the workload's training data raised "
                          f"{type(exc).__name__}: {first_line(exc)}; pass --input-shape instead.") from None


def _map(obj: Any, fn: Callable) -> Any:
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map(o, fn) for o in obj)
    return fn(obj)


def _timm(arch: str) -> ModelSource:
    try:
        import timm
    except Exception as exc:              # noqa: BLE001 - absent, or a broken torchvision under it
        raise ConfigError(f"--model timm:{arch} needs timm, " + _import_failure("timm", exc) + ".") from None
    # is_model, not list_models(): create_model also takes 'arch.pretrained_tag' names and the ~200 names
    # timm renamed in 0.9 (convnext_small_in22ft1k; it maps them with a warning), which the list leaves out
    if not timm.is_model(arch):
        raise ConfigError(f"timm has no model {arch!r}; `python -c \"import timm; print(timm.list_models('*{arch[:4]}*'))\"` "
                          "lists the names.")
    build = lambda: timm.create_model(arch, pretrained=False)     # noqa: E731
    try:
        model, on = _on_meta(build)
    except RuntimeError as exc:           # a renamed name whose tag timm has since dropped, 'arch.no_such_tag'
        why = first_line(exc).rstrip(".")
        named = re.search(r" for ([\w.-]+)$", why)     # timm: 'Invalid pretrained tag (sam) for vit_base_patch32_224.'
        base = named.group(1) if named else arch.split(".")[0]
        raise ConfigError(f"timm cannot build {arch!r}: {why}; `python -c \"import timm; "
                          f"print(timm.list_models('{base}', pretrained=True))\"` lists its tags.") from None
    size = tuple(getattr(model, "pretrained_cfg", {}).get("input_size") or (3, 224, 224))
    classes = getattr(model, "num_classes", 1000)
    return ModelSource(f"timm:{arch}", model, size, torch.float32, int(classes), built_on=on, build=build)


def _reason(exc: BaseException) -> str:
    """The first line of the exception that caused ``exc``: huggingface_hub's validation error
    says only which validator failed, its cause says why (``The hidden size (250) is not a
    multiple of the number of attention heads (3)``)."""
    cause = exc.__cause__
    inner = f"{type(cause).__name__}: {first_line(cause)}" if cause is not None else ""
    return inner or first_line(exc)


def _import_failure(lib: str, exc: BaseException) -> str:
    """Why ``lib`` cannot be imported, and what to do: a library that is installed but whose
    import fails inside a dependency (a torchvision built for another torch: ``operator
    torchvision::nms does not exist``) names that dependency, not ``pip install lib``."""
    import traceback

    root = exc
    while (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__
    why = f"{type(root).__name__}: {first_line(root)}"
    for frame in reversed(traceback.extract_tb(root.__traceback__)):
        parts = Path(frame.filename).parts
        where = [i for i, d in enumerate(parts) if d in ("site-packages", "dist-packages")]
        if not where or where[-1] + 1 >= len(parts):
            continue
        dep = parts[where[-1] + 1].removesuffix(".py")
        if dep in ("torch", "importlib", lib):
            continue
        return (f"which is installed but fails to import inside {dep} ({why}): reinstall the {dep} release "
                f"built for this torch {torch.__version__}")
    if isinstance(exc, ModuleNotFoundError) and exc.name == lib:
        return f"which is not installed: pip install {lib}"
    return f"which cannot be imported here ({why}); check `python -c \"import {lib}\"`"


@contextlib.contextmanager
def _quiet_imports():
    """transformers imports torchao (quantizers) with its model classes, and torchao logs every
    optional CUDA kernel library it cannot load and torch's pytree deprecations; none is used
    to build a model without weights, and the plan's output stays the plan."""
    logs = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def _hf_sample(model: nn.Module, config: Any) -> tuple[tuple[int, ...] | None, torch.dtype, int | None]:
    """One sample of the input a Hugging Face model's forward takes first (its
    ``main_input_name``): (shape, dtype, tokens per sample). Token ids: the config's context up
    to 512; images: the config's channels and image size; raw audio: one second at 16 kHz;
    Whisper's log-mel features: its mel bins x the 30 s window (2 frames per encoder position)."""
    main = getattr(model, "main_input_name", "input_ids")
    if main == "input_ids":
        seq = min(int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
                      or 512), 512)
        return (seq,), torch.int64, seq
    if main == "pixel_values" and getattr(config, "image_size", None):
        size = config.image_size
        hw = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        return (int(getattr(config, "num_channels", 3)), *map(int, hw)), torch.float32, None
    if main == "input_values":
        return (16_000,), torch.float32, None
    mels, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
    if main == "input_features" and mels and positions:
        return (int(mels), 2 * int(positions)), torch.float32, None
    return None, torch.float32, None


def _hf(path: str) -> ModelSource:
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the Hugging Face config {path!r}: {exc.strerror or exc}.") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path!r} is not JSON ({exc.msg} at line {exc.lineno}).") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ConfigError(f"{path!r} is not a Hugging Face config.json (it has no model_type).")
    try:
        with _quiet_imports():
            import transformers
    except Exception as exc:              # noqa: BLE001
        raise ConfigError(f"building {path!r} needs transformers, " + _import_failure("transformers", exc) + ".") \
            from None
    try:
        config = transformers.AutoConfig.for_model(**raw)
    except Exception as exc:              # noqa: BLE001 - the library's validation (huggingface_hub's own errors)
        why = _reason(exc).rstrip(".")
        if ". Should contain one of" in why:              # the list of every model_type it knows
            why = (why.split(". Should contain one of")[0]
                   + f" (not a model_type transformers {transformers.__version__} knows)")
        raise ConfigError(f"transformers cannot read {path!r}: {why}.") from None
    archs = raw.get("architectures") or []
    try:
        with _quiet_imports():
            cls = getattr(transformers, archs[0], None) if archs else None
    except Exception as exc:              # noqa: BLE001 - a lazy import failing under transformers
        raise ConfigError(f"{path!r} names transformers.{archs[0]}, " + _import_failure("transformers", exc)
                          + ".") from None
    if cls is None:
        cls = transformers.AutoModel
    # the attention a config.json names: "eager" (the scores materialised) is kept; any fused one
    # (sdpa, flash_attention_2 / 3, flex_attention: kernels a CPU trace cannot run) is traced as SDPA
    eager = raw.get("attn_implementation") == "eager"
    if hasattr(config, "_attn_implementation"):
        config._attn_implementation = "eager" if eager else "sdpa"

    def make():
        return cls.from_config(config) if cls is transformers.AutoModel else cls(config)

    def build():
        # sdpa where the class has it (the fused kernel a GPU runs), else the class's own
        # attention: GPT-Neo, for one, refuses sdpa
        try:
            return make()
        except ValueError as exc:
            if "attention implementation" not in str(exc) or getattr(config, "_attn_implementation", None) == "eager":
                raise
            config._attn_implementation = "eager"
            return make()
    try:
        with _quiet_imports():
            model, on = _on_meta(build)
    except Exception as exc:              # noqa: BLE001 - the library's own error
        raise ConfigError(f"transformers could not build {cls.__name__} from {path!r}: "
                          f"{type(exc).__name__}: {first_line(exc)}.") from None
    shape, dtype, tokens = _hf_sample(model, config)
    vocab = int(getattr(config, "vocab_size", 2) or 2)
    main = getattr(model, "main_input_name", "input_ids")
    name = f"{type(model).__name__} ({Path(path).name})"
    decoder_len = _decoder_len(model, config, main)
    if decoder_len is not None:
        model, made = _EncoderDecoder(model, decoder_len), build
        build = lambda: _EncoderDecoder(made(), decoder_len)      # noqa: E731
    return ModelSource(name, model, shape, dtype, vocab, built_on=on, tokens_per_sample=tokens, build=build,
                       no_sample=f"takes {main} first, whose shape the config does not give")


# Whisper's decoder context (max_target_positions), the longest target a generic one is given
MAX_DECODER_LEN = 448


def _decoder_len(model: nn.Module, config: Any, main: str) -> int | None:
    """How many decoder token ids an encoder-decoder model whose forward needs them is given
    (0: the encoder's own ids), None when it needs none (a decoder-only or encoder model)."""
    import inspect

    if not getattr(config, "is_encoder_decoder", False):
        return None
    try:
        if "decoder_input_ids" not in inspect.signature(model.forward).parameters:
            return None
    except (TypeError, ValueError):
        return None
    if main == "input_ids":
        return 0
    return min(int(getattr(config, "max_target_positions", None) or MAX_DECODER_LEN), MAX_DECODER_LEN)


class _EncoderDecoder(nn.Module):
    """An encoder-decoder Hugging Face model (T5, Whisper, BART, Marian) fed one tensor: the
    decoder reads the encoder's token ids (teacher forcing on a target as long as the source),
    or, for audio or image inputs, ``decoder_len`` ids. Its forward otherwise refuses to run
    without ``labels`` or ``decoder_input_ids``, which the plan's flags do not describe."""

    def __init__(self, model: nn.Module, decoder_len: int):
        super().__init__()
        self.model, self.decoder_len = model, decoder_len
        self.main_input_name = getattr(model, "main_input_name", "input_ids")

    def forward(self, x: torch.Tensor):
        ids = x if not self.decoder_len else torch.zeros((x.shape[0], self.decoder_len), dtype=torch.int64,
                                                         device=x.device)
        return self.model(x, decoder_input_ids=ids)


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise ConfigError(f"--input-shape {text!r} must be positive integers separated by commas, e.g. 3,224,224.")
    return dims


def parse_dtype(text: str) -> torch.dtype:
    try:
        return DTYPES[text.lower()]
    except KeyError:
        raise ConfigError(f"--input-dtype {text!r} is not one of {', '.join(sorted(DTYPES))}.") from None


class Loss:
    """The step's loss. ``ce``: cross-entropy over the output's last dimension against class
    indices shaped like the output without it (a classifier, a language model); ``mse`` against
    a target shaped like the output; ``sum`` of the output; or a user's ``PKG.MOD:FN(output,
    targets)`` with cross-entropy-shaped targets. Targets are drawn here, from the output's shape,
    when the batch has none."""

    def __init__(self, kind: str = "ce", fn: Callable | None = None):
        self.kind, self.fn = kind, fn

    @classmethod
    def parse(cls, text: str | None, workload_loss: Callable | None = None) -> Loss:
        if text is None:
            return cls("workload", workload_loss) if workload_loss is not None else cls("ce")
        if text in LOSSES:
            return cls(text)
        if ":" in text:
            from tensorpilot.workloads.registry import load_factory

            fn = load_factory(text)
            if not callable(fn):
                raise ConfigError(f"--loss {text!r} names a {type(fn).__name__}, not a function.")
            return cls("custom", fn)
        raise ConfigError(f"--loss {text!r} must be one of {', '.join(LOSSES)} or package.module:function.")

    def targets(self, out: torch.Tensor) -> torch.Tensor | None:
        if self.kind == "sum":
            return None
        if self.kind == "mse":
            return torch.zeros(out.shape, dtype=out.dtype, device=out.device)
        return torch.zeros(out.shape[:-1], dtype=torch.int64, device=out.device)

    def __call__(self, out: torch.Tensor, y: Any) -> torch.Tensor:
        if y is None:
            y = self.targets(out)
        if self.kind == "sum":
            return out.float().sum()
        if self.kind == "mse":
            return nn.functional.mse_loss(out.float(), y.float())
        if self.fn is not None:
            return self.fn(out, y)
        from tensorpilot.workloads.base import cross_entropy

        return cross_entropy(out, y)


def batch_maker(shape: tuple[int, ...], dtype: torch.dtype, batch: int, int_high: int, device: str = "cpu"):
    """A function returning (inputs, None) for one micro-batch: random floats, or integers in
    [0, int_high); called inside the tracer's fake mode, or for real to measure."""
    def make():
        if dtype.is_floating_point:
            return torch.randn((batch, *shape), dtype=dtype, device=device), None
        return torch.randint(0, max(int_high, 1), (batch, *shape), dtype=dtype, device=device), None
    return make
