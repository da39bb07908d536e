"""Run the app under uvicorn on a socket we bind ourselves, so ``--port 0`` can print the real
port before the first request.

Shutdown drains: every request the server accepted gets an HTTP answer.

1. First SIGTERM/SIGINT/SIGHUP: the *drain window* (``drain_window_s``) starts. The listener stays
   open; new infer/generate requests get 503 + Retry-After, readiness turns 503, requests already
   queued or computing finish, and every response closes its connection (app.py).
2. When the window ends, uvicorn's own shutdown runs: stop accepting, close idle connections,
   let in-flight requests finish (at most ``graceful_timeout_s``), then the lifespan drains the
   batcher.

Why a window: uvicorn alone closes every connection that has no request in progress the moment
the signal arrives, and a keep-alive client whose next request is already on the wire loses it
(RFC 9112 section 9.3.1 leaves retrying to the client). Kubernetes keeps routing to a pod for a
moment after SIGTERM while its endpoint is removed, so a server should keep answering briefly.
A second SIGINT exits at once. SIGHUP (the terminal or SSH session that started the server
closed, or `kill -HUP`) stops the server the same way as SIGTERM: uvicorn captures only SIGINT
and SIGTERM, and Python's default for SIGHUP would end the process at once, dropping requests
(under `nohup`, which ignores SIGHUP, it stays ignored).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from typing import Callable

import uvicorn

from tensorpilot.errors import UsageError, first_line
from tensorpilot.serve.config import ServeConfig

# stop signals beyond uvicorn's own SIGINT and SIGTERM (Windows has no SIGHUP)
EXTRA_STOP_SIGNALS = tuple(s for s in (getattr(signal, "SIGHUP", None),) if s is not None)
# after the listener closes: time for a connection accepted just before to deliver its request,
# which is then answered rather than dropped with the idle connections
LAST_ACCEPTED_GRACE_S = 0.1


def _address(host: str, port: int) -> tuple:
    """(family, sockaddr) of ``host``, or a UsageError saying why it cannot be used."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as exc:       # gaierror; UnicodeError from IDNA for 'a..b'
        raise UsageError(f"--host {host!r} cannot be resolved: {first_line(exc)}.") from None
    return family, addr


def bind(host: str, port: int) -> socket.socket:
    family, addr = _address(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def check_address(host: str, port: int) -> None:
    """Fail now, before the model is built, if ``host:port`` cannot be listened on. (The port
    can still be taken before the real bind; that later failure is reported the same way.)"""
    bind(host, port).close()


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _stop_signals_not_ignored() -> list[int]:
    """EXTRA_STOP_SIGNALS but those this process was told to ignore: under `nohup` SIGHUP is
    ignored on purpose, and a closed terminal must not stop the server then."""
    return [s for s in EXTRA_STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain window between the first signal and its shutdown."""

    def __init__(self, config: uvicorn.Config, *, drain_window_s: float,
                 on_drain: Callable[[float], None], log: Callable[[str], None]):
        super().__init__(config)
        self.drain_window_s = drain_window_s
        self.on_drain = on_drain                   # must be signal-safe: assignments only
        self.log = log
        self.drain_until: float | None = None
        self._drain_logged = False

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn's capture (SIGINT, SIGTERM; re-raised after shutdown) plus EXTRA_STOP_SIGNALS,
        handled the same way. Ours are restored before uvicorn re-raises what it captured, so a
        re-raised SIGHUP reaches the handler run() installed, not this server again."""
        with super().capture_signals():
            if threading.current_thread() is not threading.main_thread():   # signals: main thread only
                yield
                return
            previous = {s: signal.signal(s, self.handle_exit) for s in _stop_signals_not_ignored()}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    def handle_exit(self, sig: int, frame) -> None:
        if self.drain_until is None and not self.should_exit and self.drain_window_s > 0:
            self._captured_signals.append(sig)     # re-raised after shutdown, as uvicorn does
            self.drain_until = time.monotonic() + self.drain_window_s
            self.on_drain(self.drain_until)
        elif self.drain_until is not None and sig == signal.SIGINT:
            self.should_exit = True                # second Ctrl-C: no more waiting
            super().handle_exit(sig, frame)        # -> force_exit
        else:
            super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_until is not None and not self.should_exit:
            if not self._drain_logged:             # logged here, not in the signal handler
                self._drain_logged = True
                self.log(f"draining for {self.drain_window_s:g} s: new requests get 503, queued ones "
                         "finish (a second Ctrl-C exits at once)")
            if time.monotonic() >= self.drain_until:
                self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.drain_until is not None and not self.force_exit:
            for server in self.servers:            # uvicorn closes these again: a no-op
                server.close()
            for sock in sockets or []:
                sock.close()
            await asyncio.sleep(LAST_ACCEPTED_GRACE_S)
        await super().shutdown(sockets=sockets)
        if self.force_exit:
            # the requests still running are cancelled on purpose (run() says so in one line);
            # uvicorn would log each cancellation as an error with a traceback
            logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)


def make_server(app, sock: socket.socket, cfg: ServeConfig, *, on_drain: Callable[[float], None] | None = None,
                log: Callable[[str], None] = print) -> DrainingServer:
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=cfg.graceful_timeout_s, backlog=2048,
                            timeout_keep_alive=30)
    return DrainingServer(config, drain_window_s=cfg.drain_window_s if on_drain else 0.0,
                          on_drain=on_drain or (lambda until: None), log=log)


def run(app, cfg: ServeConfig, log: Callable[[str], None] = print, model_name: str = "model") -> bool:
    """Bind, print the URL, serve until SIGTERM/SIGINT/SIGHUP, drain, shut down gracefully. False
    when a second SIGINT cut the shutdown short."""
    sock = bind(cfg.host, cfg.port)
    url = url_of(sock)
    log(f"serving {model_name!r} at {url}  (POST {url}/v2/models/{model_name}/infer; "
        f"ready at {url}/v2/health/ready after warm-up)")
    server = make_server(app, sock, cfg, on_drain=app.state.tp.begin_drain, log=log)
    # the server handles SIGTERM/SIGINT/SIGHUP itself, then re-raises the signal once shut down;
    # with these no-op handlers in place the re-raise is harmless and a drained server exits 0
    # (Kubernetes sends SIGTERM on every scale-down: that is a normal stop, not a failure).
    previous = {s: signal.signal(s, lambda *_: None)
                for s in (signal.SIGTERM, signal.SIGINT, *_stop_signals_not_ignored())}
    try:
        server.run(sockets=[sock])
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    log("stopped at once (second interrupt): requests still in flight were dropped." if server.force_exit
        else "stopped: in-flight requests finished.")
    return not server.force_exit
