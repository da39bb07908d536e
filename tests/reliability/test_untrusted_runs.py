"""A run directory is data, possibly someone else's: it never chooses code to run, its recorded
sizes never decide what is allocated, and its pickles are never executed.

The hostile files here leave a marker file when their code runs; every test asserts the marker
is absent after tensorpilot refused them.
"""

from __future__ import annotations

import json

import pytest
import torch
from battery import TINY, assert_clean_error, run

from tensorpilot.training import checkpoint as ckpt_io

EVIL = """import pathlib
pathlib.Path("EXECUTED").write_text("imported")
def build():
    pathlib.Path("EXECUTED").write_text("called")
    import torch
    return torch.nn.Linear(4, 2)
"""


class Payload:
    """Unpickling it would write the marker (it never gets the chance)."""

    def __reduce__(self):
        return (open, ("EXECUTED", "w"))


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("untrusted")
    res = run("train", *TINY, "--steps", "2", "--run-dir", str(d / "run"), cwd=d)
    assert res.code == 0, str(res)
    return d / "run"


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst, ckpt_io.list_checkpoints(dst / "checkpoints")[-1]


def _edit_meta(ckpt, edit):
    meta = json.loads((ckpt / "meta.json").read_text())
    edit(meta)
    (ckpt / "meta.json").write_text(json.dumps(meta))


def test_resume_never_calls_a_factory_named_in_meta_json(gpt_run, tmp_path):
    (tmp_path / "evilmod.py").write_text(EVIL)
    run_dir, ckpt = _copy(gpt_run, tmp_path / "run")
    _edit_meta(ckpt, lambda m: m["config"]["model"].update(name="evilmod:build"))
    res = run("train", "--resume", str(run_dir), "--steps", "4", cwd=tmp_path)
    assert_clean_error(res, 2, "never chooses code to run", "--model evilmod:build")
    assert not (tmp_path / "EXECUTED").exists()
    # naming another factory on the command line is a mismatch, refused before importing either
    res = run("train", "--resume", str(run_dir), "--model", "other:thing", "--steps", "4", cwd=tmp_path)
    assert_clean_error(res, 2, "evilmod:build", "other:thing")
    assert not (tmp_path / "EXECUTED").exists()


@pytest.mark.parametrize("command", ["generate", "train"])
def test_doctored_sizes_in_meta_json_allocate_nothing(gpt_run, tmp_path, command):
    run_dir, ckpt = _copy(gpt_run, tmp_path / "run")
    # 4e6 wide: ~10^14 parameters if believed. generate reads the shape from meta.json; train
    # --resume takes meta.json's config as its base
    _edit_meta(ckpt, lambda m: (m["workload"]["gpt"].update(d_model=4_000_000),
                                m["config"]["model"].update(d_model=4_000_000)))
    args = ["--run", str(run_dir), "--tokens", "3"] if command == "generate" else \
        ["--resume", str(run_dir), "--steps", "4"]
    res = run(command, *args, cwd=tmp_path, timeout=60)
    assert_clean_error(res, {"generate": 1, "train": 2}[command],
                       {"generate": "does not fit the model its meta.json describes",
                        "train": "does not fit"}[command])


@pytest.mark.parametrize("value", ["'4'", "[4]", "{}", "-4", "true"])
def test_a_wrongly_typed_meta_json_is_a_sentence(gpt_run, tmp_path, value):
    run_dir, ckpt = _copy(gpt_run, tmp_path / "run")
    _edit_meta(ckpt, lambda m: m["workload"]["gpt"].update(n_layer=json.loads(value.replace("'", '"'))))
    assert_clean_error(run("generate", "--run", str(run_dir), cwd=tmp_path), 1, "n_layer")


def test_a_pickle_in_state_pt_is_refused_without_advice_to_unpickle_it(gpt_run, tmp_path):
    run_dir, ckpt = _copy(gpt_run, tmp_path / "run")
    state = torch.load(ckpt / "state.pt", weights_only=True)
    state["extra"] = Payload()
    torch.save(state, ckpt / "state.pt")
    _edit_meta(ckpt, lambda m: m["sha256"].update({"state.pt": ckpt_io.sha256_file(ckpt / "state.pt")}))
    res = run("train", "--resume", str(run_dir), "--steps", "4", cwd=tmp_path)
    line = assert_clean_error(res, 1, "refused", "never unpickles")
    assert "weights_only" not in res.err and "weights_only" not in line
    assert not (tmp_path / "EXECUTED").exists()
