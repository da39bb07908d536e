"""Kubernetes manifests validated offline: core kinds against the Kubernetes OpenAPI schemas
(kubernetes-validate, strict: unknown fields fail), the KEDA ScaledObject against its CRD's
required structure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tensorpilot.serve import k8s

kv = pytest.importorskip("kubernetes_validate")
yaml = pytest.importorskip("yaml")

K8S_VERSION = "1.30.0"
# the parts of KEDA's ScaledObject CRD (keda.sh/v1alpha1) these manifests use
SCALED_OBJECT_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"}, "kind": {"const": "ScaledObject"},
        "spec": {"type": "object", "required": ["scaleTargetRef", "triggers"], "additionalProperties": False,
                 "properties": {
                     "scaleTargetRef": {"type": "object", "required": ["name"]},
                     "minReplicaCount": {"type": "integer", "minimum": 0},
                     "maxReplicaCount": {"type": "integer", "minimum": 1},
                     "cooldownPeriod": {"type": "integer"},
                     "triggers": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "required": ["type", "metadata"],
                         "properties": {"type": {"type": "string"}, "metadata": {
                             "type": "object", "additionalProperties": {"type": "string"},
                             "required": ["serverAddress", "query", "threshold"]}}}}}},
    },
}


@pytest.fixture()
def run_dir(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000002"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"config": {"model": {"name": "cnn"}}, "workload": {"kind": "cnn"}}))
    return tmp_path / "run"


def _deploy(run_dir: Path, out: Path, *extra: str) -> dict[str, dict]:
    from tensorpilot.cli import main

    assert main(["deploy", "k8s", "--run", str(run_dir), "--out", str(out), *extra]) == 0
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(out.glob("*.yaml"))}


def test_gpu_deployment_service_and_hpa_are_valid(run_dir, tmp_path):
    docs = _deploy(run_dir, tmp_path / "k8s", "--gpus", "1")
    assert set(docs) == {"deployment.yaml", "service.yaml", "hpa.yaml"}
    for doc in docs.values():
        kv.validate(doc, K8S_VERSION, strict=True)
    pod = docs["deployment.yaml"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["args"][:3] == ["serve", "--run", k8s.MOUNT] and "0.0.0.0" in c["args"]
    assert pod["terminationGracePeriodSeconds"] > 30          # longer than --graceful-timeout
    metric = docs["hpa.yaml"]["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric == "tensorpilot_serve_queue_depth"


def test_cpu_only_and_keda(run_dir, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    docs = _deploy(run_dir, tmp_path / "k8s", "--gpus", "0", "--autoscaler", "keda",
                   "--serve-args", "--max-batch-size 64")
    kv.validate(docs["deployment.yaml"], K8S_VERSION, strict=True)
    c = docs["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in c["resources"]["limits"] and c["args"][-2:] == ["--max-batch-size", "64"]
    jsonschema.validate(docs["scaledobject.yaml"], SCALED_OBJECT_SCHEMA)
    assert "tensorpilot_serve_queue_depth" in docs["scaledobject.yaml"]["spec"]["triggers"][0]["metadata"]["query"]


def test_validator_is_not_vacuous():
    bad = k8s.service(name="x", namespace="default")
    bad["spec"]["portz"] = []
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)


def test_every_serve_and_deploy_option_is_documented():
    from tensorpilot.cli import build_parser

    subs = build_parser()._subcommands
    k8s_parser = next(a for a in subs["deploy"]._actions if a.dest == "target").choices["k8s"]
    for parser in (subs["serve"], k8s_parser):
        for action in parser._actions:
            assert action.help, (parser.prog, action.option_strings)


def test_cli_import_stays_light():
    import subprocess
    import sys

    code = ("import sys, tensorpilot.cli as c; c.build_parser(); "
            "print(any(m in sys.modules for m in ('torch', 'fastapi', 'uvicorn')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
