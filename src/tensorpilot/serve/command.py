"""``tensorpilot serve`` and ``tensorpilot deploy k8s``: argparse only; torch, fastapi and uvicorn
are imported inside the command functions so ``tensorpilot --help`` stays fast.

Every option is range-checked by argparse (exit 2, one line) and every path and combination is
checked before the model is built: a hostile or mistyped command line never reaches torch."""

from __future__ import annotations

import argparse
import os
import re

from tensorpilot import argtypes
from tensorpilot.errors import UsageError

INSTALL_HINT = "serving needs the serve extra: pip install 'tensorpilot[serve]'"
MAX_TIMEOUT_MS = 24 * 3600 * 1000            # as app.MAX_TIMEOUT_MS (the header's bound)
MAX_BATCH_SIZE = 4096                        # warm-up and the per-request row limit scale with it
INT32_MAX = 2**31 - 1                        # Kubernetes replica counts are int32
API_KEY = re.compile(r"[\x21-\x7e]+")        # visible ASCII: what an HTTP header carries unchanged


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (a training run, or your factory + weights)")
    g.add_argument("--run", metavar="DIR", help="Run directory (its newest checkpoint) or checkpoint directory.")
    g.add_argument("--model", metavar="PKG.MOD:FACTORY", help="Factory returning an nn.Module or a "
                   "tensorpilot.Workload (the working directory is importable): with --weights, or with "
                   "--run for a run of your own model (the run names its factory, but only this option "
                   "decides which code runs).")
    g.add_argument("--weights", metavar="FILE.safetensors", help="Weights for --model (safetensors only: "
                   "nothing is unpickled).")
    g.add_argument("--input-shape", metavar="D,D,...", help="Shape of one input sample, e.g. 3,32,32; "
                   "needed for --model, and for runs trained on your own tensors.")
    g.add_argument("--input-dtype", choices=("FP32", "INT64"), default="FP32",
                   help="Datatype of --model's input (default: FP32).")
    g.add_argument("--name", help="Model name in the URLs: letters, digits, '.', '_', '-' (default: the "
                   "workload, e.g. cnn, gpt, or the factory).")


def _add_serve_options(sv: argparse.ArgumentParser) -> None:
    net = sv.add_argument_group("network and security")
    net.add_argument("--host", default="127.0.0.1",
                     help="Address to bind; 0.0.0.0 exposes the server to the network (default: 127.0.0.1).")
    net.add_argument("--port", type=argtypes.port, default=8000, help="TCP port; 0 picks a free one "
                     "and prints it (default: 8000).")
    net.add_argument("--api-key", metavar="KEY", help="Require 'Authorization: Bearer KEY' on every route "
                     "but /v2/health/*; visible ASCII, no spaces (default: no authentication; env "
                     "TENSORPILOT_API_KEY also works).")
    net.add_argument("--max-request-bytes", type=argtypes.integer(1), default=8 << 20, metavar="N",
                     help="Larger request bodies get 413 (default: 8388608).")
    net.add_argument("--body-timeout", type=argtypes.number(0.001, 3600), default=10.0, metavar="S",
                     help="A request body must arrive within S seconds of its headers; slower or stalled "
                          "uploads get 408 and their connection is closed (default: 10).")
    b = sv.add_argument_group("batching, queue and deadlines")
    b.add_argument("--max-batch-size", type=argtypes.integer(1, MAX_BATCH_SIZE), default=32, metavar="N",
                   help=f"Most rows run in one forward pass (1..{MAX_BATCH_SIZE}); sizes 1..64, then powers "
                        "of two and N are warmed up before ready (default: 32).")
    b.add_argument("--max-queue-delay-ms", type=argtypes.number(0, 60_000), default=5.0, metavar="MS",
                   help="Longest the oldest request waits for a bigger batch; the batcher waits only "
                        "while more requests have arrived and are being parsed, so a lone request never "
                        "waits (default: 5).")
    b.add_argument("--max-queue", type=argtypes.integer(1), default=256, metavar="N",
                   help="Requests allowed to wait; beyond it: 503 with Retry-After (default: 256).")
    b.add_argument("--timeout-ms", type=argtypes.number(0.001, MAX_TIMEOUT_MS), default=30000.0,
                   metavar="MS", help="Deadline of requests without an X-Request-Timeout-Ms header; a "
                   "request still queued at its deadline gets 504 and is never computed (default: 30000).")
    b.add_argument("--drain-window", type=argtypes.number(0, 600), default=1.0, metavar="S",
                   help="On the first SIGTERM/SIGINT, keep listening for S seconds: new requests get 503 + "
                        "Retry-After, readiness 503, queued requests finish; then shut down (default: 1).")
    b.add_argument("--graceful-timeout", type=argtypes.number(0, 86_400), default=30.0, metavar="S",
                   help="After the drain window, finish in-flight requests for at most S seconds "
                        "(default: 30).")
    c = sv.add_argument_group("compute")
    c.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16", "int8"), default="auto",
                   help="auto measures fp32, bf16 autocast (CPUs with AVX512-BF16/AMX, GPUs), fp16 "
                        "(GPUs) and int8 dynamic quantization (CPU) and keeps the fastest that agrees with "
                        "fp32 on >= 95%% of held-out rows; the accuracy change is printed at start-up "
                        "(default: auto).")
    c.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, mps, ... (default: auto).")
    c.add_argument("--threads", type=argtypes.integer(1, 1024), metavar="N",
                   help="torch intra-op threads of the compute thread (default: torch's choice).")
    c.add_argument("--max-new-tokens", type=argtypes.integer(1, 65536), default=256, metavar="N",
                   help="gpt: most tokens one generate request may ask for (default: 256).")


def _add_k8s_options(k8s: argparse.ArgumentParser) -> None:
    k8s.add_argument("--run", required=True, metavar="DIR", help="Run directory to serve (read for the "
                     "model's name and kind; mounted in the pod from --pvc).")
    k8s.add_argument("--gpus", type=argtypes.integer(0, 1024), default=1, metavar="N",
                     help="nvidia.com/gpu per replica; 0 for CPU-only pods (default: 1).")
    k8s.add_argument("--out", default="k8s", metavar="DIR", help="Output directory (default: ./k8s).")
    k8s.add_argument("--name", help="Application name, a DNS label: lowercase letters, digits and '-', "
                     "starting with a letter, at most 63 characters (default: tensorpilot-<model>).")
    k8s.add_argument("--image", default="tensorpilot:latest",
                     help="Container image with tensorpilot[serve] installed (default: tensorpilot:latest).")
    k8s.add_argument("--pvc", help="PersistentVolumeClaim holding the run directory (default: <name>-model).")
    k8s.add_argument("--namespace", default="default", help="Namespace (default: default).")
    k8s.add_argument("--replicas", type=argtypes.integer(1, INT32_MAX), default=1, metavar="N",
                     help="Initial replicas (default: 1).")
    k8s.add_argument("--max-replicas", type=argtypes.integer(1, INT32_MAX), default=4, metavar="N",
                     help="Autoscaler upper bound (default: 4).")
    k8s.add_argument("--target-queue-depth", type=argtypes.integer(1, INT32_MAX), default=8, metavar="N",
                     help="Average queued requests per pod the autoscaler aims for (default: 8).")
    k8s.add_argument("--autoscaler", choices=("hpa", "keda"), default="hpa",
                     help="hpa: autoscaling/v2 HorizontalPodAutoscaler on a Pods custom metric (needs "
                          "prometheus-adapter); keda: a KEDA ScaledObject with a Prometheus trigger "
                          "(default: hpa).")
    k8s.add_argument("--prometheus-url", default="http://prometheus-server.monitoring.svc:80",
                     help="Prometheus address for the KEDA trigger (default: %(default)s).")
    k8s.add_argument("--serve-args", default="", metavar="'ARGS'",
                     help="Extra `tensorpilot serve` options for the container, e.g. '--max-batch-size 64' "
                          "(write --serve-args='--opt=X' when the value starts with '-' and has no space); "
                          "checked like a serve command line now, not when the pod starts.")


def register(sub) -> dict[str, argparse.ArgumentParser]:
    sv = sub.add_parser("serve", help="Serve a model over HTTP with dynamic batching (KServe v2).",
                        description="Serve a trained run or your model over HTTP: KServe v2 / Open "
                        "Inference Protocol routes, dynamic batching on one compute thread, a bounded "
                        "queue (503 + Retry-After), per-request deadlines (504), Prometheus /metrics and, "
                        "for gpt, token streaming over server-sent events. " + INSTALL_HINT + ".")
    add_model_arguments(sv)
    _add_serve_options(sv)
    sv.set_defaults(func=cmd_serve)
    dp = sub.add_parser("deploy", help="Write deployment manifests (Kubernetes).",
                        description="Write manifests that run `tensorpilot serve` on a cluster.")
    dsub = dp.add_subparsers(dest="target", metavar="TARGET", required=True)
    k8s = dsub.add_parser("k8s", help="Kubernetes: Deployment, Service and a queue-depth autoscaler.",
                          description="Write a Deployment (GPU limits; startup/readiness/liveness probes "
                          "on the v2 health routes), a Service and an autoscaler scaling on the "
                          "tensorpilot_serve_queue_depth metric, as YAML files in --out.")
    _add_k8s_options(k8s)
    k8s.set_defaults(func=cmd_deploy)
    return {"serve": sv, "deploy": dp}


def _require_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"{INSTALL_HINT} ({exc.name} is missing).") from None


def _api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else a non-empty TENSORPILOT_API_KEY, else None (no authentication)."""
    if args.api_key is not None:
        key, source = args.api_key, "--api-key"
        if not key:
            raise UsageError("--api-key is empty: give a key, or leave the option out to serve without "
                             "authentication.")
    else:
        key, source = os.environ.get("TENSORPILOT_API_KEY") or None, "TENSORPILOT_API_KEY"
        if key is None:
            return None
    if not API_KEY.fullmatch(key):
        raise UsageError(f"{source} must be visible ASCII characters without spaces: clients send it in "
                         "an HTTP header.")
    return key


def serve_config(args: argparse.Namespace):
    from tensorpilot.serve.config import BatchConfig, ServeConfig

    return ServeConfig(host=args.host, port=args.port, api_key=_api_key(args),
                       max_request_bytes=args.max_request_bytes, body_timeout_s=args.body_timeout,
                       max_new_tokens=args.max_new_tokens, drain_window_s=args.drain_window,
                       graceful_timeout_s=args.graceful_timeout,
                       batch=BatchConfig(max_batch_size=args.max_batch_size,
                                         max_queue_delay_ms=args.max_queue_delay_ms,
                                         max_queue=args.max_queue, default_timeout_ms=args.timeout_ms))


def cmd_serve(args: argparse.Namespace) -> int:
    from tensorpilot.serve import model as model_mod

    cfg = serve_config(args)
    model_options = dict(run=args.run, factory=args.model, weights=args.weights, input_shape=args.input_shape,
                         input_dtype=args.input_dtype, name=args.name, max_request_bytes=cfg.max_request_bytes)
    model_mod.check_options(**model_options)                  # paths and shapes, before torch
    _require_extra()
    from tensorpilot.serve import server

    server.check_address(cfg.host, cfg.port)                 # before minutes of model loading
    import torch

    from tensorpilot.hardware.device import resolve_device
    from tensorpilot.serve import app as app_mod

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    served = model_mod.load(**model_options, device=device)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not cfg.api_key:
        print(f"warning: listening on {args.host} without --api-key: anyone who can reach it can use it.",
              flush=True)

    def log(msg: str) -> None:
        print(msg, flush=True)

    log(f"model: {served.name} ({served.kind}) from {served.source} on {device}; input "
        f"{served.input.name} {served.input.datatype} {[-1, *served.input.sample_shape]}")
    app = app_mod.build_app(served, cfg, precision=args.precision, log=log)
    drained = server.run(app, cfg, log=log, model_name=served.name)
    return 0 if drained else 130                              # 130: stopped by Ctrl-C, like cli.main


def cmd_deploy(args: argparse.Namespace) -> int:
    from tensorpilot.serve import k8s

    written = k8s.write(args)
    for path in written:
        print(f"wrote {path}")
    print(f"apply with: kubectl apply -f {written[0].parent}")
    return 0
