"""The dynamic batcher on its own: a fake model, real asyncio, a real worker thread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from tensorpilot.serve.batcher import Batcher, DeadlineExceeded, NotAccepting, QueueFull
from tensorpilot.serve.config import BatchConfig


def model(x):                       # (B, 3) -> (B, 2): row-wise, so batching must not change it
    return torch.stack([x.sum(1), x.max(1).values * 2], dim=1)


class Recorder:
    def __init__(self, fn=model):
        self.fn, self.batches, self.gate = fn, [], threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, x):
        self.batches.append(x.clone())
        self.entered.set()
        self.gate.wait(30)
        return self.fn(x)


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_batched_results_equal_unbatched_and_respect_max_batch():
    rec = Recorder()
    xs = [torch.randn(1 + i % 3, 3, generator=torch.Generator().manual_seed(i)) for i in range(40)]

    async def main():
        b = Batcher(rec, BatchConfig(max_batch_size=8, max_queue_delay_ms=2))
        b.start()
        rec.gate.clear()                                   # hold the first batch so others queue
        first = asyncio.ensure_future(b.submit(xs[0], time.monotonic() + 30))
        while not rec.entered.is_set():
            await asyncio.sleep(0.001)
        rest = [asyncio.ensure_future(b.submit(x, time.monotonic() + 30)) for x in xs[1:]]
        await asyncio.sleep(0)
        rec.gate.set()
        outs = await asyncio.gather(first, *rest)
        await b.close()
        return outs

    outs = _run(main())
    for x, y in zip(xs, outs):
        torch.testing.assert_close(y, model(x))             # the model on this request alone
    assert all(batch.shape[0] <= 8 for batch in rec.batches)
    assert sum(batch.shape[0] for batch in rec.batches) == sum(x.shape[0] for x in xs)
    assert len(rec.batches) < len(xs)                       # batching happened


def test_requests_of_different_shapes_never_share_a_batch():
    rec = Recorder(lambda x: x.sum(1, keepdim=True))
    xs = [torch.ones(1, 2 + i % 2) * i for i in range(10)]

    async def main():
        b = Batcher(rec, BatchConfig(max_batch_size=16))
        b.start()
        rec.gate.clear()
        outs = [asyncio.ensure_future(b.submit(x, time.monotonic() + 30)) for x in xs]
        while not rec.entered.is_set():
            await asyncio.sleep(0.001)
        rec.gate.set()
        res = await asyncio.gather(*outs)
        await b.close()
        return res

    for x, y in zip(xs, _run(main())):
        torch.testing.assert_close(y, x.sum(1, keepdim=True))


def test_full_queue_refuses_and_expired_request_is_never_computed():
    rec = Recorder()

    async def main():
        b = Batcher(rec, BatchConfig(max_batch_size=1, max_queue=2))
        b.start()
        rec.gate.clear()
        running = asyncio.ensure_future(b.submit(torch.zeros(1, 3), time.monotonic() + 30))
        while not rec.entered.is_set():
            await asyncio.sleep(0.001)
        expiring = asyncio.ensure_future(b.submit(torch.full((1, 3), 5.0), time.monotonic() + 0.02))
        queued = asyncio.ensure_future(b.submit(torch.ones(1, 3), time.monotonic() + 30))
        await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await b.submit(torch.ones(1, 3), time.monotonic() + 30)
        with pytest.raises(DeadlineExceeded):
            await expiring                                  # expires while the gate holds compute
        rec.gate.set()
        await asyncio.gather(running, queued)
        await b.close()
        with pytest.raises(NotAccepting):
            await b.submit(torch.ones(1, 3), time.monotonic() + 30)

    _run(main())
    assert not any(bool((batch == 5.0).all()) for batch in rec.batches)
    assert len(rec.batches) == 2


def test_lone_request_does_not_wait_for_the_queue_delay():
    """Nothing else is arriving, so a 60 s delay must not be spent (the guard is 60 s, the wait 0)."""
    async def main():
        b = Batcher(model, BatchConfig(max_batch_size=8, max_queue_delay_ms=60_000))
        b.start()
        y = await asyncio.wait_for(b.submit(torch.ones(1, 3), time.monotonic() + 120), 30)
        await b.close()
        return y

    torch.testing.assert_close(_run(main()), model(torch.ones(1, 3)))


def test_waits_for_an_announced_arrival_and_batches_it():
    rec = Recorder()

    async def main():
        b = Batcher(rec, BatchConfig(max_batch_size=8, max_queue_delay_ms=60_000))
        b.start()
        b.announce()                       # a second request is being parsed
        first = asyncio.ensure_future(b.submit(torch.ones(1, 3), time.monotonic() + 120))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not rec.batches             # held back: a bigger batch is on its way
        b.withdraw()
        second = asyncio.ensure_future(b.submit(torch.zeros(1, 3), time.monotonic() + 120))
        await asyncio.gather(first, second)
        await b.close()

    _run(main())
    assert [batch.shape[0] for batch in rec.batches] == [2]


def test_warm_up_runs_every_small_batch_size_and_powers_of_two_above():
    from tensorpilot.serve.app import warmup_batch_sizes

    assert warmup_batch_sizes(1) == [1]
    assert warmup_batch_sizes(32) == list(range(1, 33))
    assert warmup_batch_sizes(100) == [*range(1, 65), 100]
    # 70 forward passes for the largest allowed size, not 4096 (and not 4096 * 4097 / 2 rows)
    assert warmup_batch_sizes(4096) == [*range(1, 65), 128, 256, 512, 1024, 2048, 4096]
