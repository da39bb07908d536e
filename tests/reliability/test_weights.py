"""Never lose a user's weights: the checkpoint a run reports holds that run's final weights, an
earlier run's weights are kept (moved aside, never overwritten or deleted), and a resumed run's
files hold one timeline (no repeated metrics, no checkpoints from an abandoned future).

The reference is the trainer's own model at the end of ``fit`` (in-process): the checkpoint
named in summary.json must hold exactly those tensors.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from battery import read_jsonl
from safetensors.torch import load_file

from tensorpilot.config import overrides_to_mapping
from tensorpilot.config import RunConfig, apply_mapping
from tensorpilot.training import checkpoint as ckpt_io
from tensorpilot.training.trainer import Trainer

TINY = {"model.n_layer": 2, "model.d_model": 32, "model.n_head": 2, "model.seq_len": 16,
        "data.batch_size": 4, "data.max_bytes": 100_000, "engine.compile": "off",
        "engine.precision": "fp32", "train.eval_batches": 1, "train.eval_interval": 1000,
        "train.log_interval": 1, "logging.progress": "off", "logging.tensorboard": False,
        "checkpoint.interval": 3, "checkpoint.keep": 10, "optim.warmup_steps": 2}


def train(run_dir, steps: int, **over):
    cfg = apply_mapping(RunConfig(), overrides_to_mapping({**TINY, "run_dir": str(run_dir),
                                                          "train.steps": steps, **over}))
    trainer = Trainer(cfg)
    trainer.console.quiet = True
    summary = trainer.fit()
    return summary, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def assert_holds(ckpt, weights):
    """``ckpt`` passes its checksums and holds exactly ``weights``."""
    ckpt_io.verify(ckpt, ckpt_io.read_meta(ckpt))
    saved = load_file(str(ckpt / "model.safetensors"))
    assert saved and all(torch.equal(saved[k], weights[k]) for k in saved), ckpt


def same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_training_again_into_a_run_directory_keeps_both_runs_weights(tmp_path):
    run = tmp_path / "X"
    first, w1 = train(run, 6, **{"optim.lr": 3e-3})
    second, w2 = train(run, 6, **{"optim.lr": 1e-2})
    assert not same(w1, w2)
    assert second["checkpoint"] == str(run / "checkpoints" / "step_00000006")
    assert_holds(run / "checkpoints" / "step_00000006", w2)          # the second run's weights
    (aside,) = (run / "superseded").iterdir()                        # the first run's, moved aside
    assert_holds(aside / "checkpoints" / "step_00000006", w1)
    assert json.loads((aside / "summary.json").read_text())["final_train_loss"] == first["final_train_loss"]
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == list(range(1, 7))                                # one run's records only


def test_resuming_an_earlier_checkpoint_moves_the_abandoned_future_aside(tmp_path):
    run = tmp_path / "R"
    _, old12 = train(run, 12)
    old_sums = {p.name: ckpt_io.read_meta(p)["sha256"] for p in ckpt_io.list_checkpoints(run / "checkpoints")}
    summary, new12 = train(run, 12, resume=str(run / "checkpoints" / "step_00000006"), **{"optim.lr": 1e-2})
    assert not same(old12, new12)
    assert summary["checkpoint"] == str(run / "checkpoints" / "step_00000012")
    assert_holds(run / "checkpoints" / "step_00000012", new12)
    (aside,) = (run / "superseded").iterdir()
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["step_00000009", "step_00000012"]
    for p in (aside / "checkpoints").iterdir():                     # intact, checksums and all
        assert ckpt_io.read_meta(p)["sha256"] == old_sums[p.name]
    assert_holds(aside / "checkpoints" / "step_00000012", old12)
    records = [(r["step"], r["kind"]) for r in read_jsonl(run / "metrics.jsonl")]
    assert len(records) == len(set(records))                         # nothing logged twice
    assert [s for s, k in records if k == "train"] == list(range(1, 13))
    # the override took effect from the resumed step on: the schedule's rate scaled by 1e-2 / 3e-3
    new_lr = {r["step"]: r["lr"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"}
    old_lr = {r["step"]: r["lr"] for r in read_jsonl(aside / "metrics.jsonl") if r["kind"] == "train"}
    assert new_lr[6] == old_lr[6]
    assert all(new_lr[s] == pytest.approx(old_lr[s] * 1e-2 / 3e-3) for s in range(7, 13))


def test_resume_after_a_crash_past_the_last_checkpoint_logs_each_step_once(tmp_path):
    run = tmp_path / "C"
    train(run, 8)
    # a crash at step 8 before its checkpoint: metrics of steps 7-8 exist, the newest
    # checkpoint is step 6 (an interval of 3)
    shutil.rmtree(run / "checkpoints" / "step_00000008")
    train(run, 10, resume="latest")
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == list(range(1, 11))


def test_a_checkpoint_without_meta_json_is_skipped_for_the_previous_complete_one(tmp_path):
    run = tmp_path / "M"
    _, _ = train(run, 6)
    (run / "checkpoints" / "step_00000006" / "meta.json").unlink()
    assert ckpt_io.find_checkpoint(run) == run / "checkpoints" / "step_00000003"
    summary, weights = train(run, 6, resume="latest")
    assert summary["steps"] == 6
    assert_holds(run / "checkpoints" / "step_00000006", weights)      # rewritten, complete again


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_a_distributed_checkpoint_of_the_same_step_is_replaced(tmp_path, monkeypatch, exchange):
    """dcp.save (rank 0 publishes) replaces an earlier run's directory of the same step; a
    one-process gloo group is a real process group for the collective save."""
    import torch.distributed as dist

    from tensorpilot.training import dcp
    from tensorpilot.workloads.gpt import GPT, GPTConfig

    if not exchange:
        from tensorpilot import files

        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        models = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8))
            opt = torch.optim.AdamW(model.parameters())
            dcp.save(tmp_path, 4, model, opt, {"step": 4, "samples_seen": 0}, {}, keep=2, is_main=True)
            models.append(model)
        fresh = GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8))
        dcp.load(tmp_path / "step_00000004", fresh, torch.optim.AdamW(fresh.parameters()))
    finally:
        dist.destroy_process_group()
    assert same(fresh.state_dict(), models[1].state_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004"]
