"""`tensorpilot serve` against a hostile-but-realistic user (docs/reliability.md): bad options and
paths end in one sentence before any model is built; a run directory is untrusted data; stalled
uploads are cut off and never delay other requests; SIGTERM drains, so every request the server
accepted gets an HTTP answer.

(Named test_serving.py: tests/integration/test_serve.py already owns the module name test_serve.)
Servers run for real on loopback: in a thread (serve_helpers.LiveServer) where the test needs to
see inside, as `python -m tensorpilot serve` in a subprocess where signals are involved."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

import torch  # noqa: E402
from battery import assert_clean_error, run  # noqa: E402

INTEGRATION = Path(__file__).parents[1] / "integration"
sys.path.insert(0, str(INTEGRATION))      # serve_helpers: the gated model and LiveServer

from serve_helpers import LiveServer, gated, start_cli, wait_for  # noqa: E402

from tensorpilot.errors import CheckpointError, UsageError  # noqa: E402
from tensorpilot.serve import model as model_mod  # noqa: E402
from tensorpilot.serve.config import BatchConfig, ServeConfig  # noqa: E402

TINY_GPT = {"vocab_size": 256, "seq_len": 8, "n_layer": 1, "n_head": 2, "d_model": 16, "dropout": 0.0,
            "tie_head": True}


def _env(**extra) -> dict[str, str]:
    path = os.pathsep.join([str(INTEGRATION), os.environ.get("PYTHONPATH", "")])
    return dict(PYTHONPATH=path, **extra)


def _checkpoint(root: Path, module, workload: dict, name: str) -> Path:
    """A run directory written by the trainer's own checkpoint code (checksums included)."""
    from tensorpilot.training import checkpoint as ckpt_io

    meta = {"config": {"model": {"name": name}}, "workload": workload}
    ckpt_io.save(root / "checkpoints", 1, module, {"step": 1}, meta, keep=1)
    return root


def _gpt_run(root: Path) -> Path:
    from tensorpilot.workloads.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    return _checkpoint(root, GPT(GPTConfig(**TINY_GPT)), {"kind": "gpt", "gpt": dict(TINY_GPT)}, "gpt")


def _edit_meta(run_dir: Path, edit) -> Path:
    path = next(run_dir.glob("checkpoints/*/meta.json"))
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    return run_dir


# --------------------------------------------------------------------------- command line

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-files")
    (root / "afile").write_text("x")
    (root / "notes.safetensors").write_text("not a safetensors file")
    (root / "emptydir").mkdir()
    return root


BAD_OPTIONS = [
    (["--port", "70000"], "--port"), (["--port", "-1"], "--port"), (["--threads", "0"], "--threads"),
    (["--max-batch-size", str(10**9)], "--max-batch-size"), (["--timeout-ms", "nan"], "--timeout-ms"),
    (["--timeout-ms", "inf"], "--timeout-ms"), (["--graceful-timeout", "inf"], "--graceful-timeout"),
    (["--max-queue-delay-ms", "inf"], "--max-queue-delay-ms"), (["--max-new-tokens", str(10**12)], "--max-new-tokens"),
    (["--body-timeout", "0"], "--body-timeout"), (["--drain-window", "-1"], "--drain-window"),
    (["--max-request-bytes", "0"], "--max-request-bytes"),
    (["--model", "m:f", "--input-shape", "a,b"], "--input-shape"),
    (["--model", "m:f", "--input-shape", "0"], "--input-shape"),
    (["--model", "m:f", "--input-shape", "-1"], "--input-shape"),
    (["--model", "m:f", "--input-shape", "100000,100000,100000"], "--max-request-bytes"),
    (["--run", "missing"], "does not exist"), (["--run", "afile"], "is a file"),
    (["--run", "x" * 300], "too long"), (["--run", "emptydir", "--weights", "afile"], "--weights is for"),
    (["--model", "m:f"], "needs --weights"), (["--model", "nocolon", "--weights", "afile"], "package.module:factory"),
    (["--model", "m:f", "--weights", "emptydir"], "is a directory"),
    (["--model", "m:f", "--weights", "nope"], "does not exist"),
    (["--model", "m:f", "--weights", "afile", "--api-key", ""], "--api-key is empty"),
    (["--model", "m:f", "--weights", "afile", "--api-key", "a b"], "visible ASCII"),
    (["--model", "m:f", "--weights", "afile", "--name", "a/b"], "--name"),
    (["--model", "m:f", "--weights", "afile", "--host", "bad..host"], "cannot be resolved"),  # no DNS query
    ([], "give --run"),
]


@pytest.mark.parametrize("args, needle", BAD_OPTIONS, ids=[" ".join(a)[:40] for a, _ in BAD_OPTIONS])
def test_bad_serve_options_end_in_one_sentence_before_the_model_is_built(args, needle, files):
    res = run("serve", *args, cwd=files, timeout=60)
    assert_clean_error(res, 2, needle)


def test_bad_weights_and_empty_runs_exit_1(files, tmp_path):
    from safetensors.torch import save_model

    assert_clean_error(run("serve", "--run", "emptydir", cwd=files), 1, "no complete checkpoint")
    assert_clean_error(run("serve", "--model", "m:f", "--weights", "notes.safetensors", cwd=files), 1,
                       "not a readable safetensors file")
    save_model(gated(), str(tmp_path / "w.safetensors"))
    data = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-4])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        model_mod.load(factory="serve_helpers:gated", weights=str(tmp_path / "cut.safetensors"), input_shape="4")
    wider = gated()
    wider.fc = torch.nn.Linear(8, 2)
    save_model(wider, str(tmp_path / "wider.safetensors"))
    with pytest.raises(CheckpointError, match="do not fit this model: .*size mismatch for fc.weight"):
        model_mod.load(factory="serve_helpers:gated", weights=str(tmp_path / "wider.safetensors"), input_shape="4")


# --------------------------------------------------------------------------- untrusted run directories

PROBE_MODULE = '''
from pathlib import Path
Path("imported").touch()
def make():
    Path("called").touch()
    import torch
    return torch.nn.Linear(4, 2)
'''


def test_the_run_never_decides_which_code_runs(tmp_path, monkeypatch):
    """A run of a custom model names its factory in meta.json; serve calls only the factory given
    with --model, and refuses when the two differ -- without importing either."""
    (tmp_path / "probe_mod.py").write_text(PROBE_MODULE)
    torch.manual_seed(0)
    run_dir = _checkpoint(tmp_path / "run", torch.nn.Linear(4, 2), {"kind": "custom"}, "probe_mod:make")
    without = run("serve", "--run", "run", "--input-shape", "4", cwd=tmp_path)
    assert_clean_error(without, 2, "--model package.module:factory", "probe_mod:make")
    _edit_meta(run_dir, lambda m: m["config"]["model"].update(name="os:getpid"))
    other = run("serve", "--run", "run", "--model", "probe_mod:make", "--input-shape", "4", cwd=tmp_path)
    assert_clean_error(other, 2, "probe_mod:make", "os:getpid")
    assert not (tmp_path / "imported").exists() and not (tmp_path / "called").exists()
    # the same factory on both sides: built, loaded and checked (in-process, no server)
    _edit_meta(run_dir, lambda m: m["config"]["model"].update(name="probe_mod:make"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    served = model_mod.load(run=str(run_dir), factory="probe_mod:make", input_shape="4")
    assert (tmp_path / "called").exists() and served.output.sample_shape == (2,)
    with pytest.raises(UsageError, match="built-in gpt"):
        model_mod.load(run=str(_gpt_run(tmp_path / "gpt")), factory="probe_mod:make")


DOCTORED = [
    (["workload", "gpt", "d_model"], 4_000_000, CheckpointError, "does not fit the model"),
    (["workload", "gpt", "seq_len"], 10**9, CheckpointError, "does not fit the model"),
    (["workload", "gpt", "vocab_size"], 10**30, CheckpointError, "up to 2147483647"),
    (["workload", "gpt", "d_model"], "16", CheckpointError, "must be a positive integer"),
    (["workload", "gpt", "n_head"], 3, CheckpointError, "divisible by n_head"),
    (["workload", "gpt", "evil"], 1, CheckpointError, "unknown field 'evil'"),
    (["workload", "gpt"], [1], CheckpointError, "workload.gpt must be an object"),
    (["workload", "kind"], 7, CheckpointError, "workload.kind must be a string"),
    (["config"], "x", CheckpointError, "config must be an object"),
    (["workload", "kind"], "custom", UsageError, "--model package.module:factory"),
]


@pytest.mark.parametrize("path, value, error, needle", DOCTORED, ids=[f"{p[-1]}={v!r}"[:30] for p, v, *_ in DOCTORED])
def test_a_doctored_meta_json_is_one_sentence_and_allocates_nothing(path, value, error, needle, tmp_path):
    def edit(meta):
        obj = meta
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value

    run_dir = _edit_meta(_gpt_run(tmp_path), edit)
    with pytest.raises(error, match=needle) as info:
        model_mod.load(run=str(run_dir))
    assert "\n" not in str(info.value)


def test_doctored_sizes_through_the_cli(tmp_path):
    _edit_meta(_gpt_run(tmp_path / "run"), lambda m: m["workload"]["gpt"].update(d_model=4_000_000))
    assert_clean_error(run("serve", "--run", "run", cwd=tmp_path), 1, "does not fit the model")


# --------------------------------------------------------------------------- stalled uploads

def _served_linear():
    spec_in = model_mod.TensorSpec("input", "FP32", (4,))
    return model_mod.ServedModel(name="gated", kind="custom", module=gated().eval(), input=spec_in,
                                 output=model_mod.TensorSpec("output", "FP32", (2,)))


def _stall(url: str, declared: int = 1000, sent: bytes = b'{"inputs": ') -> socket.socket:
    """Headers that announce ``declared`` body bytes, then only ``sent`` of them."""
    host, port = url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=20)
    sock.sendall(b"POST /v2/models/gated/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (declared, sent))
    return sock


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):               # until the server closes (socket timeout: 20 s)
        data += chunk
    return data


ROW = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}


def test_a_stalled_body_gets_408_and_its_connection_is_closed():
    cfg = ServeConfig(body_timeout_s=0.5, batch=BatchConfig(max_batch_size=2))
    with LiveServer(_served_linear(), cfg) as srv:
        sock = _stall(srv.url)
        reply = _read_all(sock)                    # returns only because the server closed it
        sock.close()
        after = httpx.post(srv.url + "/v2/models/gated/infer", json=ROW)
        text = httpx.get(srv.url + "/metrics").text
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply
    assert b"connection: close" in head.lower()
    assert "did not arrive within 0.5 s" in json.loads(body)["error"]
    assert after.status_code == 200
    assert 'tensorpilot_serve_requests_total{outcome="body_timeout",route="infer"} 1.0' in text


def test_stalled_uploads_do_not_delay_a_lone_request():
    """Five connections stall mid-body. The batcher waits for company only for requests that have
    arrived in full, so a lone request is answered at once, not after the 2 s batching delay."""
    delay_s = 2.0
    cfg = ServeConfig(body_timeout_s=60, batch=BatchConfig(max_batch_size=8, max_queue_delay_ms=delay_s * 1000))
    with LiveServer(_served_linear(), cfg) as srv:
        stalled = [_stall(srv.url) for _ in range(5)]
        wait_for(lambda: len(srv.server.server_state.tasks) >= 5, "the stalled requests to reach the app")
        elapsed = []
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            for _ in range(3):
                t0 = time.perf_counter()
                assert client.post("/v2/models/gated/infer", json=ROW).status_code == 200
                elapsed.append(time.perf_counter() - t0)
        for sock in stalled:
            sock.close()
    # typically a few ms each; half the delay leaves room for a loaded CI machine
    assert max(elapsed) < delay_s / 2, elapsed


# --------------------------------------------------------------------------- hostile HTTP, gpt

def test_hostile_gpt_requests_get_4xx_never_5xx(tmp_path):
    served = model_mod.load(run=str(_gpt_run(tmp_path)))
    cfg = ServeConfig(max_new_tokens=8, batch=BatchConfig(max_batch_size=2))
    gen = lambda **p: {"text_input": "hi", "parameters": p}                          # noqa: E731
    ids = lambda data, shape: {"inputs": [{"name": "input_ids", "datatype": "INT64",  # noqa: E731
                                           "shape": shape, "data": data}]}
    nested = [5]
    for _ in range(200):
        nested = [nested]
    cases = {
        "generate": [gen(max_tokens=-1), gen(max_tokens=0), gen(max_tokens=10**12), gen(max_tokens="5"),
                     gen(max_tokens=2.5), gen(temperature="hot"), gen(temperature=1e308), gen(top_k=-1),
                     gen(seed=2**70), {"text_input": ["a"]}, {"text_input": "a", "parameters": "x"},
                     b"\xff\xfe{}", b'{"text_input": "\\ud800"}', b'{"text_input": NaN}', b"", b"{" * 100_000],
        "infer": [ids([256], [1, 1]), ids([-1], [1, 1]), ids([2**63], [1, 1]), ids([1.5], [1, 1]),
                  ids([1] * 9, [1, 9]), ids(nested, [1, 1]), ids([1, 2], [3, 1]), b"\x80abc"],
    }
    timeouts = ["1e400", "nan", "inf", "-5", "0", "99999999999999", "soon"]
    with LiveServer(served, cfg) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        results = []
        for route, bodies in cases.items():
            for body in bodies:
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                results.append((route, body, client.post(f"/v2/models/gpt/{route}", content=content)))
        for value in timeouts:
            results.append(("timeout", value, client.post("/v2/models/gpt/generate", json=gen(max_tokens=1),
                                                            headers={"X-Request-Timeout-Ms": value})))
        ok = client.post("/v2/models/gpt/generate", json=gen(max_tokens=3, temperature=0))
    for route, body, r in results:
        assert r.status_code == 400, (route, str(body)[:80], r.status_code, r.text)
        assert r.json()["error"], (route, body)
    assert ok.status_code == 200 and isinstance(ok.json()["text_output"], str)


# --------------------------------------------------------------------------- drain on SIGTERM

def _start(args: list[str], cwd: Path) -> tuple[subprocess.Popen, str]:
    return start_cli(*args, cwd=cwd, env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **_env()))


def _status(url: str, path: str) -> int | None:
    try:
        return httpx.get(url + path).status_code
    except httpx.TransportError:
        return None


class Outcomes:
    """What each client saw: HTTP answers, refused connections, and requests that were fully sent
    on an established connection but got no answer (the failure this test exists for)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.answers: list[tuple[int, dict]] = []
        self.refused = 0
        self.lost: list[str] = []

    def add(self, kind: str, value=None):
        with self.lock:
            if kind == "answer":
                self.answers.append(value)
            elif kind == "refused":
                self.refused += 1
            else:
                self.lost.append(value)


def _client_loop(host: str, port: int, body: bytes, seen: Outcomes, progress: threading.Semaphore):
    """Infer requests back to back on a keep-alive connection; honours Retry-After like a polite
    client; ends when a connection is refused (the listener has closed)."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    for _ in range(10_000):
        try:
            conn.request("POST", "/v2/models/gated/infer", body, {"Content-Type": "application/json"})
        except ConnectionRefusedError:
            seen.add("refused")
            return
        except OSError as exc:                     # established, but the request could not be sent
            seen.add("lost", f"send: {exc!r}")
            conn.close()
            continue
        try:
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException) as exc:
            seen.add("lost", f"no response: {exc!r}")
            conn.close()
            continue
        headers = {k.lower(): v for k, v in resp.getheaders()}
        seen.add("answer", (resp.status, headers))
        progress.release()
        if resp.status == 503:
            time.sleep(float(headers.get("retry-after", "1")))
    seen.add("lost", "the client loop never saw the server go away")


def test_sigterm_drains_every_accepted_request_gets_an_answer(tmp_path):
    from safetensors.torch import save_model

    save_model(gated(), str(tmp_path / "w.safetensors"))
    proc, url = _start(["--model", "serve_helpers:gated", "--weights", "w.safetensors", "--input-shape", "4",
                        "--precision", "fp32", "--max-batch-size", "4", "--drain-window", "1"], cwd=tmp_path)
    host, port = url.split("//")[1].split(":")
    body = json.dumps(ROW).encode()
    seen, progress = Outcomes(), threading.Semaphore(0)
    try:
        # a keep-alive connection that is idle when SIGTERM arrives and used again during the drain
        idle = http.client.HTTPConnection(host, int(port), timeout=30)
        idle.request("POST", "/v2/models/gated/infer", body, {"Content-Type": "application/json"})
        first = idle.getresponse()
        assert first.status == 200 and first.read()
        clients = [threading.Thread(target=_client_loop, args=(host, int(port), body, seen, progress))
                   for _ in range(4)]
        for t in clients:
            t.start()
        for _ in range(40):                        # load is flowing: 40 answers so far
            assert progress.acquire(timeout=30)
        t_sigterm = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _status(url, "/v2/health/ready") in (503, None), "the drain to begin")
        idle.request("POST", "/v2/models/gated/infer", body, {"Content-Type": "application/json"})
        late = idle.getresponse()
        late_headers, late_body = {k.lower(): v for k, v in late.getheaders()}, late.read()
        for t in clients:
            t.join(timeout=60)
        out = proc.communicate(timeout=60)[0]
        stopped_s = time.monotonic() - t_sigterm
    finally:
        proc.kill()
    assert not seen.lost, seen.lost
    statuses = [status for status, _ in seen.answers]
    assert set(statuses) <= {200, 503}, sorted(set(statuses))
    drained = [h for status, h in seen.answers if status == 503]
    assert drained and all(h["connection"] == "close" and int(h["retry-after"]) >= 1 for h in drained)
    assert seen.refused == len(clients)            # every client ended at the closed listener
    assert late.status == 503 and "shutting down" in json.loads(late_body)["error"], late_body
    assert late_headers["connection"] == "close"
    assert proc.returncode == 0 and "draining for 1 s" in out, out
    assert stopped_s < 30, stopped_s               # window + in-flight work, far below the bound


def test_sighup_drains_like_sigterm(tmp_path):
    """A closed terminal or `kill -HUP`: the request being computed still gets its answer, and
    the server exits 0 after the drain window (Python's default for SIGHUP would end it at once,
    exit 129)."""
    from safetensors.torch import save_model

    from serve_helpers import GATE_VALUE

    save_model(gated(), str(tmp_path / "w.safetensors"))
    gate = tmp_path / "gate"
    gate.mkdir()
    proc, url = start_cli("--model", "serve_helpers:gated", "--weights", "w.safetensors", "--input-shape", "4",
                          "--precision", "fp32", "--max-batch-size", "2", "--drain-window", "1", cwd=tmp_path,
                          env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                                   **_env(TP_GATE_DIR=str(gate))))
    held = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [GATE_VALUE, 0, 0, 0]}]}
    answer = []
    client = threading.Thread(target=lambda: answer.append(
        httpx.post(url + "/v2/models/gated/infer", json=held, timeout=60)))
    try:
        client.start()
        wait_for(lambda: (gate / "entered").exists(), "the request to reach the model")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: _status(url, "/v2/health/ready") == 503, "the drain to begin")
        assert proc.poll() is None                 # still answering: readiness said 503
        (gate / "release").touch()
        client.join(timeout=60)
        out = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert answer and answer[0].status_code == 200, answer
    assert proc.returncode == 0 and "draining for 1 s" in out and "in-flight requests finished" in out, out


def test_sighup_stays_ignored_under_nohup():
    # `nohup tensorpilot serve &` ignores SIGHUP on purpose: closing the terminal must not stop it
    from tensorpilot.serve import server

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert server._stop_signals_not_ignored() == []
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert server._stop_signals_not_ignored() == ([signal.SIGHUP] if previous is not signal.SIG_IGN else [])


def test_a_deeply_nested_body_gets_400_and_the_server_stays_up(tmp_path):
    """~600 KB of nested objects, well under --max-request-bytes: orjson before 3.9.15 recursed
    on it until the process died (exit 139). Sent to a real server process, which must answer
    400 and then keep serving."""
    from safetensors.torch import save_model

    save_model(gated(), str(tmp_path / "w.safetensors"))
    proc, url = _start(["--model", "serve_helpers:gated", "--weights", "w.safetensors", "--input-shape", "4",
                        "--precision", "fp32", "--max-batch-size", "2"], cwd=tmp_path)
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    arrays = b"[" * 100_000 + b"]" * 100_000
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            replies = [client.post("/v2/models/gated/infer", content=body,
                                   headers={"content-type": "application/json"}) for body in (deep, arrays)]
            after = client.post("/v2/models/gated/infer", json=ROW)
        alive = proc.poll() is None
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0]
    for r in replies:
        assert r.status_code == 400 and "more than 64 levels deep" in r.json()["error"], (r.status_code, r.text)
    assert alive and after.status_code == 200, out


def test_a_tiny_temperature_is_greedy_not_an_error(tmp_path):
    """temperature 1e-300 underflows to 0 in float32; the shared sampler (workloads.gpt.next_token)
    shifts by the row maximum and divides in float64, so it samples the argmax: the same text as
    temperature 0, over /generate and /generate_stream."""
    served = model_mod.load(run=str(_gpt_run(tmp_path)))
    cfg = ServeConfig(max_new_tokens=16, batch=BatchConfig(max_batch_size=2))

    def body(temperature: float, **extra) -> dict:
        return {"text_input": "def ", "parameters": {"max_tokens": 12, "temperature": temperature, "seed": 3,
                                                     **extra}}

    with LiveServer(served, cfg) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        greedy = client.post("/v2/models/gpt/generate", json=body(0))
        replies = [(client.post("/v2/models/gpt/generate", json=body(1e-300, **k)),
                    client.post("/v2/models/gpt/generate_stream", json=body(1e-300, **k)))
                   for k in ({}, {"top_k": 0})]        # the default top_k (40), and all tokens
        after = client.get("/v2/health/ready")
    assert greedy.status_code == 200, greedy.text
    text = greedy.json()["text_output"]
    for tiny, stream in replies:
        assert tiny.status_code == 200 and tiny.json()["text_output"] == text, tiny.text
        assert stream.status_code == 200 and "event: error" not in stream.text, stream.text
        events = [json.loads(line[len("data: "):]) for line in stream.text.splitlines() if line.startswith("data: ")]
        assert len(events) == 12 and "".join(e["text_output"] for e in events) == text
    assert after.status_code == 200


# --------------------------------------------------------------------------- a distributed run

def _dcp_run(root: Path) -> Path:
    """What `train --nproc 2` leaves (docs/distributed.md): meta.json says "format": "dcp" and the
    weights are DCP shards, so there is no model.safetensors."""
    run_dir = _edit_meta(_gpt_run(root), lambda m: m.update(format="dcp"))
    ckpt = next(run_dir.glob("checkpoints/*"))
    (ckpt / "model.safetensors").rename(ckpt / "__0_0.distcp")
    return run_dir


def test_a_distributed_run_is_refused_with_the_command_that_converts_it(tmp_path):
    _dcp_run(tmp_path / "run")
    for args in (["serve", "--run", "run"], ["deploy", "k8s", "--run", "run", "--out", "k8s"]):
        line = assert_clean_error(run(*args, cwd=tmp_path, timeout=60), 1, "distributed run",
                                  "`tensorpilot train --resume run --steps 2`", "then run this command again")
        assert "model.safetensors is missing" not in line
    assert not (tmp_path / "k8s").exists()
    ckpt = next((tmp_path / "run").glob("checkpoints/*"))
    assert_clean_error(run("serve", "--run", str(ckpt.relative_to(tmp_path)), cwd=tmp_path, timeout=60), 1,
                       f"--resume {ckpt.relative_to(tmp_path)} --steps 2`", "then give --run run.")


@pytest.mark.slow
def test_the_suggested_conversion_of_a_distributed_run_works_when_pasted(tmp_path):
    """For real: two processes over gloo write a DCP checkpoint; the command serve suggests
    resumes it in one process, and serve then loads the run."""
    import shlex

    from battery import TINY

    res = run("train", *TINY, "--steps", "2", "--nproc", "2", "--run-dir", "run", cwd=tmp_path, timeout=300)
    assert res.code == 0, str(res)
    line = assert_clean_error(run("serve", "--run", "run", cwd=tmp_path, timeout=60), 1, "distributed run")
    command = shlex.split(line.split("`")[1])
    assert command[:2] == ["tensorpilot", "train"], line
    res = run(*command[1:], cwd=tmp_path, timeout=300)
    assert res.code == 0, str(res)
    served = model_mod.load(run=str(tmp_path / "run"))
    assert served.kind == "gpt" and served.source.endswith("step_00000003")
