"""Do stalled uploads slow down other requests? Lone-request latency of `tensorpilot serve` with 0
and with N connections that sent their headers and part of a body, then stopped (a slow or
broken client), side by side for this tree and an earlier commit (default: the one before the
reliability pass, where a stalled body counted as "a request still arriving" and made the
batcher wait its full --max-queue-delay-ms).

    python benchmarks/serve_stalled.py [--baseline REV] [--stalled 5] [--rounds 3]

One tiny cnn run is served by both trees (the baseline from a `git worktree` of REV), each
point measured in alternation (A, B, A, B, ...) with the closed-loop client of serve_load.py at
concurrency 1 (read the ratios: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import HOST, Server, free_port, load, train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def server(src: Path, run: Path, log: Path, delay_ms: float) -> Server:
    port = free_port()
    env_path = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])
    cmd = ["env", f"PYTHONPATH={env_path}", "OMP_NUM_THREADS=1", sys.executable, "-m", "tensorpilot",
           "serve", "--run", str(run), "--port", str(port), "--precision", "fp32",
           "--max-queue-delay-ms", str(delay_ms)]
    return Server(cmd, port, "/v2/health/ready", log)


def stall(port: int, n: int) -> list[socket.socket]:
    """n connections that announce a 10,000-byte body, send 10 bytes of it, and wait."""
    socks = []
    for _ in range(n):
        s = socket.create_connection((HOST, port))
        s.sendall(f"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                  "Content-Length: 10000\r\n\r\n{\"inputs\":".encode())
        socks.append(s)
    return socks


def point(srv: Server, body: bytes, stalled: int, duration_s: float) -> float:
    socks = stall(srv.port, stalled)
    try:
        return load(srv.port, "/v2/models/cnn/infer", body, "closed", 1, 0.5, duration_s)["p50_ms"]
    finally:
        for s in socks:
            s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="d9b75f0", help="commit to compare with (default: d9b75f0)")
    ap.add_argument("--stalled", type=int, default=5, help="stalled connections (default 5)")
    ap.add_argument("--rounds", type=int, default=3, help="alternations per point (default 3)")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per measurement (< the 10 s body timeout)")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="--max-queue-delay-ms of both servers (default 5)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        worktree = tmp / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.baseline],
                       check=True, capture_output=True)
        try:
            run = tmp / "cnn"
            train(run, "--model", "cnn", "--size", "tiny")
            body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32",
                                           "data": [0.1] * (3 * 32 * 32)}]}).encode()
            trees = {"this tree": ROOT / "src", f"baseline {args.baseline}": worktree / "src"}
            servers = {name: server(src, run, tmp / f"{i}.log", args.delay_ms) for i, (name, src) in enumerate(trees.items())}
            p50: dict = {(name, n): [] for name in trees for n in (0, args.stalled)}
            try:
                for _ in range(args.rounds):
                    for name, srv in servers.items():
                        for n in (0, args.stalled):
                            p50[name, n].append(point(srv, body, n, args.duration))
            finally:
                for srv in servers.values():
                    srv.stop()
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True)
    print(f"lone-request median latency (ms), concurrency 1, --max-queue-delay-ms {args.delay_ms:g}, "
          f"median of {args.rounds} alternated rounds")
    print(f"| tree | 0 stalled | {args.stalled} stalled | ratio |")
    print("|---|---:|---:|---:|")
    for name in trees:
        a, b = statistics.median(p50[name, 0]), statistics.median(p50[name, args.stalled])
        print(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
