"""`tensorpilot launch slurm|k8s` job files, validated offline (and hostile input refused or made inert);
launcher helpers without processes."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tensorpilot.cli import main
from tensorpilot.config import ParallelConfig
from tensorpilot.errors import ConfigError
from tensorpilot.launch.jobfiles import check_quantity, check_slurm_time, sbatch_script
from tensorpilot.parallel.mesh import resolve_layout, slurm_env

# The fields of the Kubeflow training-operator's PyTorchJob CRD (kubeflow.org/v1) that we write,
# with their types from the CRD's openAPIV3Schema; the operator rejects a job without them.
PYTORCHJOB_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v1"}, "kind": {"const": "PyTorchJob"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {"type": "object", "required": ["pytorchReplicaSpecs"], "properties": {
            "elasticPolicy": {"type": "object", "properties": {
                "rdzvBackend": {"enum": ["c10d", "etcd", "etcd-v2"]},
                "minReplicas": {"type": "integer"}, "maxReplicas": {"type": "integer"},
                "maxRestarts": {"type": "integer"}}},
            "pytorchReplicaSpecs": {
                "type": "object", "required": ["Master"],
                "propertyNames": {"enum": ["Master", "Worker"]},
                "additionalProperties": {
                    "type": "object", "required": ["replicas", "template"],
                    "properties": {"replicas": {"type": "integer", "minimum": 1},
                                   "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
                                   "template": {"type": "object", "required": ["spec"]}}}},
        }},
    },
}


def k8s_docs(tmp_path, *args):
    out = tmp_path / "job.yaml"
    assert main(["launch", "k8s", "--out", str(out), *args]) == 0
    return [json.loads(d) for d in out.read_text().split("---\n") if d.strip()]


def test_pytorchjob_manifest_validates(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    kv = pytest.importorskip("kubernetes_validate")
    pvc, job = k8s_docs(tmp_path, "--nodes", "3", "--gpus", "4", "--", "--size", "large", "--steps", "100")
    kv.validate(pvc, "1.30.0", strict=True)             # a core kind: the real Kubernetes schema
    jsonschema.validate(job, PYTORCHJOB_SCHEMA)
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] + specs["Worker"]["replicas"] == 3
    pod = specs["Worker"]["template"]["spec"]
    kv.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod}, "1.30.0", strict=True)
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert "--nproc-per-node=4" in c["command"] and "--nnodes=3" in c["command"]
    assert c["command"][-4:] == ["--size", "large", "--steps", "100"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]


def test_sbatch_script_is_valid_bash(tmp_path):
    out = tmp_path / "job.sbatch"
    assert main(["launch", "slurm", "--nodes", "4", "--gpus", "8", "--out", str(out), "--", "--size", "large"]) == 0
    text = out.read_text()
    assert "#SBATCH --nodes=4" in text and "#SBATCH --gpus-per-node=8" in text
    assert "--nproc-per-node=8" in text and "--rdzv-backend=c10d" in text
    subprocess.run(["bash", "-n", str(out)], check=True)
    # the default run directory names $HOME and $SLURM_JOB_NAME: they must expand in the job
    mkdir = next(line for line in text.splitlines() if line.startswith("mkdir -p "))
    shown = subprocess.run(["bash", "-c", mkdir.replace("mkdir -p", "echo", 1)], capture_output=True, text=True,
                           env={"HOME": "/home/u", "SLURM_JOB_NAME": "job7", "PATH": "/usr/bin:/bin"}).stdout
    assert shown.strip() == "/home/u/tensorpilot-runs/job7"


def test_layout_must_fit_world():
    assert resolve_layout(ParallelConfig(tp=2), 4).dp == 2
    assert resolve_layout(ParallelConfig(pp=2, sharding="fsdp"), 4).tag == "fsdp2xpp2"
    with pytest.raises(ConfigError, match="needs 4 processes but 2 were started"):
        resolve_layout(ParallelConfig(tp=4), 2)


def test_slurm_environment_becomes_torch_env():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "12345",
           "MASTER_ADDR": "node01"}
    assert slurm_env(env) == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node01",
                              "MASTER_PORT": str(20000 + 12345 % 20000)}
    assert slurm_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == {}


# ------------------------------------------------------------------ hostile input to the job files

def launch(capsys, *args) -> tuple[int, str]:
    """`tensorpilot launch ARGS` in this process: (exit code, last line of stderr)."""
    code = main(["launch", *args])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err[-1] if err else ""


def test_a_newline_in_the_job_name_cannot_inject_a_command(tmp_path, capsys):
    out = tmp_path / "job.sbatch"
    code, line = launch(capsys, "slurm", "--name", "x\necho INJECTED", "--out", str(out))
    assert code == 2 and "job name 'x\\necho INJECTED' must be 1-128 letters" in line
    assert not out.exists()
    # the writer itself refuses it too: it is public API
    with pytest.raises(ConfigError, match="job name"):
        sbatch_script(nodes=1, gpus=1, train_args=[], job_name="x\necho INJECTED", time="1:00:00",
                      partition=None, checkpoint_dir="/scratch/run")


@pytest.mark.parametrize("text", ["30", "30:00", "24:00:00", "100:59:59", "0", "2-0", "2-12", "2-12:30",
                                  "2-23:59:59", "UNLIMITED", "infinite"])
def test_slurm_time_formats_accepted(text):
    check_slurm_time(text)


@pytest.mark.parametrize("text", ["", "1h", "-1", "1:2:3:4", "24:60:00", "1:00:60", "2-24", "2-1:60",
                                  "2-", "-2", "1:00:00\necho x", "1 :00", "1:00:00 ", "9" * 40])
def test_slurm_time_formats_refused(text):
    with pytest.raises(ConfigError, match="is not a SLURM time"):
        check_slurm_time(text)


@pytest.mark.parametrize("args,needle", [
    (["slurm", "--name", "a b"], "job name 'a b' must be 1-128 letters"),
    (["slurm", "--name=-x"], "starting with a letter or digit"),
    (["slurm", "--partition", "gpu\n#SBATCH --x"], "partition"),
    (["slurm", "--partition", "gpu;reboot"], "partition"),
    (["slurm", "--checkpoint-dir", "/s/$(touch PWNED)"], "may name variables"),
    (["slurm", "--checkpoint-dir", "/s/`touch PWNED`"], "no backticks"),
    (["slurm", "--checkpoint-dir", "${HOME:-$(touch PWNED)}"], "may name variables"),
    (["slurm", "--checkpoint-dir", "/s/a\nb"], "no control characters"),
    (["slurm", "--checkpoint-dir=-rf"], "no leading '-'"),
    (["slurm", "--nodes", "0"], "--nodes must be a whole number from 1 to 100,000"),
    (["slurm", "--gpus", "1000"], "--gpus must be a whole number from 1 to 64"),
    (["slurm", "--", "--data", "a\nb"], "contains a line break"),
    (["slurm", "--", "--stepz", "5"], "include '--stepz 5', which `tensorpilot train` does not accept"),
    (["slurm", "--", "--steps"], "argument --steps: expected one argument"),
    (["slurm", "--", "--run-dir", "/x"], "leave --run-dir out"),
    (["k8s", "--name", "Bad_Name"], "must be a DNS-1035 label"),
    (["k8s", "--name", "1abc"], "starting with a letter"),
    (["k8s", "--name", "a" * 55], "at most 54 characters"),
    (["k8s", "--name", "a" * 53, "--nodes", "1000"], "at most 52 characters"),   # a...-worker-998
    (["k8s", "--namespace", "Default"], "namespace 'Default' must be a DNS-1123 label"),
    (["k8s", "--namespace", "a" * 64], "must be a DNS-1123 label"),
    (["k8s", "--image", "img with space"], "--image 'img with space' must be an image reference"),
    (["k8s", "--image", ""], "must be an image reference"),
    (["k8s", "--pvc-size", "100GB"], "must be a positive Kubernetes quantity"),
    (["k8s", "--pvc-size", "0Gi"], "must be a positive Kubernetes quantity"),
    (["k8s", "--pvc-size=-5Gi"], "must be a positive Kubernetes quantity"),
    (["k8s", "--storage-class", "Fast_SSD"], "storage class 'Fast_SSD' must be a DNS-1123 subdomain"),
    (["k8s", "--max-restarts", "-1"], "--max-restarts must be a whole number from 0 to 1,000"),
    # the train arguments' values, by the run configuration's own types and rules
    (["slurm", "--", "--lr", "nan"], "train arguments after --: optim.lr: expected a finite number, got 'nan'"),
    (["slurm", "--", "--steps", "0"], "train arguments after --: train.steps must be a positive integer, got 0"),
    (["slurm", "--", "--precision", "fp64"], "engine.precision: expected one of auto, fp32, tf32, bf16, fp16"),
    (["slurm", "--", "--optim.betas", "0.9"], "optim.betas must be two numbers"),
    (["slurm", "--", "--model.d_model", "65", "--model.n_head", "2"], "must be divisible by model.n_head"),
    (["k8s", "--", "--batch-size", "-3"], "data.batch_size must be a positive integer, got -3"),
    (["k8s", "--", "--parallel.timeout_s", "inf"], "parallel.timeout_s: expected a finite number"),
])
def test_bad_job_settings_are_one_sentence(tmp_path, capsys, args, needle):
    out = tmp_path / "job"
    kind, *rest = args
    split = rest.index("--") if "--" in rest else len(rest)
    code, line = launch(capsys, kind, "--out", str(out), *rest[:split], *rest[split:])
    assert code == 2 and needle in line, line
    assert not out.exists()


def _stub(bin_dir, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_sbatch_quoting_keeps_hostile_text_inert(tmp_path):
    # Run the whole script under bash with scontrol, mkdir and srun replaced by stubs that record
    # their arguments: every hostile string must arrive as one literal argument, and the `touch`
    # each payload tries must never run.
    ckpt = """/scratch/${PROBE}/a b;c&d|e*'f"g\\h"""
    train = ["--data", "$(touch PWNED1)", "--data", "`touch PWNED2`", "--data", "; touch PWNED3",
             "--data", "' ; touch PWNED4 ; '", "--data", '" ; touch PWNED5 ; "', "--data", "*", "--data", "ünï €"]
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_script(nodes=2, gpus=4, train_args=train, job_name="job", time="1:00:00",
                                    partition="gpu", checkpoint_dir=ckpt))
    subprocess.run(["bash", "-n", str(script)], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "scontrol", "echo node01")
    _stub(bin_dir, "mkdir", 'printf "%s\\n" "$@" > "$LOG/mkdir"')
    _stub(bin_dir, "srun", 'printf "%s\\n" "$@" > "$LOG/srun"')
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(tmp_path), "PROBE": "p", "HOME": str(tmp_path),
           "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_JOB_ID": "7", "LC_ALL": "C.UTF-8"}
    subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, check=True)
    expanded = ckpt.replace("${PROBE}", "p")
    assert (tmp_path / "mkdir").read_text().splitlines() == ["-p", expanded]
    srun = (tmp_path / "srun").read_text().splitlines()
    assert srun[srun.index("train") + 1:] == ["--run-dir", expanded, *train]
    assert "--rdzv-endpoint=node01:29500" in srun
    assert not list(tmp_path.glob("PWNED*"))


def test_k8s_keeps_arguments_literal_and_one_node_valid(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    pvc, job = k8s_docs(tmp_path, "--nodes", "1", "--gpus", "2", "--", "--data", "$(HOME)/x$y")
    jsonschema.validate(job, PYTORCHJOB_SCHEMA)
    # Kubernetes expands $(VAR) in a command and reads $$ as $: the argument survives as typed
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"][-2:] == \
        ["--data", "$$(HOME)/x$$y"]
    # the operator's webhook refuses an elasticPolicy without workers: one node has none
    assert "elasticPolicy" not in job["spec"] and "Worker" not in job["spec"]["pytorchReplicaSpecs"]
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] == 1


@pytest.mark.parametrize("size", ["100Gi", "1Ti", "500G", "1.5Ti", "1e12", "2048"])
def test_quantities_accepted(size):
    check_quantity("--pvc-size", size)


def test_out_must_be_a_writable_file(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for out, needle in [(tmp_path, "is a directory; give a file name"),
                        (tmp_path / "file" / "job.sbatch", "is a file, not a directory"),
                        (tmp_path / ("n" * 300), "the name is too long")]:
        code, line = launch(capsys, "slurm", "--out", str(out))
        assert code == 2 and needle in line, line
    if os.geteuid() != 0:                # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        code, line = launch(capsys, "slurm", "--out", str(locked / "job.sbatch"))
        assert code == 2 and "permission denied" in line, line
    # a good file replaces the old one whole (write_atomic), and leaves no temporary behind
    out = tmp_path / "job.sbatch"
    out.write_text("old")
    assert main(["launch", "slurm", "--out", str(out)]) == 0
    assert out.read_text().startswith("#!/bin/bash") and sorted(p.name for p in tmp_path.iterdir()) == \
        sorted(["file", "job.sbatch"] + (["locked"] if os.geteuid() != 0 else []))


def test_train_paths_are_the_clusters_and_are_not_looked_up(tmp_path, capsys):
    # --data and --config name the cluster's storage: absent here, accepted into the job file
    out = tmp_path / "job.sbatch"
    code, line = launch(capsys, "slurm", "--out", str(out), "--", "--data", "/cluster/corpus.txt",
                        "--data.targets_path", "/cluster/y.npy", "--config", "/cluster/run.toml", "--lr", "1e-4")
    assert code == 0, line
    assert "--data /cluster/corpus.txt" in out.read_text()


def test_out_dash_prints_the_job_file_and_nothing_else(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["launch", "slurm", "--out", str(tmp_path / "job.sbatch"), "--", "--steps", "5"]) == 0
    capsys.readouterr()
    assert main(["launch", "slurm", "--out", "-", "--", "--steps", "5"]) == 0
    printed = capsys.readouterr()
    assert printed.out == (tmp_path / "job.sbatch").read_text() and printed.err == ""
    assert not (tmp_path / "-").exists()
    assert main(["launch", "k8s", "--out", "-"]) == 0
    docs = capsys.readouterr().out.split("---\n")
    assert [json.loads(d)["kind"] for d in docs] == ["PersistentVolumeClaim", "PyTorchJob"]
