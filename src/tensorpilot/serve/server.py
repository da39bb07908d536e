"""Run the app under uvicorn on a socket we bind ourselves, so ``--port 0`` can print the real
port before the first request. SIGTERM/SIGINT: uvicorn stops accepting, lets in-flight requests
finish (at most ``graceful_timeout_s``), then the lifespan drains the batcher."""

from __future__ import annotations

import signal
import socket
from typing import Callable

from tensorpilot.errors import UsageError
from tensorpilot.serve.config import ServeConfig


def bind(host: str, port: int) -> socket.socket:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def make_server(app, sock: socket.socket, cfg: ServeConfig):
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=cfg.graceful_timeout_s, backlog=2048,
                            timeout_keep_alive=30)
    return uvicorn.Server(config)


def run(app, cfg: ServeConfig, log: Callable[[str], None] = print, model_name: str = "model") -> None:
    """Bind, print the URL, serve until SIGTERM/SIGINT, shut down gracefully."""
    sock = bind(cfg.host, cfg.port)
    url = url_of(sock)
    log(f"serving {model_name!r} at {url}  (POST {url}/v2/models/{model_name}/infer; "
        f"ready at {url}/v2/health/ready after warm-up)")
    server = make_server(app, sock, cfg)
    # uvicorn handles SIGTERM/SIGINT itself, then re-raises the signal once shut down; with these
    # no-op handlers in place the re-raise is harmless and a drained server exits 0 (Kubernetes
    # sends SIGTERM on every scale-down: that is a normal stop, not a failure).
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    log("stopped: in-flight requests finished.")
