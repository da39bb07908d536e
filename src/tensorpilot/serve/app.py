"""The FastAPI application: KServe v2 routes, gpt text generation (SSE), /metrics.

Request path of ``POST /v2/models/{name}/infer``::

    Guard (ASGI): auth (401) -> body, bounded in size (413 before reading more) and time (408)
      -> draining? (503) -> announce arrival to the batcher
      -> route: deadline header -> parse + validate (400) -> batcher.submit (503 / 504)
      -> compute thread (precision runner) -> v2 JSON response
    Guard counts the response status per route in tensorpilot_serve_requests_total.

Shutdown (server.py) has a drain phase: from the first SIGTERM until the drain window ends, new
infer/generate requests get 503 + Retry-After, readiness is 503, and every response closes its
connection, so no keep-alive connection sits idle when uvicorn finally closes idle ones.

Routes read the raw body and parse it once (orjson) instead of through pydantic models: at a
few hundred requests per second on two cores, per-request Python overhead is the budget.
"""

# no `from __future__ import annotations` here: FastAPI resolves the route annotations
# (``request: Request``) at runtime, and Request is imported inside build_app (lazily).
import asyncio
import codecs
import contextlib
import hmac
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tensorpilot.version import __version__
from tensorpilot.errors import first_line
from tensorpilot.serve import protocol as P
from tensorpilot.serve.batcher import Batcher, DeadlineExceeded, NotAccepting, QueueFull
from tensorpilot.serve.config import ServeConfig
from tensorpilot.serve.metrics import Metrics

TIMEOUT_HEADER = "x-request-timeout-ms"
MAX_TIMEOUT_MS = 24 * 3600 * 1000
RETRY_AFTER_S = "1"
MODEL_ROUTES = ("infer", "generate", "generate_stream")
WARM_EVERY_SIZE_UP_TO = 64


@dataclass(kw_only=True)
class State:
    served: Any                                   # ServedModel
    cfg: ServeConfig
    precision: str = "auto"
    caps: Any = None                              # DeviceCaps; None -> detected at start-up
    log: Callable[[str], None] = print
    metrics: Metrics = None
    batcher: Batcher = None
    runner: Callable | None = None                # chosen precision's (B, ...) -> (B, ...) function
    prepared: Any = None                          # precision.Prepared
    ready: bool = False
    startup_error: str | None = None
    warmed_batch_sizes: list[int] = field(default_factory=list)
    drain_until: float | None = None              # time.monotonic() when the drain window ends

    def run_batch(self, x):
        return self.runner(x.to(self.served.device, non_blocking=True)).cpu()

    def begin_drain(self, until: float) -> None:
        """Called from the SIGTERM handler, which interrupts the event loop anywhere: a plain
        assignment only (no locks, no I/O)."""
        self.drain_until = until

    @property
    def draining(self) -> bool:
        return self.drain_until is not None

    @property
    def serving(self) -> bool:
        """What readiness reports: warmed up and not shutting down."""
        return self.ready and self.drain_until is None

    def drain_retry_after(self) -> str:
        """Seconds until a retry can no longer reach this server mid-drain: its listener closes
        when the window ends, so the retry goes to another replica (or is refused at once)."""
        return str(max(1, math.ceil(self.drain_until - time.monotonic()) + 1))


class HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def _error_body(message: str) -> bytes:
    return P.dumps({"error": message})


# ----------------------------------------------------------------------------- ASGI guard

def _route_label(path: str) -> str:
    for suffix in ("/infer", "/generate_stream", "/generate"):
        if path.endswith(suffix):
            return suffix[1:]
    if path.startswith("/v2/health"):
        return "health"
    return "metrics" if path == "/metrics" else "other"


class Guard:
    """Authentication, request size and time limits, the drain refusal, arrival announcement and
    outcome counting, before FastAPI sees the request (a plain ASGI middleware: no per-request
    Starlette objects)."""

    def __init__(self, app, state: State):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        st = self.state
        label = _route_label(scope["path"])
        status_seen = [500]

        async def guarded_send(message):
            if message["type"] == "http.response.start":
                status_seen[0] = message["status"]
                if st.draining:                    # this answer is the connection's last
                    message = _with_connection_close(message)
            await send(message)

        arrival = [False]                          # announced; the route clears it when it enqueues
        try:
            try:
                receive = await self._admit(scope, receive, label, arrival)
            except HTTPError as exc:
                return await self._reply(guarded_send, exc.status, exc.message, exc.headers)
            await self.app(scope, receive, guarded_send)
        finally:
            if arrival[0]:
                st.batcher.withdraw()
            if label != "health" and label != "metrics" and st.metrics is not None:
                st.metrics.count(label, status_seen[0])

    async def _admit(self, scope, receive, label: str, arrival: list[bool]):
        """The request's receive channel once it may reach the app, or an HTTPError."""
        st = self.state
        if st.cfg.api_key and label != "health" and not self._authorized(scope):
            raise HTTPError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'.",
                            {"www-authenticate": "Bearer"})
        if scope["method"] in ("POST", "PUT", "PATCH"):
            receive = _replay(await self._read_body(scope, receive), receive)
        if label in MODEL_ROUTES and st.batcher is not None:
            if st.draining:
                raise HTTPError(503, "the server is shutting down; retry on another replica.",
                                {"retry-after": st.drain_retry_after()})
            # announced only now that the whole body is here: an upload that stalls must not
            # make the batcher hold a lone request for company that is not coming
            arrival[0] = True
            st.batcher.announce()
            scope["tp_arrival"] = arrival
        return receive

    def _authorized(self, scope) -> bool:
        expected = f"Bearer {self.state.cfg.api_key}".encode()
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, expected)
        return False

    async def _read_body(self, scope, receive) -> bytes:
        """The whole body, or 413 (over the size limit: from Content-Length before reading, or
        while reading a chunked upload) or 408 (not complete within the body timeout)."""
        cfg = self.state.cfg
        too_large = HTTPError(413, f"the request body exceeds {cfg.max_request_bytes} bytes.")
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    continue
                if declared > cfg.max_request_bytes:
                    raise too_large                # refuse before reading the body
        deadline = time.monotonic() + cfg.body_timeout_s
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                raise HTTPError(408, f"the request body did not arrive within {cfg.body_timeout_s:g} s; "
                                     "send it without pauses.") from None
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cfg.max_request_bytes:       # chunked upload without a length
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    @staticmethod
    async def _reply(send, status: int, message: str, headers: dict[str, str] | None = None):
        body = _error_body(message)
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")] + [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})


def _with_connection_close(start: dict) -> dict:
    headers = list(start.get("headers", []))
    if not any(name.lower() == b"connection" for name, _ in headers):
        headers.append((b"connection", b"close"))
    return dict(start, headers=headers)


def _replay(body: bytes, receive):
    sent = [False]

    async def replay():
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()                     # then wait for the disconnect as usual
    return replay


# ----------------------------------------------------------------------------- helpers

def _deadline(request, cfg: ServeConfig) -> float:
    raw = request.headers.get(TIMEOUT_HEADER)
    ms = cfg.batch.default_timeout_ms
    if raw is not None:
        try:
            ms = float(raw)
        except ValueError:
            ms = -1.0
        if not 0 < ms <= MAX_TIMEOUT_MS:
            raise HTTPError(400, f"header X-Request-Timeout-Ms must be a number of milliseconds "
                                 f"between 0 and {MAX_TIMEOUT_MS}, got {raw!r}.")
    return time.monotonic() + ms / 1000


def _enqueued(request) -> None:
    """Tell the batcher this request is no longer 'arriving' (it is queued or gave up)."""
    arrival = request.scope.get("tp_arrival")
    if arrival and arrival[0]:
        arrival[0] = False
        request.app.state.tp.batcher.withdraw()


async def _submit(st: State, request, x, deadline: float):
    _enqueued(request)
    try:
        return await st.batcher.submit(x, deadline)
    except QueueFull as exc:
        raise HTTPError(503, f"server overloaded: {exc}; retry later.", {"retry-after": RETRY_AFTER_S}) from None
    except NotAccepting as exc:
        raise HTTPError(503, f"not accepting requests: {exc}.", {"retry-after": RETRY_AFTER_S}) from None
    except DeadlineExceeded as exc:
        raise HTTPError(504, f"deadline exceeded: {exc}.") from None


def _check_model(st: State, name: str, need_ready: bool = True) -> None:
    if name != st.served.name:
        raise HTTPError(404, f"unknown model {name!r}: this server serves {st.served.name!r}.")
    if need_ready and not st.ready:
        why = st.startup_error or "the model is warming up"
        raise HTTPError(503, f"not ready: {why}.", {"retry-after": RETRY_AFTER_S})


def warmup_batch_sizes(max_batch: int) -> list[int]:
    """Every size up to 64, then powers of two and the largest. The first forward pass at a new
    shape pays one-off costs (kernel and algorithm selection, allocator growth), so the usual
    sizes are all run once; above 64, running every size would take N^2/2 rows (8 M at 4096)."""
    small = list(range(1, min(max_batch, WARM_EVERY_SIZE_UP_TO) + 1))
    powers = [1 << k for k in range(WARM_EVERY_SIZE_UP_TO.bit_length(), max_batch.bit_length())
              if (1 << k) < max_batch]
    return small + powers + ([max_batch] if max_batch > WARM_EVERY_SIZE_UP_TO else [])


def _describe_sizes(sizes: list[int]) -> str:
    upto = max(s for i, s in enumerate(sizes, start=1) if s == i)       # 1..k run in full
    rest = [s for s in sizes if s > upto]
    return f"1..{upto}" + ("".join(f", {s}" for s in rest))


def sample_next(logits, temperature: float, top_k: int, generator) -> int:
    """Next token from (1, V) logits by GPT.generate's own sampler, so a seed gives the same text
    as `tensorpilot generate` up to batched-vs-single float rounding."""
    from tensorpilot.workloads.gpt import next_token

    return int(next_token(logits.float(), temperature, top_k, generator)[0, 0])


# ----------------------------------------------------------------------------- the app

def build_app(served, cfg: ServeConfig, *, precision: str = "auto", caps=None,
              log: Callable[[str], None] = print):
    """The ASGI application serving ``served`` (a ServedModel)."""
    import torch
    from fastapi import FastAPI, Request
    from fastapi.responses import Response, StreamingResponse

    st = State(served=served, cfg=cfg, precision=precision, caps=caps, log=log,
               metrics=Metrics(cfg.batch.max_batch_size))
    st.batcher = Batcher(st.run_batch, cfg.batch, st.metrics)
    st.metrics.ready.set_function(lambda: float(st.serving))
    spec_in, spec_out = served.input, served.output

    async def warm_up() -> None:
        """Choose the precision, then run the warm-up batch sizes once: ready only after that."""
        from tensorpilot.hardware.device import detect
        from tensorpilot.serve import precision as prec

        try:
            caps_ = st.caps or detect(served.device)
            st.prepared = await st.batcher.run_sync(prec.prepare, served, st.precision, caps_)
            st.runner = st.prepared.run
            acc = st.prepared.accuracy
            log(f"precision: {st.prepared.name} ({st.prepared.reason})"
                + (f"; accuracy vs fp32: {acc.describe()}" if acc else ""))
            for b in warmup_batch_sizes(cfg.batch.max_batch_size):
                await st.batcher.run_sync(st.run_batch, served.example(b, seed=2))
                st.warmed_batch_sizes.append(b)
            st.ready = True
            log(f"ready: warmed up batch sizes {_describe_sizes(st.warmed_batch_sizes)} at sample "
                f"shape {list(spec_in.full_sample_shape)}")
        except Exception as exc:               # reported by /v2/health/ready; the server stays up
            st.startup_error = f"start-up failed: {type(exc).__name__}: {first_line(exc)}"
            log(st.startup_error)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        st.batcher.start()
        task = asyncio.get_running_loop().create_task(warm_up())
        yield
        # uvicorn calls this after in-flight requests finished (graceful shutdown)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await st.batcher.close()

    app = FastAPI(title="tensorpilot serve", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None,
                  description="KServe v2 / Open Inference Protocol inference with dynamic batching.")
    app.state.tp = st
    app.add_middleware(Guard, state=st)

    @app.exception_handler(HTTPError)
    async def _http_error(request, exc: HTTPError):
        return Response(_error_body(exc.message), status_code=exc.status, headers=exc.headers,
                        media_type="application/json")

    @app.exception_handler(P.BadRequest)
    async def _bad_request(request, exc: P.BadRequest):
        return Response(_error_body(str(exc)), status_code=400, media_type="application/json")

    def json(obj: Any, status: int = 200) -> Response:
        return Response(P.dumps(obj), status_code=status, media_type="application/json")

    model_path = "/v2/models/{name}"
    err = {"content": {"application/json": {"schema": {
        "type": "object", "properties": {"error": {"type": "string"}}}}}}

    @app.get("/v2/health/live", summary="Liveness: the process serves HTTP.")
    async def live():
        return json({"live": True})

    @app.get("/v2/health/ready", summary="Readiness: warmed up and not shutting down.",
             responses={503: err})
    async def ready():
        return json({"ready": st.serving}, 200 if st.serving else 503)

    @app.get("/v2", summary="Server metadata.")
    async def server_metadata():
        return json({"name": "tensorpilot", "version": __version__, "extensions": []})

    @app.get(model_path, summary="Model metadata: inputs and outputs.", responses={404: err})
    async def model_metadata(name: str):
        _check_model(st, name, need_ready=False)
        prepared = st.prepared
        return json({"name": served.name, "versions": ["1"], "platform": "pytorch",
                     "inputs": [spec_in.metadata()], "outputs": [spec_out.metadata()],
                     "parameters": {"kind": served.kind, "source": served.source,
                                    "precision": prepared.name if prepared else None,
                                    "max_batch_size": cfg.batch.max_batch_size}})

    @app.get(model_path + "/ready", summary="Model readiness.", responses={404: err, 503: err})
    async def model_ready(name: str):
        _check_model(st, name, need_ready=False)
        return json({"name": served.name, "ready": st.serving}, 200 if st.serving else 503)

    @app.post(model_path + "/infer", summary="Run the model on one request (batched with others).",
              responses={400: err, 401: err, 404: err, 413: err, 503: err, 504: err},
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": P.infer_request_schema(spec_in)}}},
                  "parameters": [{"name": "X-Request-Timeout-Ms", "in": "header", "required": False,
                                  "schema": {"type": "number"}}]})
    async def infer(name: str, request: Request):
        _check_model(st, name)
        deadline = _deadline(request, cfg)
        x, req_id = P.parse_infer(P.loads(await request.body()), spec_in, spec_out,
                                  cfg.batch.max_batch_size)
        y = await _submit(st, request, x, deadline)
        return Response(P.infer_response(served.name, req_id, spec_out, y), media_type="application/json")

    @app.get("/metrics", summary="Prometheus metrics.")
    async def metrics():
        body, ctype = st.metrics.exposition()
        return Response(body, media_type=ctype.split(";")[0], headers={"content-type": ctype})

    if served.last_position_only:                 # a token model: the text generation routes too
        _add_generate_routes(app, st, err)
    return app


def _add_generate_routes(app, st: State, err: dict) -> None:
    """Triton-style generate extension for byte-level gpt: every token step is one row through
    the same batcher, so concurrent generations of equal length share forward passes."""
    import torch
    from fastapi import Request
    from fastapi.responses import Response, StreamingResponse

    served, cfg = st.served, st.cfg
    seq_len = served.input.max_dim
    body_spec = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": P.GENERATE_REQUEST_SCHEMA}}}}
    responses = {400: err, 401: err, 404: err, 413: err, 503: err, 504: err}

    async def start(name: str, request: Request):
        _check_model(st, name)
        deadline = _deadline(request, cfg)
        params = P.parse_generate(P.loads(await request.body()), cfg.max_new_tokens)
        ids = list(params.prompt.encode("utf-8")) or [ord("\n")]
        gen = torch.Generator().manual_seed(params.seed)
        return params, ids, gen, deadline

    async def step(request, ids: list[int], params, gen, deadline: float) -> int:
        x = torch.tensor([ids[-seq_len:]], dtype=torch.int64)        # (1, T <= seq_len)
        logits = await _submit(st, request, x, deadline)              # (1, V)
        return sample_next(logits, params.temperature, params.top_k, gen)

    def step_deadline() -> float:
        return time.monotonic() + cfg.batch.default_timeout_ms / 1000

    @app.post("/v2/models/{name}/generate", summary="Generate text (gpt); whole answer at once.",
              responses=responses, openapi_extra=body_spec)
    async def generate(name: str, request: Request):
        params, ids, gen, deadline = await start(name, request)
        out = []
        for i in range(params.max_tokens):
            nxt = await step(request, ids, params, gen, deadline if i == 0 else step_deadline())
            ids.append(nxt)
            out.append(nxt)
        return Response(P.dumps({"model_name": served.name, "text_output":
                                 bytes(out).decode("utf-8", errors="replace")}), media_type="application/json")

    @app.post("/v2/models/{name}/generate_stream", summary="Generate text (gpt), streamed as server-sent "
              "events: one 'data: {\"text_output\": ...}' event per token.", responses=responses,
              openapi_extra=body_spec)
    async def generate_stream(name: str, request: Request):
        params, ids, gen, deadline = await start(name, request)
        first = await step(request, ids, params, gen, deadline)      # errors here are HTTP errors
        ids.append(first)

        async def events():
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            nxt = first
            for i in range(params.max_tokens):
                if i:
                    try:
                        nxt = await step(request, ids, params, gen, step_deadline())
                    except HTTPError as exc:
                        yield b"event: error\ndata: " + _error_body(exc.message) + b"\n\n"
                        return
                    ids.append(nxt)
                event = {"model_name": served.name, "text_output": decoder.decode(bytes([nxt])), "index": i}
                if i == params.max_tokens - 1:
                    event["text_output"] += decoder.decode(b"", final=True)
                    event["finish_reason"] = "length"
                yield b"data: " + P.dumps(event) + b"\n\n"
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})
