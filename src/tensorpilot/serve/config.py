"""Settings of the server, passed as small dataclasses: the batcher gets only its own."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True, slots=True)
class BatchConfig:
    max_batch_size: int = 32
    """Most rows (samples) run in one forward pass."""
    max_queue_delay_ms: float = 5.0
    """Longest the oldest queued request waits for company; the batcher waits only while more
    requests have arrived in full and are being parsed (a stalled upload never delays others)."""
    max_queue: int = 256
    """Requests waiting (not yet computing) before new ones get 503 + Retry-After."""
    default_timeout_ms: float = 30_000.0
    """Deadline of a request without an X-Request-Timeout-Ms header; expired while queued -> 504."""


@dataclass(kw_only=True, slots=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    """Bearer token every route except /v2/health/* requires (None: no authentication)."""
    max_request_bytes: int = 8 << 20
    """Bodies larger than this are refused with 413 before they are read in full."""
    body_timeout_s: float = 10.0
    """Longest a request body may take to arrive, counted from its headers; a slower or stalled
    upload gets 408 and its connection is closed (a stalled client must not hold a slot)."""
    max_new_tokens: int = 256
    """Upper bound on tokens one generate request may ask for (gpt)."""
    drain_window_s: float = 1.0
    """After the first SIGTERM/SIGINT: keep the listener open this long, answering new infer and
    generate requests with 503 + Retry-After while queued ones finish (load balancers need a
    moment to stop sending; see docs/serving.md#shutdown)."""
    graceful_timeout_s: float = 30.0
    """After the drain window: stop accepting, finish in-flight requests for at most this long."""
    batch: BatchConfig = field(default_factory=BatchConfig)
