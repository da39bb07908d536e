"""Build the workload a run config names: gpt, mlp, cnn, or a user's ``package.module:factory``.

Builders load the data first and construct the model last, through ``fits(build, data, meta)``
when the caller gives one: the caller checks the model would fit (tensorpilot.training.fits)
before anything is allocated. A user's factory is code that builds for real when called, so its
model is checked after it returns (``fits`` gets the built model)."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

from torch import nn

from tensorpilot.config import DataConfig, ModelConfig
from tensorpilot.errors import ConfigError, first_line, user_frame
from tensorpilot.workloads import data as D
from tensorpilot.workloads.base import Workload

VAL_SEED_OFFSET = 7919  # validation samples use their own seed, so they never move with training


def gpt_config(mcfg: ModelConfig):
    from tensorpilot.workloads.gpt import SIZES, GPTConfig

    if mcfg.size not in SIZES:
        raise ConfigError(f"unknown gpt size {mcfg.size!r}: use {', '.join(SIZES)}.")
    shape = dict(SIZES[mcfg.size])
    for key in ("n_layer", "n_head", "d_model", "seq_len"):
        if getattr(mcfg, key) is not None:
            shape[key] = getattr(mcfg, key)
    if shape["d_model"] % shape["n_head"]:
        raise ConfigError(f"gpt d_model ({shape['d_model']}) must be divisible by n_head ({shape['n_head']}).")
    return GPTConfig(**shape, dropout=mcfg.dropout, tie_head=mcfg.tie_head)


# fits(build, train_data, meta, loss_fn) -> the model: checks it would fit, then calls build()
# (which returns the model already built when a user's factory made it)
Fits = Callable[[Callable[[], nn.Module], Any, dict, Any], nn.Module]


def _no_check(build: Callable[[], nn.Module], train_data: Any, meta: dict, loss_fn: Any = None) -> nn.Module:
    return build()


def build_gpt(mcfg: ModelConfig, dcfg: DataConfig, seed: int, fits: Fits = _no_check) -> Workload:
    from tensorpilot.workloads.gpt import GPT

    gcfg = gpt_config(mcfg)
    train, val, desc = D.load_text_corpus(dcfg.path, dcfg.val_fraction, dcfg.max_bytes)
    meta = {"gpt": {k: getattr(gcfg, k) for k in gcfg.__slots__}, "data": desc}
    train_data = D.ByteWindows(train, gcfg.seq_len, seed)
    return Workload(
        model=fits(lambda: GPT(gcfg), train_data, meta, None),
        train_data=train_data,
        val_data=D.ByteWindows(val, gcfg.seq_len, seed + VAL_SEED_OFFSET),
        tokens_per_sample=gcfg.seq_len, kind="gpt", meta=meta,
    )


def _classification_data(dcfg: DataConfig, default_shape: list[int], seed: int):
    if dcfg.path:
        inputs, targets = D.load_tensors(dcfg.path, dcfg.targets_path)
        (xt, yt), (xv, yv) = D.split_tensors(inputs, targets, dcfg.val_fraction, seed)
        shape, classes = list(inputs.shape[1:]), int(targets.max()) + 1
        desc = {"source": str(dcfg.path), "train_samples": len(yt), "val_samples": len(yv)}
        return D.Tensors(xt, yt), D.Tensors(xv, yv), shape, classes, desc
    shape = dcfg.input_shape or default_shape
    train = D.SyntheticClasses(shape, dcfg.num_classes, seed, dcfg.synthetic_samples)
    val = D.SyntheticClasses(shape, dcfg.num_classes, seed, dcfg.synthetic_samples)
    val.seed = seed + VAL_SEED_OFFSET          # same prototypes (same task), unseen noise
    desc = {"source": "synthetic", "input_shape": shape, "classes": dcfg.num_classes}
    return train, val, shape, dcfg.num_classes, desc


def build_mlp(mcfg: ModelConfig, dcfg: DataConfig, seed: int, fits: Fits = _no_check) -> Workload:
    from tensorpilot.workloads.vision import MLP_SIZES, MLPNet, num_features

    if mcfg.size not in MLP_SIZES and not mcfg.hidden:
        raise ConfigError(f"unknown mlp size {mcfg.size!r}: use {', '.join(MLP_SIZES)}.")
    train, val, shape, classes, desc = _classification_data(dcfg, [256], seed)
    hidden = mcfg.hidden or MLP_SIZES[mcfg.size]
    meta = {"data": desc, "hidden": hidden}
    return Workload(model=fits(lambda: MLPNet(num_features(shape), hidden, classes), train, meta, None),
                    train_data=train, val_data=val, kind="mlp", meta=meta)


def build_cnn(mcfg: ModelConfig, dcfg: DataConfig, seed: int, fits: Fits = _no_check) -> Workload:
    from tensorpilot.workloads.vision import CNN, CNN_SIZES

    if mcfg.size not in CNN_SIZES and not mcfg.channels:
        raise ConfigError(f"unknown cnn size {mcfg.size!r}: use {', '.join(CNN_SIZES)}.")
    train, val, shape, classes, desc = _classification_data(dcfg, [3, 32, 32], seed)
    if len(shape) != 3:
        raise ConfigError(f"cnn inputs must be images (C, H, W), got sample shape {shape}.")
    channels = mcfg.channels or CNN_SIZES[mcfg.size]
    meta = {"data": desc, "channels": channels}
    return Workload(model=fits(lambda: CNN(shape[0], channels, classes), train, meta, None), train_data=train,
                    val_data=val, kind="cnn", meta=meta)


def load_factory(spec: str):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--model {spec!r} must look like package.module:factory.")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))     # like `python -m`: the working directory is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} for --model {spec!r}: {exc}.") from None
    except Exception as exc:                         # the module itself fails (syntax, its own code)
        raise ConfigError(f"importing {module_name!r} for --model {spec!r} raised "
                          f"{type(exc).__name__}: {first_line(exc)}.") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r}.") from None


def call_factory(spec: str):
    """Call the user's ``package.module:factory`` with no arguments. A factory that needs
    arguments, or one that raises, ends in one sentence naming it (and where it raised)."""
    factory = load_factory(spec)
    if not callable(factory):
        raise ConfigError(f"--model {spec!r} names a {type(factory).__name__}, not a function or class "
                          "that builds the model.")
    try:
        inspect.signature(factory).bind()
    except TypeError as exc:
        raise ConfigError(f"--model {spec!r} must be callable without arguments ({exc}); wrap it in a "
                          "function that passes them.") from None
    except ValueError:
        pass                                         # builtins without a signature: just call it
    try:
        return factory()
    except Exception as exc:                         # the user's code: say where, in one sentence
        where = user_frame(exc) or ""
        raise ConfigError(f"--model {spec!r} raised {type(exc).__name__}{where}: {first_line(exc)}.") from None


def build_custom(mcfg: ModelConfig, dcfg: DataConfig, seed: int, fits: Fits = _no_check) -> Workload:
    made = call_factory(mcfg.name)
    if isinstance(made, Workload):
        fits(lambda: made.model, made.train_data, made.meta, made.loss_fn)
        return made
    if isinstance(made, nn.Module):
        if not dcfg.path:
            raise ConfigError(f"{mcfg.name} returned a bare nn.Module: give its data with --data.path "
                              "(.pt/.npz/.npy), or return a tensorpilot.Workload from the factory.")
        inputs, targets = D.load_tensors(dcfg.path, dcfg.targets_path)
        (xt, yt), (xv, yv) = D.split_tensors(inputs, targets, dcfg.val_fraction, seed)
        train = D.Tensors(xt, yt)
        meta = {"data": {"source": dcfg.path}}
        return Workload(model=fits(lambda: made, train, meta, None), train_data=train,
                        val_data=D.Tensors(xv, yv), meta=meta)
    raise ConfigError(f"{mcfg.name} must return an nn.Module or a tensorpilot.Workload, "
                      f"got {type(made).__name__}.")


def build(mcfg: ModelConfig, dcfg: DataConfig, seed: int, fits: Fits = _no_check) -> Workload:
    """The workload ``mcfg.name`` names: a registered spec's builder, or the user's factory."""
    from tensorpilot.workloads import specs

    specs.check_model_name(mcfg.name)
    return (specs.get(mcfg.name).build or build_custom)(mcfg, dcfg, seed, fits)
