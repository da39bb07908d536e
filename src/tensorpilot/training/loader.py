"""Data loading: a resumable sequential batch sampler, DataLoader workers, and a prefetcher that
copies the next batch to the device while the current step runs (a side CUDA stream and
non-blocking copies from pinned memory on GPU; the same code is a pass-through on CPU)."""

from __future__ import annotations

from typing import Any, Iterator

import torch


class ResumableBatches(torch.utils.data.Sampler):
    """Batch k holds sample indices [start + k*B, start + (k+1)*B): infinite, and the whole data
    position of a run is the single integer ``start`` (samples consumed so far).

    Data parallel: with ``world`` ranks the global batch k is [start + k*B*W, start + (k+1)*B*W)
    and rank r reads its r-th slice of B. ``start`` counts global samples, so a run resumes at
    the same data position with any number of ranks."""

    def __init__(self, batch_size: int, start: int = 0, rank: int = 0, world: int = 1):
        self.batch_size, self.start, self.rank, self.world = batch_size, start, rank, world

    def __iter__(self) -> Iterator[list[int]]:
        s = self.start + self.rank * self.batch_size
        while True:
            yield list(range(s, s + self.batch_size))
            s += self.batch_size * self.world


def _as_batch(items):
    # datasets with __getitems__ return a ready (inputs, targets) batch; others a list of samples
    if isinstance(items, list):
        return torch.utils.data.default_collate(items)
    return items


def make_loader(dataset, batch_size: int, start: int, num_workers: int, pin_memory: bool, seed: int,
                rank: int = 0, world: int = 1):
    """A loader of endless micro-batches from sample ``start`` on. Finite datasets are cycled
    in a seeded permutation per epoch; a user's own DataLoader is used as given."""
    if isinstance(dataset, torch.utils.data.DataLoader):
        return dataset
    if len(dataset) < 2**40:
        from tensorpilot.workloads.data import ShuffledEpochs

        dataset = ShuffledEpochs(dataset, seed)
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=ResumableBatches(batch_size, start, rank, world), num_workers=num_workers,
        pin_memory=pin_memory, collate_fn=_as_batch, persistent_workers=num_workers > 0,
        prefetch_factor=4 if num_workers > 0 else None)


def to_device(obj: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device, non_blocking) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device, non_blocking) for k, v in obj.items()}
    return obj


def _record_stream(obj: Any, stream) -> None:
    if isinstance(obj, torch.Tensor):
        obj.record_stream(stream)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _record_stream(o, stream)
    elif isinstance(obj, dict):
        for o in obj.values():
            _record_stream(o, stream)


class DevicePrefetcher:
    """Iterates (inputs, targets) already on ``device``; the next batch is in flight meanwhile."""

    def __init__(self, loader, device: torch.device):
        self.it, self.device = iter(loader), device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._next = self._fetch()

    def _fetch(self):
        batch = next(self.it)
        if self.stream is None:
            return to_device(batch, self.device, non_blocking=False)
        with torch.cuda.stream(self.stream):
            return to_device(batch, self.device, non_blocking=True)

    def __iter__(self):
        return self

    def __next__(self):
        batch = self._next
        if self.stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)
            _record_stream(batch, current)   # the copy stream's memory now belongs to compute
        self._next = self._fetch()
        return batch
