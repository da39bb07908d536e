"""Load test of `tensorpilot serve`, side by side in one run (the machine is shared and noisy:
read the ratios, not the absolute numbers).

    python benchmarks/serve_load.py [--quick] [--append benchmarks/RESULTS.md]

Parts (each server is a subprocess; the load generator is another process, a raw HTTP/1.1
keep-alive client on asyncio so it costs the servers as little CPU as possible):
1. cnn (3x32x32, tiny) closed-loop concurrency sweep 1..64: tensorpilot (batch 32, 5 ms) vs
   tensorpilot with batching off (batch 1) vs LitServe (max_batch_size 32, batch_timeout 5 ms),
   same model weights, same fp32 precision, same v2 JSON payload.
2. the same three under a Poisson open loop (latency counted from the scheduled arrival, so a
   slow server cannot slow the arrivals down: no coordinated omission).
3. gpt (small preset, 128-token context) at concurrency 16: --precision auto vs fp32.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOST = "127.0.0.1"


# ----------------------------------------------------------------------------- load generator

async def _request(reader, writer, raw: bytes) -> int:
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    if m:
        await reader.readexactly(int(m.group(1)))
    else:                                                     # chunked
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


def _raw(path: str, body: bytes, port: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _closed(port, raw, concurrency, warmup_s, duration_s):
    lat, codes = [], {}
    t_start = time.perf_counter()
    t_rec, t_end = t_start + warmup_s, t_start + warmup_s + duration_s

    async def conn():
        reader, writer = await asyncio.open_connection(HOST, port)
        while (t0 := time.perf_counter()) < t_end:
            status = await _request(reader, writer, raw)
            if t0 >= t_rec:
                lat.append(time.perf_counter() - t0)
                codes[status] = codes.get(status, 0) + 1
        writer.close()
    await asyncio.gather(*(conn() for _ in range(concurrency)))
    return lat, codes, duration_s


async def _open(port, raw, rate, warmup_s, duration_s, pool=128):
    lat, codes = [], {}
    conns: asyncio.Queue = asyncio.Queue()
    for _ in range(pool):
        conns.put_nowait(await asyncio.open_connection(HOST, port))
    rng = random.Random(0)
    t0 = time.perf_counter()
    t_rec, t_end = t0 + warmup_s, t0 + warmup_s + duration_s
    tasks, t_next = [], t0

    async def one(t_sched):
        reader, writer = await conns.get()
        status = await _request(reader, writer, raw)
        conns.put_nowait((reader, writer))
        if t_sched >= t_rec:
            lat.append(time.perf_counter() - t_sched)        # from the scheduled arrival
            codes[status] = codes.get(status, 0) + 1
    while t_next < t_end:
        delay = t_next - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(t_next)))
        t_next += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    return lat, codes, duration_s


def _client(conn, port, raw, mode, level, warmup_s, duration_s):
    fn = _closed if mode == "closed" else _open
    lat, codes, dur = asyncio.run(fn(port, raw, level, warmup_s, duration_s))
    conn.send((lat, codes, dur))


def load(port: int, path: str, body: bytes, mode: str, level: float, warmup_s=0.5, duration_s=4.0) -> dict:
    """Run the load generator in its own process; throughput and latency percentiles."""
    parent, child = mp.get_context("spawn").Pipe()
    p = mp.get_context("spawn").Process(target=_client, args=(child, port, _raw(path, body, port), mode,
                                                               level, warmup_s, duration_s))
    p.start()
    lat, codes, dur = parent.recv()
    p.join()
    lat.sort()
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000) if lat else (lambda q: float("nan"))
    return {"rps": codes.get(200, 0) / dur, "p50_ms": pct(0.5), "p99_ms": pct(0.99),
            "errors": sum(v for k, v in codes.items() if k != 200)}


# ----------------------------------------------------------------------------- servers

def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_http(port: int, path: str, proc, timeout_s: float = 300) -> None:
    import urllib.request

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            if urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not get ready")


class Server:
    def __init__(self, cmd: list[str], port: int, ready_path: str, log: Path):
        self.log = log
        # own session: stop() ends the server and any worker processes it started (LitServe)
        self.proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.port = port
        wait_http(port, ready_path, self.proc)

    def stop(self) -> None:
        import signal

        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        time.sleep(1)
        try:                                                  # stragglers of the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def tensorpilot_server(run: Path, log: Path, *args: str) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "tensorpilot", "serve", "--run", str(run), "--port", str(port), *args]
    return Server(cmd, port, "/v2/health/ready", log)


LITSERVE_APP = '''
import sys, torch, litserve as ls
from safetensors.torch import load_model
from tensorpilot.workloads.vision import CNN

class CNNAPI(ls.LitAPI):
    def setup(self, device):
        self.model = CNN(3, {channels}, 10).eval()
        load_model(self.model, {weights!r})
    def decode_request(self, request):          # the same v2 JSON body as tensorpilot's /infer
        t = request["inputs"][0]
        return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"][1:])
    def batch(self, inputs):
        return torch.stack(inputs)
    def predict(self, x):
        with torch.inference_mode():
            return self.model(x)
    def unbatch(self, output):
        return list(output)
    def encode_response(self, output):
        return {{"outputs": [{{"name": "logits", "datatype": "FP32", "shape": [1, 10],
                              "data": output.tolist()}}]}}

if __name__ == "__main__":
    api = CNNAPI(max_batch_size={max_batch}, batch_timeout={timeout_s})
    ls.LitServer(api, accelerator="cpu", workers_per_device=1).run(
        host="127.0.0.1", port={port}, generate_client_file=False, log_level="warning")
'''


def litserve_server(run: Path, log: Path, max_batch: int, timeout_s: float) -> Server:
    from tensorpilot.training import checkpoint as ckpt_io

    ckpt = ckpt_io.find_checkpoint(run)
    meta = json.loads((ckpt / "meta.json").read_text())
    port = free_port()
    app = log.with_suffix(".py")
    app.write_text(LITSERVE_APP.format(channels=meta["workload"]["channels"], max_batch=max_batch,
                                       weights=str(ckpt / "model.safetensors"), port=port, timeout_s=timeout_s))
    return Server([sys.executable, str(app)], port, "/health", log)


def train(run: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "tensorpilot", "train", "--steps", "2", "--compile", "off",
                    "--logging.progress", "off", "--no-logging.tensorboard", "--run-dir", str(run), *args],
                   check=True, stdout=subprocess.DEVNULL)


# ----------------------------------------------------------------------------- main

def table(title: str, rows: list[tuple], header: tuple) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def fmt(r: dict) -> str:
    return f"{r['rps']:.0f} / {r['p50_ms']:.1f} / {r['p99_ms']:.1f}" + (f" ({r['errors']} err)" if r["errors"] else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="concurrency 1, 16, 64 only, 2 s per point")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds measured per point (default 4)")
    ap.add_argument("--rate", type=float, default=300.0, help="Poisson arrival rate, req/s (default 300)")
    ap.add_argument("--append", metavar="FILE", help="append the markdown results to FILE")
    ap.add_argument("--skip-gpt", action="store_true")
    args = ap.parse_args()
    levels = [1, 16, 64] if args.quick else [1, 2, 4, 8, 16, 32, 64]
    dur = 2.0 if args.quick else args.duration
    work = Path(tempfile.mkdtemp(prefix="serve-load-"))
    os.environ.setdefault("TENSORPILOT_CACHE", str(work / "cache"))
    out = [f"## serve\n\n`python benchmarks/serve_load.py` on {os.cpu_count()} CPU cores "
           f"({time.strftime('%Y-%m-%d')}); cells are throughput req/s / p50 ms / p99 ms; the load "
           "generator is a separate process on the same cores.\n"]

    cnn = work / "cnn"
    train(cnn, "--model", "cnn", "--batch-size", "8", "--train.eval_batches", "1")
    x = [random.Random(0).gauss(0, 1) for _ in range(3 * 32 * 32)]
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": x}]}).encode()
    contenders = {
        "tensorpilot (batch 32, 5 ms)": (lambda: tensorpilot_server(cnn, work / "tp.log", "--precision", "fp32",
                                         "--max-batch-size", "32", "--max-queue-delay-ms", "5", "--max-queue", "1024"),
                                         "/v2/models/cnn/infer"),
        "tensorpilot batching off": (lambda: tensorpilot_server(cnn, work / "tp1.log", "--precision", "fp32",
                                     "--max-batch-size", "1", "--max-queue", "1024"), "/v2/models/cnn/infer"),
        "LitServe 0.2 (batch 32, 5 ms)": (lambda: litserve_server(cnn, work / "ls.log", 32, 0.005), "/predict"),
    }
    closed: dict[str, dict] = {}
    poisson: dict[str, dict] = {}
    for name, (start, path) in contenders.items():
        srv = start()
        try:
            for c in levels:
                closed.setdefault(name, {})[c] = load(srv.port, path, body, "closed", c, duration_s=dur)
                print(name, c, closed[name][c], flush=True)
            poisson[name] = load(srv.port, path, body, "open", args.rate, duration_s=dur * 2)
            print(name, "poisson", poisson[name], flush=True)
        finally:
            srv.stop()
    names = list(contenders)
    rows = [(c, *(fmt(closed[n][c]) for n in names)) for c in levels]
    out.append(table("cnn 3x32x32, closed loop (concurrency sweep)", rows, ("concurrency", *names)))
    ours, off, lit = (closed[n] for n in names)
    ratio_rows = [(c, f"{ours[c]['rps'] / lit[c]['rps']:.2f}x", f"{ours[c]['p99_ms'] / lit[c]['p99_ms']:.2f}",
                   f"{ours[c]['rps'] / off[c]['rps']:.2f}x") for c in levels]
    out.append(table("ratios", ratio_rows, ("concurrency", "throughput vs LitServe", "p99 vs LitServe",
                                            "batching on / off throughput")))
    out.append(table(f"cnn, Poisson open loop at {args.rate:.0f} req/s", [(n, fmt(poisson[n])) for n in names],
                     ("server", "req/s / p50 / p99")))

    if not args.skip_gpt:
        gpt = work / "gpt"
        train(gpt, "--size", "small", "--model.seq_len", "128", "--batch-size", "4",
              "--data.max_bytes", "400000", "--train.eval_batches", "1")
        ids = [random.Random(1).randrange(256) for _ in range(128)]
        gbody = json.dumps({"inputs": [{"name": "input_ids", "shape": [1, 128], "datatype": "INT64",
                                        "data": ids}]}).encode()
        grows = []
        for prec in ("fp32", "auto"):
            srv = tensorpilot_server(gpt, work / f"gpt-{prec}.log", "--precision", prec, "--max-batch-size", "16")
            try:
                r = load(srv.port, "/v2/models/gpt/infer", gbody, "closed", 16, duration_s=dur * 2)
            finally:
                srv.stop()
            chosen = next((ln.strip() for ln in open(work / f"gpt-{prec}.log") if ln.startswith("precision:")), "")
            grows.append((prec, fmt(r), chosen.replace("|", "/")))
            print(prec, r, chosen, flush=True)
        f32 = float(grows[0][1].split(" / ")[0])
        aut = float(grows[1][1].split(" / ")[0])
        out.append(table("gpt small (6x384, 128-token requests), concurrency 16, batch 16",
                         grows, ("--precision", "req/s / p50 / p99", "start-up report")))
        out.append(f"auto vs fp32 throughput: {aut / f32:.2f}x\n")
    text = "\n".join(out)
    print(text)
    if args.append:
        with open(args.append, "a") as fh:
            fh.write("\n" + text)


if __name__ == "__main__":
    main()
