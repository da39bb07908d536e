"""Bad input a user can cause: one clear sentence on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import pytest
from conftest import run_cli


@pytest.mark.parametrize("args,code,needle", [
    (["train", "--steps", "0"], 2, "train.steps must be a positive integer"),
    (["train", "--steps", "-5"], 2, "train.steps must be a positive integer"),
    (["train", "--steps", "ten"], 2, "expected an integer"),
    (["train", "--lr", "fast"], 2, "expected a number"),
    (["train", "--precision", "fp64"], 2, "expected one of"),
    (["train", "--no-such-option"], 2, "unrecognized arguments"),
    (["train", "--model", "transformer"], 2, "unknown model"),
    (["train", "--size", "gigantic"], 2, "unknown gpt size"),
    (["train", "--data", "/no/such/path"], 2, "does not exist"),
    (["train", "--config", "/no/such.toml"], 2, "does not exist"),
    (["train", "--model", "no_such_module:make"], 2, "cannot import"),
    (["train", "--device", "tpu"], 2, "unknown device"),
    (["train", "--optim.freeze", "nothing.*", "--steps", "1"], 2, "matches no parameter"),
    (["generate", "--run", "/no/such/run"], 1, "does not exist"),
])
def test_bad_input_is_one_clear_sentence(args, code, needle, tmp_path):
    proc = run_cli(*args, cwd=tmp_path, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout


def test_empty_data_file_and_malformed_toml(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    proc = run_cli("train", "--data", str(tmp_path / "empty.txt"), cwd=tmp_path)
    assert proc.returncode == 2 and "is empty" in proc.stderr
    (tmp_path / "bad.toml").write_text("[train\nsteps = ")
    proc = run_cli("train", "--config", str(tmp_path / "bad.toml"), cwd=tmp_path)
    assert proc.returncode == 2 and "not valid TOML" in proc.stderr
    (tmp_path / "typo.toml").write_text("[train]\nstepz = 3\n")
    proc = run_cli("train", "--config", str(tmp_path / "typo.toml"), cwd=tmp_path)
    assert proc.returncode == 2 and "stepz" in proc.stderr


def test_every_subcommand_has_help_documenting_its_options():
    for cmd in ("train", "generate"):
        proc = run_cli(cmd, "--help")
        assert proc.returncode == 0 and "--help" in proc.stdout
    train_help = run_cli("train", "--help").stdout
    from tensorpilot.config import field_docs
    for dotted, doc, _, _ in field_docs():
        assert f"--{dotted}" in train_help and doc.split()[0] in train_help
    for flag in ("--model", "--size", "--steps", "--run-dir", "--precision", "--compile", "--device", "--resume"):
        assert flag in train_help
    assert run_cli("--version").stdout.startswith("tensorpilot ")
