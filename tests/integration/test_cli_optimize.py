"""`tensorpilot train --optimize auto` end to end: trials are real steps, the choice is valid,
recorded in summary.json and reused from the cache on the next run."""

from __future__ import annotations

import json

from conftest import FAST, read_jsonl, run_cli

from tensorpilot.training.autotune import NOISE_MARGIN


def test_optimize_auto_records_and_reuses_its_choice(tmp_path):
    # global batch 8 x 2 = 16; compile stays off (FAST): the trials vary precision and micro-batch
    args = [*FAST, "--engine.grad_accum", "2", "--steps", "30", "--optimize", "auto", "--tune-budget", "30"]
    proc = run_cli("train", *args, "--run-dir", str(tmp_path / "a"), check=True)
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    tuned = s["autotune"]
    chosen = tuned["chosen"]
    assert chosen["micro_batch"] * chosen["grad_accum"] == 16           # the global batch is kept
    assert chosen["precision"] in ("bf16", "fp32") and not chosen["compile"]
    assert tuned["trials"] and not tuned["cached"]
    labels = [t["candidate"] for t in tuned["trials"]]
    assert chosen["label"] in labels
    measured = {t["candidate"]: t["measured_step_s"] for t in tuned["trials"]}
    # the fastest it measured, up to the noise margin that keeps an earlier (predicted-better) one
    assert measured[chosen["label"]] <= min(measured.values()) / (1 - NOISE_MARGIN)
    assert "autotune" in proc.stdout and chosen["label"] in proc.stdout
    # trials are real training steps: every step 1..30 is logged once, none lost or repeated
    steps = [r["step"] for r in read_jsonl(tmp_path / "a" / "metrics.jsonl") if r["kind"] == "train"]
    assert sorted(set(steps)) == steps and steps[-1] == 30 and steps[0] == 1
    assert s["steps"] == 30 and s["precision"] == chosen["precision"]

    run_cli("train", *args, "--run-dir", str(tmp_path / "b"), check=True)
    again = json.loads((tmp_path / "b" / "summary.json").read_text())["autotune"]
    assert again["cached"] and again["chosen"] == chosen and again["trials"] == []
