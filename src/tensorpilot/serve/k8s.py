"""Kubernetes manifests for ``tensorpilot serve``: Deployment, Service and an autoscaler on
queue depth. Pure functions from settings to dicts (tested offline against the Kubernetes
OpenAPI schemas with kubernetes-validate); ``write`` renders them as YAML.

Why these choices:
* probes: startup and readiness on /v2/health/ready (ready only after every batch size is warmed
  up, so no cold request reaches a new pod), liveness on /v2/health/live (cheap, never blocked
  by the model). The startup probe allows 10 minutes for precision choice + warm-up.
* a preStop sleep so the endpoint is removed from the Service before SIGTERM arrives, then the
  server's drain window; terminationGracePeriodSeconds covers preStop + drain window + the
  server's --graceful-timeout, so in-flight requests finish.
* scaling on ``tensorpilot_serve_queue_depth`` (requests waiting for a batch) rather than CPU:
  on a GPU the host CPU is idle while the queue grows.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tensorpilot.errors import UsageError
from tensorpilot.files import existing_path, writable_dir, write_atomic
from tensorpilot.k8s import check_dns1035_label, check_dns_label, check_dns_subdomain, check_image, shown, to_yaml

PORT = 8000
METRIC = "tensorpilot_serve_queue_depth"
MOUNT = "/models/run"


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "inference",
            "app.kubernetes.io/managed-by": "tensorpilot"}


def deployment(*, name: str, namespace: str, image: str, pvc: str, gpus: int, replicas: int,
               container_args: list[str], grace_s: int) -> dict[str, Any]:
    """``grace_s``: terminationGracePeriodSeconds, longer than preStop + drain window + graceful
    timeout, so the kubelet's SIGKILL never cuts a drain short."""
    resources: dict[str, Any] = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}
    pod_extra: dict[str, Any] = {}
    if gpus > 0:
        # extended resources: request == limit is required; the device plugin names them nvidia.com/gpu
        resources["limits"]["nvidia.com/gpu"] = gpus
        resources["requests"]["nvidia.com/gpu"] = gpus
        pod_extra["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
                "timeoutSeconds": 2, "failureThreshold": failures}

    container = {
        "name": "server", "image": image, "command": ["tensorpilot"], "args": container_args,
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": [{"name": "TENSORPILOT_API_KEY", "valueFrom": {"secretKeyRef": {
            "name": f"{name}-api-key", "key": "api-key", "optional": True}}}],
        "resources": resources,
        "startupProbe": probe("/v2/health/ready", 5, 120),       # up to 10 min of warm-up
        "readinessProbe": probe("/v2/health/ready", 5, 2),
        "livenessProbe": probe("/v2/health/live", 10, 3),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_S)]}}},
        "volumeMounts": [{"name": "model", "mountPath": MOUNT, "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": _labels(name), "annotations": {
                    "prometheus.io/scrape": "true", "prometheus.io/port": str(PORT),
                    "prometheus.io/path": "/metrics"}},
                "spec": {"containers": [container],
                         "terminationGracePeriodSeconds": grace_s,
                         "volumes": [{"name": "model", "persistentVolumeClaim": {
                             "claimName": pvc, "readOnly": True}}],
                         **pod_extra},
            },
        },
    }


def service(*, name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
            "spec": {"selector": {"app.kubernetes.io/name": name}, "type": "ClusterIP",
                     "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}}


def hpa(*, name: str, namespace: str, min_replicas: int, max_replicas: int, target_depth: int) -> dict[str, Any]:
    """autoscaling/v2 on a Pods metric; prometheus-adapter must expose tensorpilot_serve_queue_depth."""
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                     "minReplicas": min_replicas, "maxReplicas": max_replicas,
                     "metrics": [{"type": "Pods", "pods": {
                         "metric": {"name": METRIC},
                         "target": {"type": "AverageValue", "averageValue": str(target_depth)}}}],
                     # scale up at once, scale down slowly: a cold GPU pod takes minutes to warm up
                     "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0},
                                  "scaleDown": {"stabilizationWindowSeconds": 300}}}}


def keda(*, name: str, namespace: str, min_replicas: int, max_replicas: int, target_depth: int,
         prometheus_url: str) -> dict[str, Any]:
    """KEDA ScaledObject (keda.sh/v1alpha1) with a Prometheus trigger on the summed queue depth."""
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
            "spec": {"scaleTargetRef": {"name": name}, "minReplicaCount": min_replicas,
                     "maxReplicaCount": max_replicas, "cooldownPeriod": 300,
                     "triggers": [{"type": "prometheus", "metadata": {
                         "serverAddress": prometheus_url,
                         "query": f'sum({METRIC}{{namespace="{namespace}",app_kubernetes_io_name="{name}"}})',
                         "threshold": str(target_depth)}}]}}


# ---------------------------------------------------------------------------- checking the inputs
# Names, the image and the YAML rendering follow tensorpilot.k8s, shared with `launch k8s`.

PRESTOP_S = 5
# options of `tensorpilot serve` the manifest sets itself: an override would break the probes,
# the Service or the volume mount
OWNED = {"run": MOUNT, "host": "0.0.0.0", "port": PORT, "weights": None}


def check_url(url: str) -> str:
    parts = urlsplit(url) if url.isprintable() and " " not in url else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--prometheus-url {shown(url)} must be an http:// or https:// address without "
                         "spaces, e.g. http://prometheus-server.monitoring.svc:80.")
    return url


def default_app_name(model_name: str) -> str:
    """tensorpilot-<model> as a DNS label (the model name comes from the run, so it is cleaned)."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", f"tensorpilot-{model_name}".lower())
    return re.sub(r"-+", "-", cleaned)[:63].rstrip("-")


class _StrictParser(argparse.ArgumentParser):
    """An ArgumentParser that raises a UsageError about --serve-args instead of exiting."""

    def error(self, message: str):
        raise UsageError(f"--serve-args is not a valid serve command line: {message}.")

    def exit(self, status: int = 0, message: str | None = None):
        raise UsageError("--serve-args asks for help; give serve options only.")

    def print_help(self, file=None):
        pass


def parse_serve_args(text: str, fixed: list[str]) -> tuple[list[str], argparse.Namespace]:
    """``--serve-args`` as a list, and the options the container will run with (``fixed`` first,
    then these), checked by the serve command's own parser."""
    from tensorpilot.serve.command import register

    if not text.isprintable():
        raise UsageError("--serve-args must be one line of printable characters (no newlines or "
                         "control characters).")
    try:
        extra = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--serve-args cannot be split like a shell command line: {str(exc).lower()} "
                         "(check the quotes).") from None
    serve = register(_StrictParser(prog="tensorpilot").add_subparsers())["serve"]
    ns = serve.parse_args([*fixed, *extra])
    for dest, value in OWNED.items():
        if getattr(ns, dest) != value:
            raise UsageError(f"--serve-args must not set --{dest}: the manifest sets it (the run is "
                             f"mounted at {MOUNT}, probes and the Service use port {PORT}).")
    if ns.api_key is not None:
        raise UsageError("--serve-args must not carry --api-key: it would be stored in plain text in the "
                         "manifest; put it in the Secret the Deployment reads (see docs/serving.md).")
    return extra, ns


def _check_plain_options(args) -> None:
    if args.name is not None:
        # names the Deployment, Service and autoscaler alike; a Service name must be an RFC 1035
        # label (https://kubernetes.io/docs/concepts/services-networking/service/), the strictest
        check_dns1035_label("--name", args.name)
    check_dns_label("--namespace", args.namespace)
    if args.pvc is not None:
        check_dns_subdomain("--pvc", args.pvc)
    check_image(args.image)
    check_url(args.prometheus_url)
    if args.max_replicas < args.replicas:
        raise UsageError(f"--max-replicas ({args.max_replicas}) is below --replicas ({args.replicas}).")


def manifests(args) -> dict[str, dict[str, Any]]:
    """file name -> manifest, from `tensorpilot deploy k8s` arguments."""
    from tensorpilot.serve.model import (check_factory, check_name, check_one_process, default_model_name,
                                         describe_run, parse_shape)
    from tensorpilot.training import checkpoint as ckpt_io

    _check_plain_options(args)
    ckpt = ckpt_io.find_checkpoint(existing_path(args.run, "--run", kind="dir"))
    meta = ckpt_io.read_meta(ckpt)
    check_one_process(args.run, ckpt, meta)             # the pods' serve could not load it
    kind, recorded = describe_run(meta, ckpt)
    fixed = ["--run", MOUNT, "--host", "0.0.0.0", "--port", str(PORT)]
    serve_args, ns = parse_serve_args(args.serve_args, fixed)
    try:
        check_factory(args.run, kind, recorded, ns.model)   # the pod would refuse the same way
    except UsageError as exc:
        raise UsageError(f"--serve-args: {exc}") from None
    check_name(ns.name)
    parse_shape(ns.input_shape)
    model_name = ns.name or default_model_name(ns.model or kind, kind)
    name = args.name or default_app_name(model_name)
    grace_s = math.ceil(PRESTOP_S + ns.drain_window + ns.graceful_timeout) + 10
    common = {"name": name, "namespace": args.namespace}
    scaler = dict(common, min_replicas=args.replicas, max_replicas=args.max_replicas,
                  target_depth=args.target_queue_depth)
    out = {
        "deployment.yaml": deployment(**common, image=args.image, pvc=args.pvc or f"{name}-model",
                                      gpus=args.gpus, replicas=args.replicas,
                                      container_args=["serve", *fixed, "--name", model_name, *serve_args],
                                      grace_s=grace_s),
        "service.yaml": service(**common),
    }
    if args.autoscaler == "keda":
        out["scaledobject.yaml"] = keda(**scaler, prometheus_url=args.prometheus_url)
    else:
        out["hpa.yaml"] = hpa(**scaler)
    return out


def write(args) -> list[Path]:
    docs = manifests(args)                                  # every check before anything is written
    out_dir = writable_dir(args.out, "--out")
    written = []
    for fname, doc in docs.items():
        written.append(write_atomic(out_dir / fname, to_yaml(doc), what="manifest"))
    return written
