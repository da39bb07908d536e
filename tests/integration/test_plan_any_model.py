"""`tensorpilot plan` for a model the project did not write: a user's factory through the real
CLI, its bad inputs, the calibration loop with `train`, a catalogued GPU and a Hugging Face config."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

FACTORY = """
import torch
from torch import nn

def small():
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 2))

def wide():
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))

def broken():
    raise ValueError("no weights here")

class Picky(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(12, 2)

    def forward(self, x):
        keep = x[x[:, 0] > 0]            # how many rows survive depends on the values
        return self.head(keep)

def picky():
    return Picky()

class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(12))

    def forward(self, x, mask):          # what one --input-shape cannot describe
        return x * mask * self.scale

    def __call__(self, *args, **kwargs):
        import warnings
        warnings.warn("this warning of the model's own code is not part of the error")
        return super().__call__(*args, **kwargs)

def two_inputs():
    return TwoInputs()

def frozen():
    return nn.Linear(12, 2).requires_grad_(False)

class Tagger(nn.Module):                 # a frozen embedding under a trained bidirectional LSTM
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.emb.requires_grad_(False)
        self.rnn = nn.LSTM(16, 32, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, 5)

    def forward(self, ids):
        return self.head(self.rnn(self.emb(ids))[0])

def tagger():
    return Tagger()
"""


@pytest.fixture()
def models(tmp_path):
    (tmp_path / "usermodels.py").write_text(FACTORY)
    return tmp_path


def _plan(cwd, *args, check=True):
    return run_cli("plan", *args, cwd=cwd, check=check)


def test_plan_a_user_factory_end_to_end(models):
    proc = _plan(models, "--model", "usermodels:small", "--input-shape", "12", "--batch-size", "16",
                 "--precision", "fp32", "--json", "--no-calibration")
    d = json.loads(proc.stdout)
    for key in ("memory_bytes", "fits", "step_time_s", "mfu", "model_flops_per_step", "modules", "time_breakdown_s"):
        assert key in d, key
    # forward 2 x 16 x (12 x 16 + 16 x 2); backward: both weight gradients, one input gradient
    fwd = 2 * 16 * (12 * 16 + 16 * 2)
    assert d["model_flops_per_step"] == fwd + 2 * 16 * 12 * 16 + 2 * (2 * 16 * 16 * 2)
    n = 12 * 16 + 16 + 16 * 2 + 2
    assert d["params"] == n and d["memory_bytes"]["parameters"] == 4 * n
    assert d["memory_bytes"]["optimizer"] == 8 * n + 4 * 4          # AdamW m, v and a step per tensor
    assert d["memory_bytes"]["total"] >= 16 * n and d["fits"] is True
    assert d["step_time_s"] > 0 and d["calibration"] == {"compute": 1.0, "memory": 1.0, "host": 1.0}
    rows = {r["module"]: r for r in d["modules"]}
    assert rows["0"]["type"] == "Linear" and rows["0"]["flops"] == 2 * 16 * 12 * 16 * 2
    text = _plan(models, "--model", "usermodels:small", "--input-shape", "12", "--batch-size", "16",
                 "--top-k", "2").stdout
    assert "top 2 modules" in text and "Linear" in text and "step time" in text


@pytest.mark.parametrize("args,words", [
    (["--model", "usermodels:broken", "--input-shape", "12"], ["usermodels:broken", "ValueError", "no weights"]),
    (["--model", "usermodels:small", "--input-shape", "3,8,8"], ["module '0' (Linear)", "--input-shape"]),
    (["--model", "usermodels:picky", "--input-shape", "12"], ["usermodels:picky", "reads tensor values"]),
    (["--model", "usermodels:small"], ["bare nn.Module", "--input-shape"]),
    (["--model", "usermodels:small", "--input-shape", "0,3"], ["--input-shape", "positive integers"]),
    (["--model", "usermodels:small", "--input-shape", "12", "--loss", "nothing"], ["--loss", "ce, mse, sum"]),
    (["--model", "usermodels:small", "--input-shape", "12", "--gpus", "16", "--sharding", "hsdp"],
     ["--sharding hsdp", "data-parallel layouts only"]),
    (["--model", "usermodels:small", "--input-shape", "12", "--cp", "2"], ["--cp 2", "data-parallel layouts only"]),
    (["--model", "usermodels:two_inputs", "--input-shape", "12"], ["usermodels:two_inputs", "TwoInputs",
                                                                    "PKG.MOD:FACTORY wrapping it"]),
    (["--model", "usermodels:frozen", "--input-shape", "12"], ["usermodels:frozen", "no trainable parameters"]),
    (["--model", "usermodels:small", "--input-shape", "12", "--measured-tokens-per-s", "500"],
     ["--measured-tokens-per-s", "usermodels:small", "--measured-step-s"]),
    (["--model", "usermodels:small", "--input-shape", "12", "--stack-efficiency", "0"],
     ["--stack-efficiency", "above 0"]),
    (["--model", "usermodels:small", "--input-shape", "12", "--measured-step-s", "0.5", "--stack-efficiency", "0.5"],
     ["--measured-step-s and --stack-efficiency", "pass one"]),
    (["--model", "usermodels:small", "--input-shape", "12", "--search"], ["--search", "--gpus N"]),
    (["--model", "usermodels:small", "--input-shape", "12", "--optimizer", "muon"], ["muon", "adamw"]),
])
def test_bad_input_is_one_sentence(models, args, words):
    proc = _plan(models, *args, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1, line
    for w in words:
        assert w in line, (w, line)


def test_one_measured_step_anchors_a_user_model_and_its_share_plans_another_batch(models):
    base = ["--model", "usermodels:wide", "--input-shape", "1024", "--gpu", "h100-sxm", "--precision", "bf16",
            "--loss", "sum", "--json"]
    plain = json.loads(_plan(models, *base, "--batch-size", "4096").stdout)
    assert plain["anchor"] is None
    # a stack at a third of the planner's kernel rates takes three times the kernels' time
    measured = 3 * (plain["time_breakdown_s"]["compute"] + plain["time_breakdown_s"]["memory"]) + \
        plain["time_breakdown_s"]["host"] + plain["time_breakdown_s"]["communication"]
    d = json.loads(_plan(models, *base, "--batch-size", "4096", "--measured-step-s", repr(measured)).stdout)
    a = d["anchor"]
    assert a["part"] == "stack_efficiency" and a["reached"] and a["efficiency"] == pytest.approx(1 / 3, rel=1e-2)
    assert d["step_time_s"] == pytest.approx(measured, rel=1e-2)
    assert f"--stack-efficiency {a['efficiency']:.3g}" in d["notes"][0]
    # the printed share plans another batch of the same stack: its kernels at a third of their rates
    other = json.loads(_plan(models, *base, "--batch-size", "8192").stdout)
    carried = json.loads(_plan(models, *base, "--batch-size", "8192", "--stack-efficiency",
                               f"{a['efficiency']:.3g}").stdout)
    kernels = other["time_breakdown_s"]["compute"] + other["time_breakdown_s"]["memory"]
    assert carried["time_breakdown_s"]["compute"] + carried["time_breakdown_s"]["memory"] == \
        pytest.approx(3 * kernels, rel=2e-3)


def test_search_ranks_a_user_models_shardings_fastest_fitting_first(models):
    base = ["--model", "usermodels:wide", "--input-shape", "1024", "--gpu", "h100-sxm", "--precision", "bf16",
            "--loss", "sum", "--batch-size", "64", "--gpus", "8", "--json"]
    one = {s: json.loads(_plan(models, *base, "--sharding", s).stdout) for s in ("none", "fsdp")}
    # a device too small for unsharded AdamW states, large enough for a shard of them
    n = 1024 * 4096 * 2 + 4096 + 1024
    small = ["--memory-gb", repr(round((one["fsdp"]["memory_bytes"]["total"] + n * 8) / 1e9 / 0.9, 4))]
    d = json.loads(_plan(models, *base, "--search", *small).stdout)
    rows = {r["sharding"]: r for r in d["search"]}
    assert set(rows) == {"none", "zero1", "zero2", "fsdp"}
    assert rows["none"]["fits"] is False and rows["fsdp"]["fits"] is True
    # fsdp shards parameters, gradients and AdamW state eight ways (modelplan.predict.sharded_memory)
    states = sum(one["none"]["memory_bytes"][k] for k in ("parameters", "gradients", "optimizer"))
    assert rows["none"]["memory_bytes"] - rows["fsdp"]["memory_bytes"] == pytest.approx(states * 7 / 8, rel=1e-6)
    fitting = [r for r in d["search"] if r["fits"]]
    assert d["best"] == fitting[0]["sharding"] == max(fitting, key=lambda r: r["samples_per_s"])["sharding"]
    assert d["search"][-1]["sharding"] == "none"                 # what does not fit ranks last
    # one measured step of the flags' own sharding: every candidate runs at the share it solved
    step = one["none"]["step_time_s"] * 2
    anchored = json.loads(_plan(models, *base, "--search", "--measured-step-s", repr(step)).stdout)
    carried = {r["sharding"]: r for r in anchored["search"]}
    assert anchored["anchor"]["reached"] and carried["none"]["step_time_s"] == pytest.approx(step, rel=1e-2)
    assert carried["fsdp"]["step_time_s"] > one["fsdp"]["step_time_s"] * 1.2      # the slower stack, sharded
    text = _plan(models, *base[:-1], "--search", *small).stdout
    assert "fastest that fits first" in text and "fsdp" in text


def test_train_writes_predicted_vs_measured_and_refits_the_calibration(models):
    import torch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 12, generator=g)
    torch.save({"inputs": x, "targets": (x[:, 0] > 0).long()}, models / "data.pt")
    run = models / "run"
    proc = run_cli("train", "--model", "usermodels:small", "--data", str(models / "data.pt"), "--steps", "12",
                   "--batch-size", "32", "--compile", "off", "--precision", "fp32", "--run-dir", str(run),
                   "--logging.progress", "off", "--train.eval_batches", "1", cwd=models, check=True)
    s = json.loads((run / "summary.json").read_text())
    p = s["predicted"]
    assert p["step_time_s"] > 0 and p["measured_step_time_s"] > 0
    assert p["measured_over_predicted"] == pytest.approx(p["measured_step_time_s"] / p["step_time_s"])
    assert "allocator events" in p["measured_memory_method"]
    # the traced peak against the allocator's: the same step, within a few small tensors
    assert 0.8 < p["memory_measured_over_predicted"] < 1.25, p
    assert "step memory" in proc.stdout and "predicted" in proc.stdout
    # the run refitted this machine's calibration, which `plan calibration` shows and plans use
    shown = json.loads(_plan(models, "calibration", "--json").stdout)
    assert shown["observations"][-1]["model"] == "usermodels:small"
    # each class the run measured was refitted; host (wall time less the profiled ops) can come
    # out as 0 s on a loaded machine, whose profiler inflates the ops, and is then left alone
    assert {"compute", "memory"} <= set(shown["factors"]) == set(shown["observations"][-1]["ratios"])
    calibrated = json.loads(_plan(models, "--model", "usermodels:small", "--input-shape", "12", "--batch-size", "32",
                                  "--precision", "fp32", "--json").stdout)
    assert calibrated["calibration"] == pytest.approx(shown["factors"])
    raw = json.loads(_plan(models, "--model", "usermodels:small", "--input-shape", "12", "--batch-size", "32",
                           "--precision", "fp32", "--json", "--no-calibration").stdout)
    assert raw["calibration"] == {"compute": 1.0, "memory": 1.0, "host": 1.0}
    assert "deleted" in _plan(models, "calibration", "--reset").stdout
    assert "no runs yet" in _plan(models, "calibration").stdout


def test_catalogued_gpu_with_fsdp_divides_model_states(models):
    one = json.loads(_plan(models, "--model", "usermodels:small", "--input-shape", "12", "--gpu", "h100-sxm",
                           "--precision", "bf16", "--json").stdout)
    eight = json.loads(_plan(models, "--model", "usermodels:small", "--input-shape", "12", "--gpu", "h100-sxm",
                             "--precision", "bf16", "--gpus", "8", "--sharding", "fsdp", "--json").stdout)
    assert one["hardware"] == "h100-sxm" and eight["n_devices"] == 8
    for k in ("parameters", "optimizer"):
        assert eight["memory_bytes"][k] == pytest.approx(one["memory_bytes"][k] / 8)
    assert eight["time_breakdown_s"]["communication"] > 0 == one["time_breakdown_s"]["communication"]


def test_a_frozen_embedding_under_an_lstm_plans(models):
    """A frozen parameter stopped the trace (MemTracker hooks every parameter for its gradient),
    and oneDNN's fused LSTM counted no FLOPs."""
    args = ("--model", "usermodels:tagger", "--input-shape", "20", "--input-dtype", "int64", "--batch-size", "4",
            "--precision", "fp32", "--json")
    gpu = json.loads(_plan(models, *args, "--gpu", "h100-sxm", check=True).stdout)
    trained = 2 * 4 * 32 * (16 + 32 + 2) + 64 * 5 + 5      # both directions: W_ih, W_hh, two biases; the head
    assert gpu["params"] == 100 * 16 + trained and gpu["trainable_params"] == trained
    # AdamW's m and v of what trains, and a step per trained tensor (8 LSTM, 2 head): none for the embedding
    assert gpu["memory_bytes"]["optimizer"] == 8 * trained + 4 * 10 and gpu["fits"] is True
    tokens = 4 * 20
    # per direction 4 gates x 32: forward, then input/hidden and weight gradients (3x); the head likewise
    lstm = 3 * 2 * tokens * 2 * (128 * 16 + 128 * 32)
    assert gpu["model_flops_per_step"] == lstm + 3 * 2 * tokens * 64 * 5


def _plan_hf_config(tmp_path, cfg: dict, *args: str) -> dict:
    """`tensorpilot plan --hf-config` on ``cfg`` with ``args``, its JSON; skipped where transformers
    cannot import. The CLI runs in a process that first makes this machine's torchvision importable
    (a CUDA build beside a CPU torch; benchmarks/user_models.py), as transformers imports it."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    root = Path(__file__).resolve().parents[2]
    code = ("import sys; from benchmarks.user_models import _torchvision_importable; _torchvision_importable(); "
            "from tensorpilot.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "plan", "--hf-config", str(tmp_path / "config.json"), *args,
                           "--json"], cwd=root, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "cannot import" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_hugging_face_config_builds_the_real_class(tmp_path):
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 64, "n_head": 2,
           "vocab_size": 500, "n_positions": 64}
    d = _plan_hf_config(tmp_path, cfg, "--batch-size", "2", "--input-shape", "32", "--precision", "fp32")
    assert d["model"].startswith("GPT2LMHeadModel")
    # parameters: token and position embeddings, 2 blocks, final norm (the head is tied)
    per_block = 2 * 64 + (64 * 192 + 192) + (64 * 64 + 64) + 2 * 64 + (64 * 256 + 256) + (256 * 64 + 64)
    assert d["params"] == 500 * 64 + 64 * 64 + 2 * per_block + 2 * 64


def test_a_configs_eager_attention_is_traced_as_written(tmp_path):
    """A config.json naming attn_implementation "eager" is traced with the scores materialised;
    without it, SDPA's fused kernel (on an H100, also with GPT-2's attention dropout). By hand:
    eager keeps at least the fp32 softmax output (B x H x L x L x 4 bytes) of every layer."""
    b, heads, seq, layers = 4, 2, 64, 2
    total = {}
    for attn in ("eager", None):
        cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": layers, "n_embd": 64,
               "n_head": heads, "vocab_size": 512, "n_positions": seq}
        if attn:
            cfg["attn_implementation"] = attn
        d = _plan_hf_config(tmp_path, cfg, "--gpu", "h100-sxm", "--batch-size", str(b), "--input-shape", str(seq),
                            "--precision", "fp32", "--optim", "none", "--loss", "sum")
        assert d["optimizer"] == "none" and d["memory_bytes"]["optimizer"] == 0
        total[attn] = d["memory_bytes"]["total"]
    assert total["eager"] - total[None] >= layers * b * heads * seq * seq * 4


def test_optimize_auto_ranks_a_user_model_by_its_traced_plan(models):
    import torch
    x = torch.randn(256, 12, generator=torch.Generator().manual_seed(1))
    torch.save({"inputs": x, "targets": (x[:, 0] > 0).long()}, models / "data.pt")
    run = models / "run"
    run_cli("train", "--model", "usermodels:small", "--data", str(models / "data.pt"), "--steps", "10",
            "--batch-size", "32", "--optimize", "auto", "--run-dir", str(run), "--logging.progress", "off",
            "--train.eval_batches", "1", "--no-engine.tune_cache", cwd=models, check=True)
    tuned = json.loads((run / "summary.json").read_text())["autotune"]
    assert tuned["trials"], tuned
    for t in tuned["trials"]:
        assert t["predicted_step_s"] > 0 and t["predicted_memory_bytes"] > 0, t
        assert "traced" in t["note"], t
