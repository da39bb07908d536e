"""Paths checked before work starts, and atomic writes (tensorpilot/files.py)."""

from __future__ import annotations

import os

import pytest

from tensorpilot import files
from tensorpilot.errors import PathError


def test_writable_dir_creates_parents_and_names_each_refusal(tmp_path):
    assert files.writable_dir(tmp_path / "a" / "b", "run directory").is_dir()
    (tmp_path / "f").write_text("x")
    with pytest.raises(PathError, match="'.*f' is a file, not a directory"):
        files.writable_dir(tmp_path / "f", "run directory")
    with pytest.raises(PathError, match="a part of the path is a file"):
        files.writable_dir(tmp_path / "f" / "sub", "run directory")
    with pytest.raises(PathError, match="too long"):
        files.writable_dir(tmp_path / ("x" * 300), "run directory")
    with pytest.raises(PathError, match="not a writable directory"):
        files.writable_dir("/proc/tensorpilot-test", "run directory")   # not writable even as root
    assert not any(p.name.startswith(".tensorpilot-write-test") for p in tmp_path.rglob("*"))


def test_output_file_refuses_directories_and_special_files(tmp_path):
    assert files.output_file(tmp_path / "new" / "job.yaml", "--out") == tmp_path / "new" / "job.yaml"
    with pytest.raises(PathError, match="is a directory"):
        files.output_file(tmp_path, "--out")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(PathError, match="not a regular file"):
        files.output_file(tmp_path / "fifo", "--out")


def test_write_atomic_replaces_the_file_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")
    files.write_atomic(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_existing_path(tmp_path):
    with pytest.raises(PathError, match="does not exist"):
        files.existing_path(tmp_path / "nope", "data.path")
    with pytest.raises(PathError, match="is a directory"):
        files.existing_path(tmp_path, "data.targets_path", "file")
    with pytest.raises(PathError, match="too long|does not exist"):
        files.existing_path(tmp_path / ("x" * 300), "data.path")
