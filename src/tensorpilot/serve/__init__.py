"""Serving: batched inference over HTTP (KServe v2 / Open Inference Protocol) with a bounded
queue, deadlines, Prometheus metrics and Kubernetes manifests.

    model.py      load a run's checkpoint or a ``pkg.mod:factory`` + safetensors weights
    precision.py  serving precision (fp32 / bf16 / fp16 / int8) and its accuracy change
    batcher.py    the dynamic batcher: bounded queue, deadlines, one compute thread
    protocol.py   v2 request parsing and validation (pure functions, 400s with a clear message)
    app.py        the FastAPI application (routes, auth, size limit, metrics)
    server.py     uvicorn on a bound socket, graceful shutdown
    k8s.py        Deployment / Service / autoscaler manifests
    command.py    ``tensorpilot serve`` and ``tensorpilot deploy`` (argparse only)

Nothing here is imported by ``import tensorpilot``; fastapi/uvicorn are the ``serve`` extra.
"""
