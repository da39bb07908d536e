"""Kubernetes manifests for ``tensorpilot serve``: Deployment, Service and an autoscaler on
queue depth. Pure functions from settings to dicts (tested offline against the Kubernetes
OpenAPI schemas with kubernetes-validate); ``write`` renders them as YAML.

Why these choices:
* probes: startup and readiness on /v2/health/ready (ready only after every batch size is warmed
  up, so no cold request reaches a new pod), liveness on /v2/health/live (cheap, never blocked
  by the model). The startup probe allows 10 minutes for precision choice + warm-up.
* terminationGracePeriodSeconds > the server's --graceful-timeout, and a preStop sleep so the
  endpoint is removed from the Service before SIGTERM arrives: in-flight requests finish.
* scaling on ``tensorpilot_serve_queue_depth`` (requests waiting for a batch) rather than CPU:
  on a GPU the host CPU is idle while the queue grows.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from tensorpilot.errors import UsageError

PORT = 8000
METRIC = "tensorpilot_serve_queue_depth"
MOUNT = "/models/run"


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "inference",
            "app.kubernetes.io/managed-by": "tensorpilot"}


def deployment(*, name: str, namespace: str, image: str, pvc: str, gpus: int, replicas: int,
               model_name: str, serve_args: list[str], graceful_s: int = 30) -> dict[str, Any]:
    args = ["serve", "--run", MOUNT, "--host", "0.0.0.0", "--port", str(PORT), "--name", model_name,
            "--graceful-timeout", str(graceful_s), *serve_args]
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
        "name": "server", "image": image, "command": ["tensorpilot"], "args": args,
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": [{"name": "TENSORPILOT_API_KEY", "valueFrom": {"secretKeyRef": {
            "name": f"{name}-api-key", "key": "api-key", "optional": True}}}],
        "resources": resources,
        "startupProbe": probe("/v2/health/ready", 5, 120),       # up to 10 min of warm-up
        "readinessProbe": probe("/v2/health/ready", 5, 2),
        "livenessProbe": probe("/v2/health/live", 10, 3),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
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
                         "terminationGracePeriodSeconds": graceful_s + 15,
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


def manifests(args) -> dict[str, dict[str, Any]]:
    """file name -> manifest, from `tensorpilot deploy k8s` arguments."""
    from tensorpilot.training import checkpoint as ckpt_io

    ckpt = ckpt_io.find_checkpoint(args.run)
    meta = ckpt_io.read_meta(ckpt)
    kind = meta.get("workload", {}).get("kind", "custom")
    model_name = meta.get("config", {}).get("model", {}).get("name", kind)
    model_name = model_name.rsplit(":", 1)[-1] if ":" in model_name else model_name
    name = args.name or f"tensorpilot-{model_name}".lower().replace("_", "-")
    if args.gpus < 0:
        raise UsageError(f"--gpus must be 0 or more, got {args.gpus}.")
    if args.max_replicas < args.replicas:
        raise UsageError(f"--max-replicas ({args.max_replicas}) is below --replicas ({args.replicas}).")
    common = {"name": name, "namespace": args.namespace}
    scaler = dict(common, min_replicas=args.replicas, max_replicas=args.max_replicas,
                  target_depth=args.target_queue_depth)
    out = {
        "deployment.yaml": deployment(**common, image=args.image, pvc=args.pvc or f"{name}-model",
                                      gpus=args.gpus, replicas=args.replicas, model_name=model_name,
                                      serve_args=shlex.split(args.serve_args)),
        "service.yaml": service(**common),
    }
    if args.autoscaler == "keda":
        out["scaledobject.yaml"] = keda(**scaler, prometheus_url=args.prometheus_url)
    else:
        out["hpa.yaml"] = hpa(**scaler)
    return out


def write(args, out_dir: Path) -> list[Path]:
    import yaml

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, doc in manifests(args).items():
        path = out_dir / fname
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        written.append(path)
    return written
