"""`tensorpilot serve` end to end: real servers on ephemeral loopback ports (uvicorn in a thread,
or the CLI in a subprocess), checked against independent references. No test asserts a timing:
blocking is done with a file gate (serve_helpers.Gated), waits are liveness guards."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

import torch  # noqa: E402

from serve_helpers import GATE_VALUE, SEEN_ROWS, LiveServer, metric, start_cli, wait_for  # noqa: E402

from tensorpilot.serve import model as model_mod  # noqa: E402
from tensorpilot.serve.config import BatchConfig, ServeConfig  # noqa: E402

HERE = Path(__file__).parent
# a 2-layer 64-wide byte gpt with a 32-byte context (as conftest.FAST; not imported from there
# because tests/unit has a conftest module of the same name)
TINY_GPT = ["--model.n_layer", "2", "--model.d_model", "64", "--model.n_head", "2", "--model.seq_len", "32",
            "--batch-size", "8", "--data.max_bytes", "400000", "--train.eval_batches", "1"]


def _env(**extra) -> dict[str, str]:
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path, **extra)


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """A cnn and a tiny gpt run, trained for 2 steps by the real CLI (in parallel)."""
    root = tmp_path_factory.mktemp("serve-runs")
    common = ["--steps", "2", "--compile", "off", "--logging.progress", "off", "--no-logging.tensorboard"]
    cmds = {"cnn": ["--model", "cnn", "--batch-size", "8", "--train.eval_batches", "1"],
            "gpt": TINY_GPT}
    procs = {k: subprocess.Popen([sys.executable, "-m", "tensorpilot", "train", *v, *common,
                                  "--run-dir", str(root / k)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=_env())
             for k, v in cmds.items()}
    for k, p in procs.items():
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
    return {k: root / k for k in cmds}


def _cfg(**batch) -> ServeConfig:
    return ServeConfig(batch=BatchConfig(**batch))


def _infer_body(rows: torch.Tensor, name: str = "input") -> dict:
    return {"inputs": [{"name": name, "shape": list(rows.shape), "datatype": "FP32",
                        "data": rows.reshape(-1).tolist()}]}


def _reference_cnn(run: Path):
    """The plain model, built and loaded without tensorpilot.serve: the independent reference."""
    from safetensors.torch import load_file

    from tensorpilot.training import checkpoint as ckpt_io
    from tensorpilot.workloads.vision import CNN

    ckpt = ckpt_io.find_checkpoint(run)
    meta = json.loads((ckpt / "meta.json").read_text())
    net = CNN(3, meta["workload"]["channels"], 10)
    net.load_state_dict(load_file(ckpt / "model.safetensors"))
    return net.eval()


# --------------------------------------------------------------------------- batching

def test_concurrent_requests_are_batched_and_equal_unbatched_results(runs):
    served = model_mod.load(run=str(runs["cnn"]))
    ref = _reference_cnn(runs["cnn"])
    inputs = torch.randn(48, 1, 3, 32, 32, generator=torch.Generator().manual_seed(3))

    async def fire(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(*(client.post("/v2/models/cnn/infer", json=_infer_body(x))
                                          for x in inputs))

    with LiveServer(served, _cfg(max_batch_size=16, max_queue_delay_ms=20)) as srv:
        responses = asyncio.run(fire(srv.url))
        text = httpx.get(srv.url + "/metrics").text
    assert [r.status_code for r in responses] == [200] * len(inputs)
    with torch.inference_mode():
        for x, r in zip(inputs, responses):
            out = r.json()["outputs"][0]
            assert out["shape"] == [1, 10]
            torch.testing.assert_close(torch.tensor(out["data"]).reshape(1, 10), ref(x), atol=1e-4, rtol=1e-4)
    rows = metric(text, "tensorpilot_serve_batch_size_sum")
    batches = metric(text, "tensorpilot_serve_batch_size_count")
    assert rows == len(inputs)                                  # warm-up is not traffic
    assert rows / batches > 1, "no batch formed under concurrent load"
    assert 'tensorpilot_serve_requests_total{outcome="ok",route="infer"} 48.0' in text


# --------------------------------------------------------------------------- queue, deadline

@pytest.fixture()
def gate(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_GATE_DIR", str(tmp_path))
    SEEN_ROWS.clear()
    return tmp_path


def _gated_served():
    from serve_helpers import gated

    spec_in = model_mod.TensorSpec("input", "FP32", (4,))
    return model_mod.ServedModel(name="gated", kind="custom", module=gated().eval(), input=spec_in,
                                 output=model_mod.TensorSpec("output", "FP32", (2,)))


def _row(first: float) -> dict:
    return _infer_body(torch.tensor([[first, 1.0, 2.0, 3.0]]))


def _post_in_thread(url: str, body: dict, results: list, headers=None) -> threading.Thread:
    t = threading.Thread(target=lambda: results.append(
        httpx.post(url + "/v2/models/gated/infer", json=body, headers=headers, timeout=60)))
    t.start()
    return t


def test_full_queue_answers_503_with_retry_after(gate):
    with LiveServer(_gated_served(), _cfg(max_batch_size=1, max_queue=2)) as srv:
        results: list = []
        threads = [_post_in_thread(srv.url, _row(GATE_VALUE), results)]
        wait_for(lambda: (gate / "entered").exists(), "the gated batch to start")
        threads += [_post_in_thread(srv.url, _row(float(i)), results) for i in (1, 2)]
        wait_for(lambda: srv.state().batcher.depth == 2, "two queued requests")
        over = httpx.post(srv.url + "/v2/models/gated/infer", json=_row(3.0))
        (gate / "release").touch()
        for t in threads:
            t.join()
        text = httpx.get(srv.url + "/metrics").text
    assert over.status_code == 503 and over.headers["retry-after"] == "1"
    assert "queue is full" in over.json()["error"]
    assert sorted(r.status_code for r in results) == [200, 200, 200]
    assert 'tensorpilot_serve_requests_total{outcome="overloaded",route="infer"} 1.0' in text


def test_request_expiring_in_queue_gets_504_and_is_never_computed(gate):
    with LiveServer(_gated_served(), _cfg(max_batch_size=1)) as srv:
        first: list = []
        t = _post_in_thread(srv.url, _row(GATE_VALUE), first)
        wait_for(lambda: (gate / "entered").exists(), "the gated batch to start")
        late = httpx.post(srv.url + "/v2/models/gated/infer", json=_row(5.0),
                          headers={"X-Request-Timeout-Ms": "50"})
        (gate / "release").touch()
        t.join()
    assert late.status_code == 504 and "deadline" in late.json()["error"]
    assert first[0].status_code == 200
    assert not any(row[0] == 5.0 for row in SEEN_ROWS), "the expired request was computed"


def test_graceful_shutdown_in_thread_finishes_in_flight_request(gate):
    srv = LiveServer(_gated_served(), _cfg(max_batch_size=1)).__enter__()
    results: list = []
    t = _post_in_thread(srv.url, _row(GATE_VALUE), results)
    wait_for(lambda: (gate / "entered").exists(), "the gated batch to start")
    srv.server.should_exit = True                      # what SIGTERM does
    (gate / "release").touch()
    t.join()
    srv.thread.join(timeout=60)
    assert results[0].status_code == 200 and results[0].json()["outputs"][0]["shape"] == [1, 2]
    assert not srv.thread.is_alive()


# --------------------------------------------------------------------------- bad input

@pytest.fixture(scope="module")
def cnn_server(runs):
    cfg = ServeConfig(api_key="s3cret", max_request_bytes=200_000, batch=BatchConfig(max_batch_size=4))
    with LiveServer(model_mod.load(run=str(runs["cnn"])), cfg) as srv:
        yield srv


def test_malformed_requests_get_4xx_with_a_message_never_5xx(cnn_server):
    url, auth = cnn_server.url + "/v2/models/cnn/infer", {"Authorization": "Bearer s3cret"}
    good = _infer_body(torch.zeros(1, 3, 32, 32))
    cases = {
        "not json": (b"{", 400),
        "array body": (b"[1, 2]", 400),
        "no inputs": (b"{}", 400),
        "wrong name": (json.dumps({"inputs": [dict(good["inputs"][0], name="x")]}).encode(), 400),
        "wrong dtype": (json.dumps({"inputs": [dict(good["inputs"][0], datatype="INT8")]}).encode(), 400),
        "wrong shape": (json.dumps({"inputs": [dict(good["inputs"][0], shape=[1, 3, 32, 31])]}).encode(), 400),
        "huge shape": (json.dumps({"inputs": [dict(good["inputs"][0], shape=[10**12, 3, 32, 32])]}).encode(), 400),
        "too few values": (json.dumps({"inputs": [dict(good["inputs"][0], data=[1.0])]}).encode(), 400),
        "strings": (json.dumps({"inputs": [dict(good["inputs"][0], data=["a"] * 3072)]}).encode(), 400),
        "NaN": (json.dumps({"inputs": [dict(good["inputs"][0], data=[float("nan")] * 3072)]}).encode(), 400),
        "ragged": (json.dumps({"inputs": [dict(good["inputs"][0], data=[[1.0], [1.0, 2.0]])]}).encode(), 400),
        "too many rows": (json.dumps({"inputs": [dict(good["inputs"][0], shape=[5, 3, 32, 32],
                                                      data=[0.0] * 5 * 3072)]}).encode(), 400),
        "too large": (b"[" + b"0," * 150_000 + b"0]", 413),
    }
    for what, (body, status) in cases.items():
        r = httpx.post(url, content=body, headers=auth)
        assert r.status_code == status, (what, r.status_code, r.text)
        assert r.json()["error"], what
    assert httpx.post(url, json=good, headers={**auth, "X-Request-Timeout-Ms": "soon"}).status_code == 400
    assert httpx.post(cnn_server.url + "/v2/models/nope/infer", json=good, headers=auth).status_code == 404
    # authentication: health stays open (probes), everything else needs the key
    assert httpx.post(url, json=good).status_code == 401
    assert httpx.post(url, json=good, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(cnn_server.url + "/metrics").status_code == 401
    assert httpx.get(cnn_server.url + "/v2/health/live").status_code == 200
    assert httpx.post(url, json=good, headers=auth).status_code == 200


def test_openapi_fuzzing_finds_no_server_error(cnn_server):
    """Property-based requests from the server's own OpenAPI schema (schemathesis): zero 5xx."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, Phase, settings

    auth = {"Authorization": "Bearer s3cret"}
    schema = schemathesis.openapi.from_url(cnn_server.url + "/openapi.json", headers=auth)
    failures, calls = [], []
    # schemathesis' pytest integration needs collection-time schemas; run its strategies directly
    from hypothesis import given

    for op_result in schema.get_all_operations():
        operation = op_result.ok()

        @settings(max_examples=25, deadline=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def check(case):
            if case.method == "POST":          # fuzz the body of the served model, not only 404s
                case.path_parameters = {"name": "cnn"}
            response = case.call(base_url=cnn_server.url, headers=auth)
            calls.append((case.method, response.status_code))
            if response.status_code >= 500:
                failures.append((case.method, case.formatted_path, response.status_code, response.text[:200]))

        check()
    assert not failures, failures[:5]
    assert len({m for m, _ in calls}) == 2 and len(calls) > 50          # GET and POST routes were fuzzed
    assert any(code == 400 for _, code in calls) and any(code == 200 for _, code in calls), sorted(set(calls))


# --------------------------------------------------------------------------- CLI, gpt, shutdown

def test_cli_gpt_generation_matches_tensorpilot_generate_and_streams(runs, tmp_path):
    from tensorpilot.api import generate

    proc, url = start_cli("--run", str(runs["gpt"]), "--precision", "fp32", "--max-batch-size", "4",
                           cwd=tmp_path, env=_env())
    try:
        body = {"text_input": "def ", "parameters": {"max_tokens": 12, "temperature": 0}}
        whole = httpx.post(url + "/v2/models/gpt/generate", json=body, timeout=60)
        events = []
        with httpx.stream("POST", url + "/v2/models/gpt/generate_stream", json=body, timeout=60) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        meta = httpx.get(url + "/v2/models/gpt").json()
        bad = httpx.post(url + "/v2/models/gpt/generate", json={"text_input": 3})
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    expected = generate(runs["gpt"], "def ", 12, temperature=0.0)[len("def "):]
    assert whole.status_code == 200 and whole.json()["text_output"] == expected
    assert len(events) == 12 and "".join(e["text_output"] for e in events) == expected
    assert events[-1]["finish_reason"] == "length"
    assert meta["inputs"][0] == {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]}
    assert bad.status_code == 400
    assert "precision: fp32" in out and proc.returncode == 0, out


def test_cli_sigterm_finishes_in_flight_request_then_exits(tmp_path):
    from safetensors.torch import save_model
    from serve_helpers import gated

    weights = tmp_path / "w.safetensors"
    save_model(gated(), str(weights))
    proc, url = start_cli("--model", "serve_helpers:gated", "--weights", str(weights), "--input-shape", "4",
                           "--precision", "fp32", "--max-batch-size", "2", cwd=tmp_path,
                           env=_env(TP_GATE_DIR=str(tmp_path)))
    results: list = []
    try:
        t = _post_in_thread(url, _row(GATE_VALUE), results)
        wait_for(lambda: (tmp_path / "entered").exists(), "the gated batch to start")
        proc.send_signal(signal.SIGTERM)
        (tmp_path / "release").touch()
        t.join()
        out = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    expected = gated().fc(torch.tensor([[GATE_VALUE, 1.0, 2.0, 3.0]])).tolist()   # the plain Linear
    assert results[0].status_code == 200, results[0].text
    torch.testing.assert_close(torch.tensor(results[0].json()["outputs"][0]["data"]),
                               torch.tensor(expected).reshape(-1))
    assert proc.returncode == 0 and "in-flight requests finished" in out, out


def test_cli_reports_user_errors_in_one_sentence(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tensorpilot", "serve", "--run", str(tmp_path / "none")],
                          capture_output=True, text=True, env=_env())
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("tensorpilot serve: error:"), proc.stderr
