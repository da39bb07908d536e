"""tensorpilot.k8s: the Kubernetes name, image and quantity rules `deploy k8s` and `launch k8s`
share, against names picked from the rules in the Kubernetes docs
(https://kubernetes.io/docs/concepts/overview/working-with-objects/names/), and the YAML
rendering of manifests."""

from __future__ import annotations

import pytest

from tensorpilot import k8s
from tensorpilot.errors import ConfigError, UsageError

LABEL_OK = ["a", "0", "my-name", "123-abc", "a" * 63, "x1-y2"]
LABEL_BAD = ["", "A", "my_name", "my.name", "-a", "a-", "a" * 64, "ä", "a b", "a\n", None]


@pytest.mark.parametrize("value", LABEL_OK)
def test_rfc1123_label_accepted(value):
    assert k8s.is_dns1123_label(value) and k8s.check_dns_label("namespace", value) == value


@pytest.mark.parametrize("value", LABEL_BAD)
def test_rfc1123_label_refused(value):
    assert not k8s.is_dns1123_label(value)
    with pytest.raises(ConfigError, match="must be a DNS-1123 label"):
        k8s.check_dns_label("namespace", value)


def test_rfc1035_label_is_an_rfc1123_label_that_starts_with_a_letter():
    for value in ["a", "my-name", "a" * 63, "x1-y2"]:
        assert k8s.is_dns1035_label(value) and k8s.check_dns1035_label("--name", value) == value
    for value in ["0", "123-abc", "1abc", *LABEL_BAD]:
        assert not k8s.is_dns1035_label(value), value
        with pytest.raises(ConfigError, match="starting with a lowercase letter"):
            k8s.check_dns1035_label("--name", value)
    # a shorter bound where the name is the prefix of a longer label (NAME-worker-N)
    assert k8s.is_dns1035_label("a" * 54, max_length=54) and not k8s.is_dns1035_label("a" * 55, max_length=54)


@pytest.mark.parametrize("value", ["example.com", "my-claim", "runs.store-1", "a" * 253, "0.a", "a" * 64 + ".b"])
def test_subdomain_accepted(value):
    # Kubernetes bounds the whole name at 253 and sets no 63-character bound on each part
    assert k8s.is_dns1123_subdomain(value) and k8s.check_dns_subdomain("--pvc", value) == value


@pytest.mark.parametrize("value", ["", "My-Claim", "my_claim", ".a", "a.", "a..b", "a.-b", "a" * 254, "a/b", None])
def test_subdomain_refused(value):
    assert not k8s.is_dns1123_subdomain(value)
    with pytest.raises(ConfigError, match="must be a DNS-1123 subdomain"):
        k8s.check_dns_subdomain("--pvc", value)


@pytest.mark.parametrize("image", [
    "nginx", "nginx:1.27", "library/nginx:latest", "ghcr.io/org/tensorpilot:1.0",
    "registry.example.com:5000/team/app_x:v1.0-rc_1", "localhost:5000/a__b/c-d.e",
    "nginx@sha256:" + "a" * 64, "ghcr.io/org/app:1.0@sha256:" + "0" * 64, "[::1]:5000/app",
    "Registry.Example.com/app", "a/" + "b" * 253,
])
def test_image_accepted(image):
    assert k8s.check_image(image) == image


@pytest.mark.parametrize("image", [
    "", "bad image", "img\nevil: true", "Team/App", "app:", "app:-tag", "app:tägü", "app:" + "t" * 129,
    "app@sha256:abc", "app/", "/app", "a_/b", "a/" + "b" * 254, "a" * 5000, None,
])
def test_image_refused(image):
    with pytest.raises(ConfigError, match="must be an image reference"):
        k8s.check_image(image)


@pytest.mark.parametrize("size", ["100Gi", "1Ti", "500G", "1.5Ti", "1e12", "2048", ".5Gi", "1.", "128974848"])
def test_quantity_accepted(size):
    assert k8s.check_quantity("--pvc-size", size) == size


@pytest.mark.parametrize("size", ["", "100GB", "0Gi", "0", "-5Gi", "1m", "Gi", "1 Gi", "lots",
                                  "\u0661\u0660\u0660Gi", "1" * 65, None])
def test_quantity_refused(size):
    with pytest.raises(ConfigError, match="must be a positive Kubernetes quantity"):
        k8s.check_quantity("--pvc-size", size)


def test_errors_are_usage_errors_and_quote_hostile_values_briefly():
    with pytest.raises(UsageError) as info:                 # exit code 2 from the CLI
        k8s.check_dns_label("--namespace", "x\n" * 1000)
    message = str(info.value)
    assert "\n" not in message and "'x\\nx\\n" in message and len(message) < 300


def test_manifest_round_trips_through_yaml():
    yaml = pytest.importorskip("yaml")
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "run-checkpoints", "namespace": "default",
                        # strings YAML would read as other types or as syntax stay strings
                        "labels": {"a": "true", "b": "0755", "c": "null", "d": "x: y # z", "e": "1e3"}},
           "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "100Gi"}}}}
    text = k8s.to_yaml(pvc)
    assert yaml.safe_load(text) == pvc
    assert text.splitlines()[:2] == ["apiVersion: v1", "kind: PersistentVolumeClaim"]   # order kept
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "job"}, "spec": {}}
    assert list(yaml.safe_load_all(k8s.to_yaml(pvc, job))) == [pvc, job]
