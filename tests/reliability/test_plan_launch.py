"""What a hostile-but-realistic user passes to `tensorpilot plan` and `tensorpilot launch`: every
case ends in the documented exit code and one sentence, or in a correct answer, and never in a
traceback, a hang or invalid output. Each case runs the real CLI in a subprocess (~0.3 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from battery import assert_clean_error, run

REFERENCE = Path(__file__).parents[1] / "unit" / "data" / "published_runs.csv"


def every_20th_published_run(tmp_path: Path) -> Path:
    """A CSV of every 20th row of the published-runs file (~380 rows of all sources and metrics): the
    whole file, validated once in tests/integration/test_cli_plan.py, takes half a minute."""
    lines = REFERENCE.read_text().splitlines()
    path = tmp_path / "sample.csv"
    path.write_text("\n".join([lines[0], *lines[1::20]]) + "\n")
    return path


def strict_json(text: str):
    """Parse as RFC 8259 JSON: NaN and Infinity, which json.dumps writes by default, are refused."""
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name} in the output")

    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------------------ plan

@pytest.mark.parametrize("args,needle", [
    # absurd sizes: a sentence, not a minute-long divisor walk, an overflow or a hang
    (["--search", "--gpus", "10000000000"], "--gpus must be between 1 and 10,000,000"),
    (["--search", "--gpus", "1000000000"], "--gpus must be between 1 and 10,000,000"),
    (["--seq-len", str(10**12)], "--seq-len must be between 1 and 1,000,000,000"),
    (["--global-batch", str(10**15)], "--global-batch must be between 1 and 1,000,000,000"),
    (["--micro-batch", str(10**21)], "--micro-batch must be between"),
    (["--tp", str(10**21)], "--tp must be between 1 and 10,000,000"),
    (["--tp", "100000", "--pp", "1000", "--dp", "1000"], "exceeds the planner's maximum of 10,000,000"),
    (["--pp", "2", "--schedule", "interleaved", "--virtual-stages", str(10**20)], "--virtual-stages must be between"),
    (["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "30"], "exceeds the 32 layers"),
    (["--pp", "2", "--virtual-stages", "2"], "--virtual-stages needs --schedule interleaved"),
    (["--search", "--top", str(10**26)], "--top must be between"),
    (["--gpus", "0"], "--gpus must be between 1"),
    # floats: finite and in range
    (["--tokens", "1e400", "--json"], "--tokens must be a finite number, got inf"),
    (["--tokens", "nan"], "--tokens must be a finite number"),
    (["--tokens", "0"], "--tokens must be above 0"),
    (["--price-per-hour", "nan", "--tokens", "1e12"], "--price-per-hour must be a finite number, got nan"),
    (["--price-per-hour", "-1"], "--price-per-hour must be at least 0"),
    (["--grid-intensity", "-5"], "--grid-intensity must be at least 0"),
    (["--grid-intensity", "inf"], "--grid-intensity must be a finite number"),
    # names, modes and combinations
    (["--model", "llama3-9b"], "did you mean llama3-8b"),
    (["--model", "missing.json"], "config file 'missing.json' does not exist"),
    (["--gpu", "h100-sxn"], "did you mean h100-sxm"),
    (["--gpu", ""], "unknown accelerator ''"),
    (["--inference", "--search"], "--search and --inference cannot be combined"),
    (["--search", "--deadline", "1d", "--tokens", "1e9"], "--search and --deadline cannot be combined"),
    (["--inference", "--batch", str(10**25)], "--batch must be between"),
    (["--inference", "--context", "0"], "--context must be between"),
    (["--inference", "--tp", "3"], "tp=3 does not divide the 32 attention heads"),
    (["--search", "--gpus", "8", "--gpu", "mi300x", "--objective", "cost"], "ranking by cost needs a price"),
    (["--deadline", "14d"], "--deadline needs --tokens"),
    (["--deadline", "abc", "--tokens", "1e12"], "cannot read duration 'abc'"),
    (["--deadline=-3d", "--tokens", "1e12"], "cannot read duration '-3d'"),
    (["--deadline", "0h", "--tokens", "1e12"], "duration '0h' must be more than 0"),
    (["--deadline", "1e400d", "--tokens", "1e12"], "must be more than 0 and finite"),
    (["--deadline", "14d", "--tokens", "1e12", "--gpu", "mi300x"], "mi300x has no catalog price"),
    (["validate"], "validate needs a CSV file"),
    (["validate", "/no/such.csv"], "does not exist"),
    (["extra"], "invalid choice"),
])
def test_plan_bad_input_is_one_sentence(tmp_path, args, needle):
    assert_clean_error(run("plan", *args, cwd=tmp_path, timeout=30), 2, needle)


@pytest.mark.parametrize("content,needle", [
    ('{"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2, "num_attention_heads": 2, '
     '"vocab_size": 8}', "hidden_size is 'big', not a whole number"),
    ('{"hidden_size": 64}', "lacks num_hidden_layers, num_attention_heads, vocab_size"),
    ("[]", "holds a JSON list"),
    ("{", "is not JSON"),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, '
     '"vocab_size": 8, "num_key_value_heads": 0}', "num_key_value_heads is 0"),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, '
     '"vocab_size": 8, "head_dim": "x"}', "head_dim is 'x', not a whole number"),
    ('{"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, '
     '"vocab_size": 8, "num_local_experts": "x"}', "num_local_experts is 'x', not a whole number"),
    ('{"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, '
     '"vocab_size": 8, "num_local_experts": 8}', "num_local_experts is 8: a mixture-of-experts model"),
], ids=["text-field", "missing-fields", "list", "truncated", "zero-kv-heads", "text-head-dim", "text-experts",
        "moe"])
def test_plan_bad_hf_config(tmp_path, content, needle):
    cfg = tmp_path / "config.json"
    cfg.write_text(content)
    assert_clean_error(run("plan", "--hf-config", str(cfg), cwd=tmp_path, timeout=30), 2, needle)
    assert_clean_error(run("plan", "--hf-config", str(tmp_path), cwd=tmp_path, timeout=30), 2, "is a directory")


@pytest.mark.parametrize("args", [
    ["--tokens", "1e30", "--price-per-hour", "1000000", "--grid-intensity", "10000"],   # the largest allowed
    ["--tokens", "1e12", "--price-per-hour", "0"],
    ["--search", "--gpus", "64", "--global-batch", "512"],
    ["--deadline", "14d", "--tokens", "1e12"],
    ["--inference", "--batch", "1000000000", "--context", "1000000000"],
    ["--list-models"],
    ["validate", "SAMPLE"],
])
def test_plan_json_is_strict_and_finite(tmp_path, args):
    args = [str(every_20th_published_run(tmp_path)) if a == "SAMPLE" else a for a in args]
    res = run("plan", *args, "--json", cwd=tmp_path, timeout=60)
    assert res.code == 0 and "Traceback" not in res.err, str(res)
    strict_json(res.out)


def test_plan_big_device_counts_answer_quickly(tmp_path):
    # 8,648,640 devices (448 divisors, the most up to the limit), a global batch they all divide
    res = run("plan", "--search", "--model", "llama3.1-405b", "--gpus", "8648640", "--global-batch",
              str(8_648_640 * 64), "--json", cwd=tmp_path, timeout=30)
    d = strict_json(res.out)
    assert res.code == 0 and d["ranked"] and d["search_s"] < 5, str(res)
    # a prime count: only tp = pp = 1 is possible, and nothing divides the default batch
    res = run("plan", "--search", "--gpus", "9999991", cwd=tmp_path, timeout=30)
    assert res.code == 1 and "no valid layout" in res.out and "Traceback" not in res.err, str(res)


def test_plan_validate_reports_bad_rows_and_keeps_going(tmp_path):
    lines = REFERENCE.read_text().splitlines()
    header, rows = lines[0], lines[1:44]                       # the 43 rows of split "reference"
    bad = [rows[0].replace("fp16 mixed", "fp7 weird", 1),     # unknown precision label
           rows[1].replace("A100-80GB", "Z900", 1),           # unknown accelerator
           ",".join(rows[2].split(",")[:12]),                 # a short row: columns missing
           rows[3].replace(",135,", ",lots,", 1)]             # a malformed published value
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join([header, *bad, *rows[4:]]) + "\n")
    res = run("plan", "validate", str(csv), "--json", cwd=tmp_path, timeout=30)
    assert res.code == 0, str(res)
    d = strict_json(res.out)
    assert d["counts"] == {"rows": 43, "predicted": 39, "not_modelled": 4}
    notes = [r["note"] for r in d["rows"][:4]]
    for note, reason in zip(notes, ["unknown precision label", "unknown accelerator 'Z900'",
                                    "the row lacks the columns", "column 'value' is 'lots'"]):
        assert reason in note, notes
    text = run("plan", "validate", str(csv), cwd=tmp_path, timeout=30).out
    assert "43 rows: 39 predicted, 4 not modelled" in text


def test_plan_validate_a_negative_size_is_not_predicted(tmp_path):
    header, first, *rest = REFERENCE.read_text().splitlines()[:44]   # the 43 rows of split "reference"
    assert first.split(",")[2] == "1.7"                    # MEG-01's params_b
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join([header, first.replace(",1.7,", ",-5,", 1), *rest]) + "\n")
    d = strict_json(run("plan", "validate", str(csv), "--json", cwd=tmp_path, timeout=30).out)
    row = d["rows"][0]
    assert row["predicted"] is None and "column 'params_b' is '-5', not a positive number" in row["note"]
    assert d["counts"] == {"rows": 43, "predicted": 42, "not_modelled": 1}


@pytest.mark.parametrize("content,needle", [
    ("", "is empty"),
    ("id,metric\n", "its header lacks value, unit, params_b, n_gpus"),
    ("id,metric,value,unit,params_b,n_gpus\n", "has a header but no rows"),
])
def test_plan_validate_bad_file(tmp_path, content, needle):
    csv = tmp_path / "runs.csv"
    csv.write_text(content)
    assert_clean_error(run("plan", "validate", str(csv), cwd=tmp_path, timeout=30), 2, needle)
    assert_clean_error(run("plan", "validate", str(tmp_path), cwd=tmp_path, timeout=30), 2, "is a directory")


# ------------------------------------------------------------------------------ launch

@pytest.mark.parametrize("args,needle", [
    (["slurm", "--name", "x\necho INJECTED"], "job name"),
    (["slurm", "--time", "1:00:00\necho INJECTED"], "is not a SLURM time"),
    (["slurm", "--partition", "gpu\necho INJECTED"], "partition"),
    (["slurm", "--checkpoint-dir", "$(echo INJECTED)"], "may name variables"),
    (["slurm", "--", "--data", "x\necho INJECTED"], "contains a line break"),
    (["slurm", "--", "--stepz", "5"], "does not accept"),
    (["slurm", "--", "--lr", "nan"], "optim.lr: expected a finite number, got 'nan'"),
    (["slurm", "--", "--steps", "0"], "train.steps must be a positive integer, got 0"),
    (["k8s", "--", "--precision", "fp64"], "engine.precision: expected one of auto"),
    (["k8s", "--name", "My_Job"], "DNS-1035 label"),
    (["k8s", "--namespace", "a.b"], "DNS-1123 label"),
    (["k8s", "--pvc-size", "lots"], "Kubernetes quantity"),
    (["k8s", "--nodes", "0"], "--nodes must be a whole number from 1"),
])
def test_launch_bad_input_is_one_sentence(tmp_path, args, needle):
    kind, *rest = args
    res = run("launch", kind, "--out", str(tmp_path / "job"), *rest, cwd=tmp_path, timeout=30)
    assert_clean_error(res, 2, needle)
    assert not (tmp_path / "job").exists() and "INJECTED" not in res.out


def test_launch_out_that_is_a_directory(tmp_path):
    assert_clean_error(run("launch", "slurm", "--out", str(tmp_path), cwd=tmp_path, timeout=30), 2, "is a directory")


def test_launch_out_dash_is_standard_output(tmp_path):
    """`--out - | sbatch`: the job file alone on stdout, no file named '-'."""
    res = run("launch", "slurm", "--out", "-", "--", "--steps", "5", cwd=tmp_path, timeout=30)
    assert res.code == 0 and res.err == "", str(res)
    assert res.out.startswith("#!/bin/bash\n") and res.out.rstrip().endswith("--steps 5")
    assert "wrote" not in res.out and not (tmp_path / "-").exists()
    res = run("launch", "k8s", "--out", "-", cwd=tmp_path, timeout=30)
    assert res.code == 0 and [json.loads(d)["kind"] for d in res.out.split("---\n")] == \
        ["PersistentVolumeClaim", "PyTorchJob"], str(res)
    assert list(tmp_path.iterdir()) == []
    help_text = run("launch", "slurm", "--help", cwd=tmp_path, timeout=30).out
    assert "'-' prints the job file on standard output" in " ".join(help_text.split())


def test_launch_out_with_a_trailing_slash_names_a_directory(tmp_path):
    # it used to write a file named 'newdir'
    res = run("launch", "slurm", "--out", "newdir/", cwd=tmp_path, timeout=30)
    assert_clean_error(res, 2, "'newdir/' names a directory; give a file name")
    assert list(tmp_path.iterdir()) == []


def test_launch_out_through_a_symlink_writes_its_target(tmp_path):
    """The job file replaces the link's target atomically; the link stays a link (a rename over
    the link itself would have turned it into a regular file)."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "train.sbatch").write_text("old job\n")
    link = tmp_path / "current.sbatch"
    link.symlink_to(jobs / "train.sbatch")
    dangling = tmp_path / "next.sbatch"
    dangling.symlink_to(jobs / "next.sbatch")            # a target that does not exist yet
    for out in (link, dangling):
        res = run("launch", "slurm", "--out", out.name, cwd=tmp_path, timeout=30)
        assert res.code == 0 and "Traceback" not in res.err, str(res)
        assert out.is_symlink() and out.read_text().startswith("#!/bin/bash")
    assert (jobs / "train.sbatch").read_text().startswith("#!/bin/bash")
    assert sorted(p.name for p in jobs.iterdir()) == ["next.sbatch", "train.sbatch"]   # no temporaries left


def test_launch_out_that_is_not_a_regular_file(tmp_path):
    # replacing a device or a FIFO by a job file (rename over it) would break the machine
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_clean_error(run("launch", "slurm", "--out", str(fifo), cwd=tmp_path, timeout=30), 2, "not a regular file")
    assert fifo.is_fifo()


def test_plan_and_launch_do_not_import_torch(tmp_path):
    # the planner is pure standard library, and checking train arguments is argparse only
    code = ("import sys; from tensorpilot.cli import main; "
            "assert main(['plan', '--search', '--gpus', '64', '--global-batch', '512', '--json']) == 0; "
            "assert main(['plan', 'validate', sys.argv[1], '--json']) == 0; "
            "assert main(['launch', 'slurm', '--out', sys.argv[2], '--', '--steps', '5']) == 0; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code, str(every_20th_published_run(tmp_path)),
                           str(tmp_path / "job.sbatch")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
