"""RunConfig: defaults, TOML loading, command-line style overrides, validation, round trip.

Every expectation is a hand-written literal; nothing is compared against the module's own output
except in the round trip, where the input is an independently built config.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Literal, Optional

import pytest

from tensorpilot.config import (
    CheckpointConfig,
    DataConfig,
    EngineConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
    apply_mapping,
    coerce,
    load_toml,
    to_toml,
)
from tensorpilot.errors import CheckpointError, ConfigError, TensorpilotError, UsageError


# ------------------------------------------------------------------------------- errors

def test_config_error_exits_with_usage_code_2():
    assert ConfigError.exit_code == 2
    assert ConfigError("x").exit_code == 2
    assert issubclass(ConfigError, UsageError) and issubclass(ConfigError, TensorpilotError)
    # a checkpoint problem is not a usage error: exit code 1
    assert CheckpointError("x").exit_code == 1


@pytest.mark.parametrize("module", ["tensorpilot", "tensorpilot.config", "tensorpilot.errors"])
def test_light_modules_do_not_import_torch(module):
    # config validation runs before anything heavy is imported; `import tensorpilot` stays fast
    code = f"import sys, {module}; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ----------------------------------------------------------------------------- defaults

def test_defaults_validate():
    cfg = RunConfig()
    assert cfg.validate() is cfg
    assert cfg.engine.precision == "auto"
    assert cfg.optim.betas == [0.9, 0.95]


def test_list_defaults_are_not_shared_between_instances():
    a, b = OptimConfig(), OptimConfig()
    a.betas.append(0.5)
    a.freeze.append("x")
    assert b.betas == [0.9, 0.95] and b.freeze == []


# ------------------------------------------------------------------------------- coerce

@pytest.mark.parametrize("text, expected", [
    ("7", 7), ("1e3", 1000), ("2.0", 2), (" 12 ", 12), (5, 5), (4.0, 4),
])
def test_coerce_int_accepts_integral_values(text, expected):
    value = coerce(text, int, "train.steps")
    assert value == expected and type(value) is int


@pytest.mark.parametrize("bad", ["abc", "1.5", "", "1e-3", 1.5, True])
def test_coerce_int_rejects_non_integers_naming_the_field(bad):
    with pytest.raises(ConfigError, match=r"train\.steps"):
        coerce(bad, int, "train.steps")


def test_coerce_float():
    assert coerce("1e-3", float, "optim.lr") == 0.001
    assert coerce(3, float, "optim.lr") == 3.0 and type(coerce(3, float, "optim.lr")) is float
    with pytest.raises(ConfigError, match=r"optim\.lr"):
        coerce("fast", float, "optim.lr")
    with pytest.raises(ConfigError, match=r"optim\.lr"):
        coerce(True, float, "optim.lr")


@pytest.mark.parametrize("text, expected", [
    ("false", False), ("FALSE", False), ("0", False), ("off", False), ("no", False),
    ("true", True), ("1", True), ("on", True), ("Yes", True), (True, True), (False, False),
])
def test_coerce_bool(text, expected):
    assert coerce(text, bool, "train.deterministic") is expected


def test_coerce_bool_rejects_other_words():
    with pytest.raises(ConfigError, match=r"train\.deterministic"):
        coerce("maybe", bool, "train.deterministic")


def test_coerce_lists_from_comma_separated_strings():
    assert coerce("a,b", list[str], "optim.freeze") == ["a", "b"]
    assert coerce(" tok_emb.* , blocks.0.* ", list[str], "optim.freeze") == ["tok_emb.*", "blocks.0.*"]
    assert coerce("0.8,0.99", list[float], "optim.betas") == [0.8, 0.99]
    assert coerce("64,32", list[int], "model.hidden") == [64, 32]
    assert coerce("", list[int], "model.hidden") == []
    assert coerce([1, 2], list[int], "model.hidden") == [1, 2]      # a TOML array
    with pytest.raises(ConfigError, match=r"model\.hidden"):
        coerce("64,x", list[int], "model.hidden")


def test_coerce_literal_is_case_insensitive_and_closed():
    tp = Literal["auto", "fp32", "tf32", "bf16", "fp16"]
    assert coerce("BF16", tp, "engine.precision") == "bf16"
    with pytest.raises(ConfigError, match=r"engine\.precision"):
        coerce("fp8", tp, "engine.precision")
    # TOML `compile = true` means "on"
    assert coerce(True, Literal["auto", "on", "off"], "engine.compile") == "on"
    assert coerce(False, Literal["auto", "on", "off"], "engine.compile") == "off"


def test_coerce_optional():
    assert coerce("none", Optional[int], "model.n_layer") is None
    assert coerce(None, Optional[int], "model.n_layer") is None
    assert coerce("3", Optional[int], "model.n_layer") == 3
    with pytest.raises(ConfigError, match=r"train\.steps"):
        coerce(None, int, "train.steps")


# ------------------------------------------------------------------ apply_mapping (CLI)

def test_apply_mapping_with_command_line_strings():
    cfg = apply_mapping(RunConfig(), {
        "train": {"steps": "1e3", "deterministic": "false", "device": "cpu"},
        "optim": {"freeze": "a,b", "lr": "3e-4", "betas": "0.8, 0.9"},
        "engine": {"precision": "BF16", "activation_checkpointing": "true", "grad_accum": "4"},
        "model": {"n_layer": "2", "hidden": "64,32"},
        "run_dir": "runs/x",
    })
    assert cfg.train.steps == 1000 and cfg.train.deterministic is False and cfg.train.device == "cpu"
    assert cfg.optim.freeze == ["a", "b"] and cfg.optim.lr == 3e-4 and cfg.optim.betas == [0.8, 0.9]
    assert cfg.engine.precision == "bf16" and cfg.engine.activation_checkpointing is True
    assert cfg.engine.grad_accum == 4
    assert cfg.model.n_layer == 2 and cfg.model.hidden == [64, 32]
    assert cfg.run_dir == "runs/x"
    # untouched settings keep their defaults
    assert cfg.train.seed == 1337 and cfg.optim.warmup_steps == 50


def test_apply_mapping_bad_int_names_the_field():
    with pytest.raises(ConfigError, match=r"train\.steps"):
        apply_mapping(RunConfig(), {"train": {"steps": "abc"}})
    with pytest.raises(ConfigError, match=r"data\.batch_size"):
        apply_mapping(RunConfig(), {"data": {"batch_size": "1.5"}})


@pytest.mark.parametrize("mapping", [
    {"trian": {"steps": 3}},               # unknown section
    {"train": {"stpes": 3}},               # unknown key
    {"lr": 0.1},                           # a setting outside its section
    {"train": 3},                          # a section that is not a table
])
def test_apply_mapping_rejects_unknown_names(mapping):
    with pytest.raises(ConfigError):
        apply_mapping(RunConfig(), mapping)


def test_unknown_key_message_names_it():
    with pytest.raises(ConfigError, match="stpes"):
        apply_mapping(RunConfig(), {"train": {"stpes": 3}})


def test_bad_precision_literal():
    with pytest.raises(ConfigError, match=r"engine\.precision"):
        apply_mapping(RunConfig(), {"engine": {"precision": "fp64"}})


# ----------------------------------------------------------------------------- validate

@pytest.mark.parametrize("steps", [0, -1])
def test_non_positive_steps_fail_validation(steps):
    cfg = apply_mapping(RunConfig(), {"train": {"steps": steps}})
    with pytest.raises(ConfigError, match=r"train\.steps"):
        cfg.validate()


@pytest.mark.parametrize("section, values", [
    (ModelConfig, {"d_model": 65, "n_head": 2}),          # 65 % 2 != 0
    (ModelConfig, {"n_layer": 0}),
    (ModelConfig, {"dropout": 1.0}),
    (ModelConfig, {"name": "resnet"}),
    (DataConfig, {"batch_size": 0}),
    (DataConfig, {"val_fraction": 0.5}),
    (DataConfig, {"num_classes": 1}),
    (OptimConfig, {"lr": 0.0}),
    (OptimConfig, {"min_lr_ratio": 1.5}),
    (OptimConfig, {"betas": [0.9]}),
    (OptimConfig, {"betas": [0.9, 1.0]}),
    (EngineConfig, {"grad_accum": 0}),
    (TrainConfig, {"device": "tpu"}),
    (TrainConfig, {"eval_interval": 0}),
    (CheckpointConfig, {"keep": 0}),
])
def test_out_of_range_values_fail_validation(section, values):
    with pytest.raises(ConfigError):
        section(**values).validate()


def test_custom_model_factory_name_validates():
    ModelConfig(name="mypkg.models:build").validate()


def test_data_path_must_exist_and_be_non_empty(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        DataConfig(path=str(tmp_path / "nope.txt")).validate()
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ConfigError, match="empty"):
        DataConfig(path=str(empty)).validate()
    full = tmp_path / "full.txt"
    full.write_text("hello")
    DataConfig(path=str(full)).validate()


# ---------------------------------------------------------------------------------- TOML

def test_load_toml_with_type_coercion(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        'run_dir = "runs/a"\n'
        "[train]\nsteps = 1000.0\nseed = 7\ndeterministic = true\n"
        "[optim]\nlr = 1\nbetas = [0.8, 0.9]\nfreeze = [\"tok_emb.*\"]\n"
        "[engine]\ncompile = false\nprecision = \"fp32\"\n"
        "[model]\nhidden = [128, 64]\n")
    cfg = apply_mapping(RunConfig(), load_toml(path), source=f"{path}: ").validate()
    assert cfg.run_dir == "runs/a"
    assert cfg.train.steps == 1000 and type(cfg.train.steps) is int      # TOML float -> int
    assert cfg.train.seed == 7 and cfg.train.deterministic is True
    assert cfg.optim.lr == 1.0 and type(cfg.optim.lr) is float           # TOML int -> float
    assert cfg.optim.betas == [0.8, 0.9] and cfg.optim.freeze == ["tok_emb.*"]
    assert cfg.engine.compile == "off" and cfg.engine.precision == "fp32"
    assert cfg.model.hidden == [128, 64]


def test_toml_non_integral_float_for_int_field(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[train]\nsteps = 1.5\n")
    with pytest.raises(ConfigError, match=r"train\.steps"):
        apply_mapping(RunConfig(), load_toml(path))


def test_toml_unknown_section_and_key(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[trainer]\nsteps = 3\n")
    with pytest.raises(ConfigError, match="trainer"):
        apply_mapping(RunConfig(), load_toml(path))
    path.write_text("[train]\nstep = 3\n")
    with pytest.raises(ConfigError, match="step"):
        apply_mapping(RunConfig(), load_toml(path))


def test_invalid_toml(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[train\nsteps = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "absent.toml")


def test_unreadable_config_file(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"[train]\n# caf\xe9\n")          # not UTF-8
    with pytest.raises(ConfigError):
        load_toml(path)


def test_to_toml_round_trips(tmp_path):
    cfg = RunConfig()
    cfg.run_dir = 'runs/with "quotes" and \\backslash'
    cfg.model.name = "mlp"
    cfg.model.n_layer = 3
    cfg.model.hidden = [64, 32]
    cfg.model.tie_head = False
    cfg.model.dropout = 0.25
    cfg.optim.lr = 1e-5
    cfg.optim.betas = [0.85, 0.999]
    cfg.optim.freeze = ["tok_emb.*", "blocks.0.*"]
    cfg.optim.impl = "loop"
    cfg.engine.precision = "bf16"
    cfg.engine.compile = "off"
    cfg.train.steps = 123_456
    cfg.train.deterministic = True
    cfg.checkpoint.enabled = False
    cfg.logging.progress = "lines"
    assert cfg != RunConfig()

    path = tmp_path / "effective.toml"
    path.write_text(to_toml(cfg))
    back = apply_mapping(RunConfig(), load_toml(path))
    assert back == cfg
    assert dataclasses.asdict(back) == dataclasses.asdict(cfg)


def test_to_toml_round_trips_defaults(tmp_path):
    path = tmp_path / "defaults.toml"
    path.write_text(to_toml(RunConfig()))
    assert apply_mapping(RunConfig(), load_toml(path)) == RunConfig()
