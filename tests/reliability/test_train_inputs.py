"""Bad input to train, generate and hw: the documented exit code and one sentence, no traceback,
and (where it matters) no work started: the error comes before data is loaded or a model built.

Cases are grouped by what the user got wrong; each table row is (arguments, exit code, words
the sentence must contain). Files a case needs are made by ``_files`` in the case's directory.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from battery import TINY, assert_clean_error, run

LONG = "x" * 300           # longer than NAME_MAX (255) on every common file system


def _files(d):
    (d / "afile").write_text("not a directory")
    (d / "bool.toml").write_text('[train]\nsteps = true\n')
    (d / "list.toml").write_text('[train]\nsteps = [1]\n')
    (d / "table.toml").write_text('[train]\nsteps = {a = 1}\n')
    (d / "date.toml").write_text('[train]\nsteps = 1979-05-27\n')
    (d / "float.toml").write_text('[train]\nsteps = 1.5\n')
    (d / "device.toml").write_text('[train]\ndevice = [1]\n')
    (d / "section.toml").write_text('train = 3\n')
    (d / "latin1.toml").write_bytes('[train]\n# caf\xe9\n'.encode("latin-1"))
    np.save(d / "x1d.npy", np.arange(10, dtype=np.float32))                 # no feature dimension
    np.save(d / "x0d.npy", np.array(3.0, dtype=np.float32))                 # a single value
    np.save(d / "x.npy", np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32))
    np.save(d / "yneg.npy", np.array([0, 1, -1, 0, 1, 0, 1, 0, 1, 0]))
    np.save(d / "yhuge.npy", np.array([0, 1, 10**12, 0, 1, 0, 1, 0, 1, 0]))
    np.save(d / "yfloat.npy", np.linspace(0, 1, 10))
    np.save(d / "ystr.npy", np.array(["a"] * 10))
    np.savez(d / "xy.npz", inputs=np.zeros((10, 4), np.float32), targets=np.full(10, 11))
    np.savez(d / "ids.npz", inputs=np.full((10, 4), 7.0, np.float32), targets=np.zeros(10, np.int64))  # ids >= 3
    (d / "mymodels.py").write_text(
        "import torch\n"
        "def needs_args(width):\n    return torch.nn.Linear(4, width)\n"
        "def raises():\n    raise ValueError('bad factory')\n"
        "def ten_classes():\n    return torch.nn.Linear(4, 10)\n"
        "def not_a_model():\n    return 42\n"
        "def five_inputs():\n    return torch.nn.Linear(5, 10)\n"
        "class SmallVocab(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.emb = torch.nn.Embedding(3, 10)\n"
        "    def forward(self, x):\n        return self.emb(x.long()).mean(1)\n"
        "NOT_CALLABLE = 3\n")
    (d / "broken.py").write_text("def oops(:\n")
    os.mkfifo(d / "fifo")
    (d / "deep.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")


CASES = [
    # --- TOML values of the wrong type: a sentence naming the setting, not a TypeError
    (["--config", "bool.toml"], 2, ["train.steps", "integer"]),
    (["--config", "list.toml"], 2, ["train.steps", "a list"]),
    (["--config", "table.toml"], 2, ["train.steps", "a table"]),
    (["--config", "date.toml"], 2, ["train.steps", "a date"]),
    (["--config", "float.toml"], 2, ["train.steps", "integer"]),
    (["--config", "device.toml"], 2, ["train.device", "string"]),
    (["--config", "section.toml"], 2, ["[train]", "table"]),
    (["--config", "latin1.toml"], 2, ["utf-8"]),
    (["--config", "."], 2, ["config file", "directory"]),
    (["--config", "/dev/zero"], 2, ["config file", "not a regular file"]),       # would never end
    (["--config", "fifo"], 2, ["config file", "not a regular file"]),            # would block
    (["--config", "deep.toml"], 2, ["config file"]),
    # --- numbers that pass a type check but are not values
    (["--lr", "nan"], 2, ["optim.lr", "finite"]),
    (["--lr", "inf"], 2, ["optim.lr", "finite"]),
    (["--lr", "-1"], 2, ["optim.lr", "positive"]),
    (["--optim.weight_decay", "nan"], 2, ["optim.weight_decay", "finite"]),
    (["--optim.grad_clip", "nan"], 2, ["optim.grad_clip", "finite"]),
    (["--optim.betas", "0.9,nan"], 2, ["optim.betas", "finite"]),
    (["--parallel.timeout_s", "nan"], 2, ["parallel.timeout_s", "finite"]),
    (["--parallel.timeout_s", "1e30"], 2, ["parallel.timeout_s", "a week"]),
    (["--parallel.timeout_s", "0.5"], 2, ["parallel.timeout_s", "from 1"]),
    (["--parallel.bucket_mb", "1e30"], 2, ["parallel.bucket_mb", "at most"]),
    (["--seed", str(2**70)], 2, ["train.seed"]),
    (["--seed", "-1"], 2, ["train.seed"]),
    (["--nproc", "1e9"], 2, ["parallel.nproc"]),
    (["--data.num_workers", "100000"], 2, ["data.num_workers"]),
    (["--engine.grad_accum", "1e8"], 2, ["engine.grad_accum"]),                  # all held at once
    (["--train.eval_batches", "1e30"], 2, ["train.eval_batches"]),
    (["--model", "mlp", "--model.hidden", "1e30"], 2, ["model.hidden"]),
    (["--model", "cnn", "--model.channels", "1e30"], 2, ["model.channels"]),
    (["--run-dir", "control\x7fchars", "--print-config"], 0, []),              # written as valid TOML
    (["--engine.tune_budget", "inf"], 2, ["engine.tune_budget", "finite"]),
    (["--device", "cpu:abc"], 2, ["unknown device"]),
    (["--device", "cuda:0:1"], 2, ["unknown device"]),
    (["--run-dir", "a\nb"], 2, ["run_dir", "line break"]),
    (["--parallel.nnodes", "2", "--parallel.node_rank", "7"], 2, ["node_rank"]),
    (["--parallel.rdzv_endpoint", "host;rm -rf /:1"], 2, ["rdzv_endpoint"]),
    # --- paths: named in one sentence before any data is loaded
    (["--run-dir", "afile"], 2, ["run directory", "is a file"]),
    (["--run-dir", "afile/sub"], 2, ["run directory", "file"]),
    (["--run-dir", LONG], 2, ["run directory", "too long"]),
    (["--run-dir", "/proc/tensorpilot-test"], 2, ["run directory", "not a writable directory"]),
    (["--data", "afile/x.txt"], 2, ["data.path", "does not exist"]),
    (["--data", LONG], 2, ["data.path"]),
    (["--resume", "nowhere"], 1, ["does not exist"]),
    (["--resume", "afile"], 1, ["is a file"]),
    (["--resume", "."], 1, ["no complete checkpoint"]),
    (["--resume", LONG], 1, [LONG[:20]]),
    # --- data files a user may have
    (["--model", "mlp", "--data", "x1d.npy", "--data.targets_path", "yneg.npy"], 2, ["2 dimensions", "(10, 1)"]),
    (["--model", "mlp", "--data", "x0d.npy", "--data.targets_path", "yneg.npy"], 2, ["0-d"]),
    (["--model", "mlp", "--data", "x.npy", "--data.targets_path", "yneg.npy"], 2, ["class index -1"]),
    (["--model", "mlp", "--data", "x.npy", "--data.targets_path", "yhuge.npy"], 2, ["class index 1000000000000"]),
    (["--model", "mlp", "--data", "x.npy", "--data.targets_path", "yfloat.npy"], 2, ["integer class indices"]),
    (["--model", "mlp", "--data", "x.npy", "--data.targets_path", "ystr.npy"], 2, ["ystr.npy"]),
    (["--model", "mlp", "--data", "."], 2, ["unsupported data file"]),
    (["--model", "mymodels:ten_classes", "--data", "xy.npz"], 2, ["class index 11", "10 scores"]),
    # --- sizes that cannot fit: the planner answers before anything is allocated
    (["--batch-size", "1e9"], 2, ["does not fit", "GiB"]),
    (["--model.d_model", "4e6", "--model.n_head", "4"], 2, ["does not fit", "GiB"]),
    (["--model.seq_len", "1e8"], 2, ["seq_len"]),
    (["--model", "mlp", "--model.hidden", "10000000"], 2, ["does not fit"]),
    (["--model", "cnn", "--data.input_shape", "3,100000,100000"], 2, ["GiB"]),
    (["--model", "cnn", "--data.num_classes", "1e9"], 2, ["num_classes"]),
    # --- the user's factory
    (["--model", "mymodels:needs_args"], 2, ["callable without arguments"]),
    (["--model", "mymodels:raises"], 2, ["ValueError", "mymodels.py:5", "bad factory"]),
    (["--model", "mymodels:not_a_model", "--data", "xy.npz"], 2, ["nn.Module"]),
    (["--model", "mymodels:NOT_CALLABLE"], 2, ["not a function"]),
    # --- a model whose forward fails on the data: where, and what to check
    (["--model", "mymodels:five_inputs", "--data", "xy.npz"], 2, ["mymodels:five_inputs", "RuntimeError",
                                                                 "shapes cannot be multiplied", "model's inputs"]),
    (["--model", "mymodels:SmallVocab", "--data", "ids.npz"], 2, ["IndexError at mymodels.py:", "index out of range"]),
    (["--model", "broken:oops"], 2, ["SyntaxError"]),
    (["--model", "mymodels:nothing"], 2, ["no attribute"]),
]


@pytest.mark.parametrize("args,code,needles", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_train_bad_input(args, code, needles, tmp_path):
    _files(tmp_path)
    res = run("train", *args, "--steps", "2", "--logging.progress", "off", cwd=tmp_path, timeout=60)
    if code == 0:                              # --print-config: the TOML it prints reads back
        assert res.code == 0, str(res)
        (tmp_path / "printed.toml").write_text(res.out)
        back = run("train", "--config", "printed.toml", "--print-config", cwd=tmp_path)
        assert back.code == 0 and back.out == res.out, str(back)
        return
    assert_clean_error(res, code, *needles)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("step_*")), \
        "a refused run wrote a checkpoint"


def _gpt_run(d):
    res = run("train", *TINY, "--steps", "2", "--run-dir", str(d / "run"), cwd=d)
    assert res.code == 0, str(res)
    return d / "run"


GENERATE_CASES = [
    (["--device", "garbage"], 2, ["unknown device 'garbage'"]),
    (["--top-k", "-1"], 2, ["--top-k"]),
    (["--temperature", "nan"], 2, ["--temperature", "finite"]),
    (["--temperature", "-1"], 2, ["--temperature"]),
    (["--seed", str(2**70)], 2, ["--seed"]),
    (["--tokens", "0"], 2, ["--tokens"]),
    (["--tokens", "1e12"], 2, ["--tokens"]),
    (["--device", "cuda:7"], 2, ["device"]),
]


def test_generate_bad_input(tmp_path):
    run_dir = _gpt_run(tmp_path)
    for args, code, needles in GENERATE_CASES:
        assert_clean_error(run("generate", "--run", str(run_dir), *args, cwd=tmp_path), code, *needles)
    (tmp_path / "afile").write_text("x")
    assert_clean_error(run("generate", "--run", "afile", cwd=tmp_path), 1, "is a file")
    assert_clean_error(run("generate", "--run", LONG, cwd=tmp_path), 1)
    # a prompt with bytes that are not UTF-8 (a shell passes them through) is continued, not refused
    res = run("generate", "--run", str(run_dir), "--tokens", "5", "--prompt", "caf\udce9", cwd=tmp_path)
    assert res.code == 0, str(res)
    # a tiny temperature is greedy decoding, not a NaN softmax; RUN/checkpoints names the run too
    greedy = run("generate", "--run", str(run_dir), "--tokens", "8", "--temperature", "0", cwd=tmp_path)
    tiny = run("generate", "--run", str(run_dir / "checkpoints"), "--tokens", "8", "--temperature", "1e-300",
               cwd=tmp_path)
    assert greedy.code == tiny.code == 0 and greedy.out == tiny.out, str(tiny)


def test_hw_bad_input(tmp_path):
    assert_clean_error(run("hw", "--gpu", "no-such-gpu-9000", cwd=tmp_path), 2, "no-such-gpu-9000")
    assert_clean_error(run("hw", "--gpu", "", cwd=tmp_path), 2, "unknown accelerator ''")
    assert_clean_error(run("hw", "--allreduce-procs", "-1", cwd=tmp_path), 2, "--allreduce-procs")


def test_a_malformed_or_unwritable_cache_is_measured_again_not_trusted(tmp_path):
    """The measurement cache is a file anyone may edit: a malformed one is ignored (and, where
    the directory is writable, replaced); an unwritable one only costs re-measuring."""
    import shutil

    cache = tmp_path / "cache"
    shutil.copytree(os.environ["TENSORPILOT_CACHE"], cache)          # the session's measurements
    run("train", *TINY, "--steps", "1", "--run-dir", "r0", cwd=tmp_path, env={"TENSORPILOT_CACHE": str(cache)})
    probes = list(cache.glob("probe-*.json"))
    assert probes, "the trainer measured a ceiling and cached it"
    probes[0].write_text("[1, 2]")
    res = run("train", *TINY, "--steps", "1", "--run-dir", "r1", cwd=tmp_path, env={"TENSORPILOT_CACHE": str(cache)})
    assert res.code == 0 and (tmp_path / "r1" / "summary.json").exists(), str(res)
    probes[0].write_text('{"devices": [{"device": "cpu", "name": "x", "matmul_flops": {"fp32": "fast"}}]}')
    assert run("hw", cwd=tmp_path, env={"TENSORPILOT_CACHE": str(cache)}).code == 0
    (tmp_path / "afile").write_text("x")                               # a cache "directory" that is a file
    res = run("hw", "--probe", "--quick", "--allreduce-procs", "0", cwd=tmp_path,
              env={"TENSORPILOT_CACHE": str(tmp_path / "afile")})
    assert res.code == 0 and "not cached" in res.out and "TENSORPILOT_CACHE" in res.out, str(res)
