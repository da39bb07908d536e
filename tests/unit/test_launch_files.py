"""`tensorpilot launch slurm|k8s` job files, validated offline; launcher helpers without processes."""

from __future__ import annotations

import json
import subprocess

import pytest

from tensorpilot.cli import main
from tensorpilot.config import ParallelConfig
from tensorpilot.errors import ConfigError
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
    assert resolve_layout(ParallelConfig(pp=2, sharding="fsdp"), 4).name == "fsdp2xpp2"
    with pytest.raises(ConfigError, match="needs 4 processes but 2 were started"):
        resolve_layout(ParallelConfig(tp=4), 2)


def test_slurm_environment_becomes_torch_env():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "12345",
           "MASTER_ADDR": "node01"}
    assert slurm_env(env) == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node01",
                              "MASTER_PORT": str(20000 + 12345 % 20000)}
    assert slurm_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == {}
