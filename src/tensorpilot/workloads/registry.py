"""Build the workload a run config names: gpt, mlp, cnn, or a user's ``package.module:factory``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from torch import nn

from tensorpilot.config import DataConfig, ModelConfig
from tensorpilot.errors import ConfigError
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


def build_gpt(mcfg: ModelConfig, dcfg: DataConfig, seed: int) -> Workload:
    from tensorpilot.workloads.gpt import GPT

    gcfg = gpt_config(mcfg)
    train, val, desc = D.load_text_corpus(dcfg.path, dcfg.val_fraction, dcfg.max_bytes)
    return Workload(
        model=GPT(gcfg),
        train_data=D.ByteWindows(train, gcfg.seq_len, seed),
        val_data=D.ByteWindows(val, gcfg.seq_len, seed + VAL_SEED_OFFSET),
        tokens_per_sample=gcfg.seq_len, kind="gpt",
        meta={"gpt": {k: getattr(gcfg, k) for k in gcfg.__slots__}, "data": desc},
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


def build_mlp(mcfg: ModelConfig, dcfg: DataConfig, seed: int) -> Workload:
    from tensorpilot.workloads.vision import MLP_SIZES, MLPNet, num_features

    if mcfg.size not in MLP_SIZES and not mcfg.hidden:
        raise ConfigError(f"unknown mlp size {mcfg.size!r}: use {', '.join(MLP_SIZES)}.")
    train, val, shape, classes, desc = _classification_data(dcfg, [256], seed)
    hidden = mcfg.hidden or MLP_SIZES[mcfg.size]
    return Workload(model=MLPNet(num_features(shape), hidden, classes), train_data=train,
                    val_data=val, kind="mlp", meta={"data": desc, "hidden": hidden})


def build_cnn(mcfg: ModelConfig, dcfg: DataConfig, seed: int) -> Workload:
    from tensorpilot.workloads.vision import CNN, CNN_SIZES

    if mcfg.size not in CNN_SIZES and not mcfg.channels:
        raise ConfigError(f"unknown cnn size {mcfg.size!r}: use {', '.join(CNN_SIZES)}.")
    train, val, shape, classes, desc = _classification_data(dcfg, [3, 32, 32], seed)
    if len(shape) != 3:
        raise ConfigError(f"cnn inputs must be images (C, H, W), got sample shape {shape}.")
    channels = mcfg.channels or CNN_SIZES[mcfg.size]
    return Workload(model=CNN(shape[0], channels, classes), train_data=train, val_data=val,
                    kind="cnn", meta={"data": desc, "channels": channels})


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
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r}.") from None


def build_custom(mcfg: ModelConfig, dcfg: DataConfig, seed: int) -> Workload:
    made = load_factory(mcfg.name)()
    if isinstance(made, Workload):
        return made
    if isinstance(made, nn.Module):
        if not dcfg.path:
            raise ConfigError(f"{mcfg.name} returned a bare nn.Module: give its data with --data.path "
                              "(.pt/.npz/.npy), or return a tensorpilot.Workload from the factory.")
        inputs, targets = D.load_tensors(dcfg.path, dcfg.targets_path)
        (xt, yt), (xv, yv) = D.split_tensors(inputs, targets, dcfg.val_fraction, seed)
        return Workload(model=made, train_data=D.Tensors(xt, yt), val_data=D.Tensors(xv, yv),
                        meta={"data": {"source": dcfg.path}})
    raise ConfigError(f"{mcfg.name} must return an nn.Module or a tensorpilot.Workload, "
                      f"got {type(made).__name__}.")


BUILDERS = {"gpt": build_gpt, "mlp": build_mlp, "cnn": build_cnn}


def build(mcfg: ModelConfig, dcfg: DataConfig, seed: int) -> Workload:
    builder = BUILDERS.get(mcfg.name, build_custom)
    return builder(mcfg, dcfg, seed)
