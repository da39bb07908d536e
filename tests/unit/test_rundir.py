"""One timeline per run directory (training/rundir.py): what a fresh run or an earlier resume
moves aside, on directories written by the real checkpoint writer."""

from __future__ import annotations

import json

import pytest
from torch import nn

from tensorpilot.errors import ConfigError
from tensorpilot.training import checkpoint as ckpt_io
from tensorpilot.training import rundir


def _run(tmp_path, steps=(3, 6, 9)):
    run = tmp_path / "run"
    for step in steps:
        ckpt_io.save(run / "checkpoints", step, nn.Linear(2, 2), {"step": step}, {}, keep=10)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "kind": "train"}) + "\n"
                                               for s in range(1, 10)) + '{"step": 10, "ki')   # torn line
    (run / "summary.json").write_text("{}")
    return run


def _moved(run):
    (aside,) = (run / rundir.SUPERSEDED).iterdir()
    return aside


def test_a_fresh_run_moves_an_earlier_run_aside(tmp_path):
    run = _run(tmp_path)
    note = rundir.prepare(run, None)
    assert "earlier run" in note and "nothing was deleted" in note
    aside = _moved(run)
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["step_00000003", "step_00000006", "step_00000009"]
    assert (aside / "metrics.jsonl").exists() and (aside / "summary.json").exists()
    assert not (run / "metrics.jsonl").exists() and ckpt_io.list_checkpoints(run / "checkpoints") == []


def test_resuming_an_earlier_step_keeps_its_past_and_moves_its_future(tmp_path):
    run = _run(tmp_path)
    note = rundir.prepare(run, run / "checkpoints" / "step_00000006")
    assert "after the resumed step 6" in note
    assert [p.name for p in ckpt_io.list_checkpoints(run / "checkpoints")] == ["step_00000003", "step_00000006"]
    aside = _moved(run)
    assert [p.name for p in (aside / "checkpoints").iterdir()] == ["step_00000009"]
    kept = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert kept == [1, 2, 3, 4, 5, 6]
    assert (aside / "metrics.jsonl").read_text().count("\n") == 9       # the whole old file


def test_resuming_the_newest_step_moves_nothing_but_cuts_metrics(tmp_path):
    run = _run(tmp_path)
    note = rundir.prepare(run, run / "checkpoints" / "step_00000009")
    assert note == "moved metrics after step 9 to " + str(_moved(run)) + \
        " (they come after the resumed step 9; nothing was deleted)"
    assert len(ckpt_io.list_checkpoints(run / "checkpoints")) == 3


def test_resolve(tmp_path):
    run = _run(tmp_path)
    # a resumed run without --run-dir continues in its checkpoint's run directory
    assert rundir.resolve(None, str(run), "gpt", "tiny") == (run, run / "checkpoints" / "step_00000009")
    assert rundir.resolve(None, str(run / "checkpoints" / "step_00000003"), "gpt", "tiny")[0] == run
    with pytest.raises(ConfigError, match="needs --run-dir"):
        rundir.resolve(None, "latest", "gpt", "tiny")



def test_runs_started_in_the_same_second_claim_different_directories(tmp_path, monkeypatch):
    """Two runs without --run-dir started in one second (the default name is to the second) each
    get a directory of their own: a name is claimed by creating it, not by seeing it free."""
    from datetime import datetime

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 1, 2, 3, 4, 5)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rundir, "datetime", Frozen)
    got = [rundir.new_run_dir("gpt", "tiny") for _ in range(3)]
    assert [str(g) for g in got] == ["runs/20260102-030405-gpt-tiny", "runs/20260102-030405-gpt-tiny-1",
                                     "runs/20260102-030405-gpt-tiny-2"]
    assert all((tmp_path / g).is_dir() for g in got)
