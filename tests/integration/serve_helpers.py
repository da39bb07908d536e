"""Models and a live-server helper for the serve tests.

``gated`` is a tiny Linear(4, 2) whose forward blocks on a file gate whenever a row starts with
GATE_VALUE: the test decides when compute finishes, so queue-full, deadline and shutdown tests
need no sleeps and assert no timings. Works in-process and in a server subprocess
(``--model serve_helpers:gated``, with this directory on PYTHONPATH and TP_GATE_DIR set)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import torch
from torch import nn

GATE_VALUE = 7.0
SEEN_ROWS: list[list[float]] = []          # every row the in-process model computed


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):                  # (B, 4) -> (B, 2)
        SEEN_ROWS.extend(x.tolist())
        if bool((x[:, 0] == GATE_VALUE).any()):
            gate = Path(os.environ["TP_GATE_DIR"])
            (gate / "entered").touch()
            deadline = time.monotonic() + 60
            while not (gate / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        return self.fc(x)


def gated() -> nn.Module:
    torch.manual_seed(0)
    return Gated()


class LiveServer:
    """The real app under uvicorn on an ephemeral loopback port, in a background thread."""

    def __init__(self, served, cfg, precision: str = "fp32"):
        from tensorpilot.serve import app as app_mod
        from tensorpilot.serve import server

        self.logs: list[str] = []
        self.app = app_mod.build_app(served, cfg, precision=precision, log=self.logs.append)
        self.sock = server.bind("127.0.0.1", 0)
        self.url = server.url_of(self.sock)
        self.server = server.make_server(self.app, self.sock, cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        import httpx

        self.thread.start()
        for _ in range(600):
            try:
                if httpx.get(self.url + "/v2/health/ready").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"server did not get ready: {self.logs}")

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=60)

    def __exit__(self, *exc):
        self.stop()

    def state(self):
        return self.app.state.tp


def metric(text: str, name: str) -> float:
    """Value of an unlabelled sample in Prometheus text format (0 if absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def wait_for(cond, what: str, timeout_s: float = 30.0):
    """Poll ``cond`` until true: a liveness guard with a generous bound, not a timing assertion."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def start_cli(*args: str, cwd: Path, env: dict) -> tuple:
    """`python -m tensorpilot serve --port 0 ARGS` in a subprocess: (process, base URL) once its
    readiness route answers 200 (stdout and stderr merged into ``process.stdout``)."""
    import signal
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    # default SIGHUP handling even when the test run itself ignores it (started under nohup)
    proc = subprocess.Popen([sys.executable, "-m", "tensorpilot", "serve", "--port", "0", *args],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("serving "):
            url = line.split(" at ")[1].split()[0]
            break
    else:
        raise AssertionError("".join(lines))

    def ready() -> bool:
        try:
            return urllib.request.urlopen(url + "/v2/health/ready", timeout=5).status == 200
        except (urllib.error.URLError, OSError):
            return False
    wait_for(ready, "readiness", timeout_s=120)
    return proc, url
