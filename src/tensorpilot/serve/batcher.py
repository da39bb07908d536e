"""Dynamic batching on the event loop, compute on one worker thread.

Policy (one batch computes at a time; requests only batch with requests of equal sample shape):

* When the worker is free it takes the largest batch already waiting (up to ``max_batch_size``
  rows, oldest first) at once: requests that queued while the previous batch computed form the
  next batch with no added delay.
* It waits only while a bigger batch cannot yet be formed -- requests whose body has arrived
  in full and that are being parsed (``announce``/``withdraw``; an upload still in progress, or
  stalled, is not announced, so it never delays anyone) -- and never past
  ``max_queue_delay`` counted from the oldest request's arrival. With nothing else in flight
  it does not wait: a lone request at concurrency 1 pays no batching delay, so batching on is
  never slower than off. (Triton's dynamic batcher waits the full delay whenever the preferred
  size is not reached; that adds the delay to every request at low load.)
* The queue is bounded (``max_queue``): a full queue refuses at once (503 + Retry-After)
  instead of growing latency without limit.
* Each request has a deadline; one that expires while queued is answered with a
  ``DeadlineExceeded`` (504) and never computed. Once its batch starts it runs to completion.

``run_batch`` receives the concatenated (sum of rows, *sample_shape) input and must return an
output with the same first dimension; rows are split back per request.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from tensorpilot.serve.config import BatchConfig


class QueueFull(Exception):
    """The bounded queue is full (HTTP 503)."""


class DeadlineExceeded(Exception):
    """The request's deadline passed before its batch started (HTTP 504)."""


class NotAccepting(Exception):
    """The server is warming up or shutting down (HTTP 503)."""


@dataclass(eq=False, slots=True)
class _Item:
    x: Any                        # (rows, *sample_shape) tensor
    key: tuple                    # (sample shape, dtype): batch only with equal keys
    rows: int
    enqueued: float               # time.monotonic()
    future: asyncio.Future
    timer: asyncio.TimerHandle | None = field(default=None)


class Batcher:
    def __init__(self, run_batch: Callable[[Any], Any], cfg: BatchConfig, metrics=None):
        self.run_batch = run_batch
        self.cfg = cfg
        self.metrics = metrics
        self._pending: deque[_Item] = deque()
        self._arriving = 0              # requests being parsed right now that will enqueue
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._accepting = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tensorpilot-batch")
        self.batches = 0                # batches run so far (tests, logs)

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="tensorpilot-batcher")
        self._accepting = True

    async def close(self) -> None:
        """Stop accepting, finish what is queued, then stop the worker thread."""
        self._accepting = False
        if self._task is not None:
            self._wake.set()
            await self._task
        self._executor.shutdown(wait=True)

    def run_sync(self, fn: Callable, *args):
        """Run ``fn`` on the compute thread (warm-up), off the event loop."""
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @property
    def depth(self) -> int:
        return len(self._pending)

    # ----------------------------------------------------------------- arrivals
    def announce(self) -> None:
        """A request for this batcher has arrived in full and is being parsed (it may enqueue
        within microseconds to milliseconds; never call this before the body is read)."""
        self._arriving += 1

    def withdraw(self) -> None:
        """An announced request enqueued or gave up; the batcher re-evaluates its wait."""
        self._arriving -= 1
        if self._wake is not None:
            self._wake.set()

    async def submit(self, x, deadline: float):
        """Queue ``x`` (rows, *sample_shape) and return its output rows. ``deadline`` is a
        time.monotonic() value. Raises QueueFull, DeadlineExceeded or NotAccepting."""
        if not self._accepting:
            raise NotAccepting("the server is shutting down")
        if x.shape[0] > self.cfg.max_batch_size:   # callers check first (a 400); never queue it
            raise ValueError(f"{x.shape[0]} rows exceed max_batch_size {self.cfg.max_batch_size}")
        if len(self._pending) >= self.cfg.max_queue:
            raise QueueFull(f"the queue is full ({self.cfg.max_queue} requests waiting)")
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        if deadline <= now:
            raise DeadlineExceeded("the request's deadline passed before it was queued")
        item = _Item(x=x, key=(tuple(x.shape[1:]), x.dtype), rows=int(x.shape[0]), enqueued=now,
                     future=loop.create_future())
        item.timer = loop.call_at(loop.time() + (deadline - now), self._expire, item)
        self._pending.append(item)
        self._gauge()
        self._wake.set()
        try:
            return await item.future
        except asyncio.CancelledError:         # client went away: do not compute it
            self._remove(item)
            raise

    # ----------------------------------------------------------------- internals
    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._pending))

    def _remove(self, item: _Item) -> bool:
        try:
            self._pending.remove(item)          # O(queue); the queue is bounded
        except ValueError:
            return False                        # already taken into a batch
        if item.timer is not None:
            item.timer.cancel()
        self._gauge()
        return True

    def _expire(self, item: _Item) -> None:
        if self._remove(item) and not item.future.done():
            item.future.set_exception(DeadlineExceeded("the request's deadline passed while it was queued"))

    def _take(self) -> list[_Item]:
        """Oldest request plus the next ones with its key, up to max_batch_size rows."""
        head = self._pending[0]
        batch, rows, keep = [], 0, deque()
        while self._pending:
            it = self._pending.popleft()
            if it.key == head.key and rows + it.rows <= self.cfg.max_batch_size:
                batch.append(it)
                rows += it.rows
            else:
                keep.append(it)
            if rows == self.cfg.max_batch_size:
                break
        keep.extend(self._pending)
        self._pending = keep
        self._gauge()
        return batch

    def _rows_ready(self) -> int:
        head = self._pending[0]
        return sum(it.rows for it in self._pending if it.key == head.key)

    async def _loop(self) -> None:
        delay_s = self.cfg.max_queue_delay_ms / 1000
        while True:
            if not self._pending:
                if not self._accepting and self._arriving <= 0:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            head = self._pending[0]
            remaining_s = head.enqueued + delay_s - time.monotonic()
            if (self._arriving > 0 and remaining_s > 0
                    and self._rows_ready() < self.cfg.max_batch_size):
                # a bigger batch is on its way (requests being parsed): wait for it, bounded
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), remaining_s)
                except (asyncio.TimeoutError, TimeoutError):
                    pass
                continue
            await self._run(self._take())

    async def _run(self, batch: list[_Item]) -> None:
        import torch

        now = time.monotonic()
        for it in batch:
            it.timer.cancel()
        batch = [it for it in batch if not it.future.done()]
        if not batch:
            return
        m = self.metrics
        if m is not None:
            for it in batch:
                m.queue_time.observe(now - it.enqueued)
            m.batch_size.observe(sum(it.rows for it in batch))
        x = batch[0].x if len(batch) == 1 else torch.cat([it.x for it in batch])
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            y = await loop.run_in_executor(self._executor, self.run_batch, x)
        except Exception as exc:                # a model bug: every request of the batch fails
            for it in batch:
                if not it.future.done():
                    it.future.set_exception(exc)
            return
        finally:
            if m is not None:
                m.compute_time.observe(time.perf_counter() - t0)
            self.batches += 1
        start = 0
        for it in batch:
            if not it.future.done():
                it.future.set_result(y[start:start + it.rows])
            start += it.rows
