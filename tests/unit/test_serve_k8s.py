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


# --------------------------------------------------------------------------- hostile input

def _deploy_error(capsys, run_dir: Path, out: Path, *extra: str) -> str:
    """`deploy k8s` that must fail: exit 2 (or 1), one line on stderr, nothing written."""
    from tensorpilot.cli import main

    capsys.readouterr()
    try:
        code = main(["deploy", "k8s", "--run", str(run_dir), "--out", str(out), *extra])
    except SystemExit as exc:                   # argparse
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code in (1, 2) and err and "Traceback" not in "\n".join(err), (code, err)
    try:
        written = list(out.glob("*.yaml")) if out.is_dir() else []
    except OSError:                             # a name too long to even look at
        written = []
    assert not written, "manifests written despite the error"
    return err[-1]


BAD = [
    (["--name", "Bad_Name"], "dns label"), (["--name", "1abc"], "starting with a lowercase letter"),
    (["--name", "a" * 64], "at most 63"), (["--name", "a-"], "dns label"),
    (["--namespace", "Prod"], "--namespace"), (["--pvc", "my_pvc"], "dns subdomain"),
    (["--pvc", "a." * 130], "dns subdomain"),
    (["--image", "bad image"], "image reference"), (["--image", "img\nevil: true"], "image reference"),
    (["--image", "Team/App"], "image reference"), (["--image", ""], "image reference"),
    (["--serve-args", "--name 'unbalanced"], "check the quotes"),
    (["--serve-args", "--max-batch-size 64\n--port 1"], "one line"),
    (["--serve-args", "--port 9000"], "must not set --port"), (["--serve-args", "--host 127.0.0.1"], "--host"),
    (["--serve-args", "--run /elsewhere"], "--run"), (["--serve-args", "--weights w.safetensors"], "--weights"),
    (["--serve-args", "--api-key s3cret"], "plain text"),
    (["--serve-args", "--max-batch-size 1000000000"], "--max-batch-size"),
    (["--serve-args=--frobnicate"], "unrecognized arguments"), (["--serve-args=-h"], "help"),
    (["--serve-args", "--model pkg.mod:make"], "leave --model out"),
    (["--serve-args", "--name a/b"], "--name"),
    (["--gpus", "-1"], "--gpus"), (["--replicas", "0"], "--replicas"),
    (["--max-replicas", str(2**31)], "--max-replicas"),
    (["--replicas", "3", "--max-replicas", "2"], "below --replicas"),
    (["--prometheus-url", "ftp://prometheus"], "--prometheus-url"),
    (["--prometheus-url", "http://a b"], "--prometheus-url"),
]


@pytest.mark.parametrize("extra, needle", BAD, ids=[" ".join(e)[:40] for e, _ in BAD])
def test_bad_deploy_input_is_one_sentence_and_writes_nothing(extra, needle, run_dir, tmp_path, capsys):
    line = _deploy_error(capsys, run_dir, tmp_path / "k8s", *extra)
    assert needle.lower() in line.lower(), line


def test_bad_paths_are_one_sentence(run_dir, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    cases = [(run_dir, tmp_path / "afile", "is a file"),
             (run_dir, tmp_path / "afile" / "k8s", "a part of the path is a file"),
             (run_dir, tmp_path / ("x" * 300), "too long"), (tmp_path / "missing", tmp_path / "k8s", "does not exist"),
             (tmp_path / "afile", tmp_path / "k8s", "is a file"),
             (tmp_path, tmp_path / "k8s", "no complete checkpoint")]
    for run, out, needle in cases:
        line = _deploy_error(capsys, run, out)
        assert needle in line, (run, out, line)


def test_custom_runs_need_their_factory_in_serve_args(run_dir, tmp_path, capsys):
    meta_path = next(run_dir.glob("checkpoints/*/meta.json"))
    meta_path.write_text(json.dumps({"config": {"model": {"name": "pkg.nets:make"}}, "workload": {"kind": "custom"}}))
    assert "--model package.module:factory" in _deploy_error(capsys, run_dir, tmp_path / "a")
    assert "not the factory" in _deploy_error(capsys, run_dir, tmp_path / "b", "--serve-args", "--model pkg.nets:other")
    docs = _deploy(run_dir, tmp_path / "k8s", "--serve-args", "--model pkg.nets:make --input-shape 3,32,32")
    args = docs["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--model") + 1] == "pkg.nets:make" and args[args.index("--name") + 1] == "make"
    assert docs["deployment.yaml"]["metadata"]["name"] == "tensorpilot-make"


def test_every_user_string_is_one_yaml_scalar(run_dir, tmp_path):
    """Values full of YAML syntax that are still valid come back from the files unchanged."""
    image = "registry.example.com:5000/team/app_x:v1.0-rc_1@sha256:" + "a" * 64
    url = "http://prom:80/api?q=a:b&c={d},'x'#e:[f]"
    serve_args = "--input-shape 3,32,32 --max-queue-delay-ms 2.5 --name 'a-b.c' --drain-window 3"
    docs = _deploy(run_dir, tmp_path / "k8s", "--image", image, "--prometheus-url", url, "--autoscaler", "keda",
                   "--serve-args", serve_args, "--namespace", "ml-prod", "--pvc", "runs.store-1")
    c = docs["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == image and c["args"][-8:] == ["--input-shape", "3,32,32", "--max-queue-delay-ms", "2.5",
                                                      "--name", "a-b.c", "--drain-window", "3"]
    assert docs["scaledobject.yaml"]["spec"]["triggers"][0]["metadata"]["serverAddress"] == url
    pod = docs["deployment.yaml"]["spec"]["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "runs.store-1"
    # preStop 5 s + drain window 3 s + graceful timeout 30 s, + 10 s margin
    assert pod["terminationGracePeriodSeconds"] == 48
    for name in ("deployment.yaml", "service.yaml", "scaledobject.yaml"):
        assert len(list(yaml.safe_load_all((tmp_path / "k8s" / name).read_text()))) == 1
    kv.validate(docs["deployment.yaml"], K8S_VERSION, strict=True)
