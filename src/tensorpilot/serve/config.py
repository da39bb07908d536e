"""Settings of the server, passed as small dataclasses: the batcher gets only its own."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True, slots=True)
class BatchConfig:
    max_batch_size: int = 32
    """Most rows (samples) run in one forward pass."""
    max_queue_delay_ms: float = 5.0
    """Longest the oldest queued request waits for company; the batcher waits only while more
    requests have already reached the server and are still being read."""
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
    max_new_tokens: int = 256
    """Upper bound on tokens one generate request may ask for (gpt)."""
    graceful_timeout_s: float = 30.0
    """On SIGTERM/SIGINT: stop accepting, finish in-flight requests for at most this long."""
    batch: BatchConfig = field(default_factory=BatchConfig)
