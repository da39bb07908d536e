"""Deliberately bottlenecked runs for `tensorpilot profile --model bottlenecks:FACTORY`: the
models of tests/integration/test_profile.py (the diagnosis asserted) and benchmarks/profile_apply.py
(the fix measured). Put this directory on the import path (or copy the file next to the run)."""

import time

import torch
from torch import nn

import tensorpilot


class SlowSamples(torch.utils.data.Dataset):
    """Each sample takes 2 ms to read (a stand-in for decoding from disk)."""
    def __init__(self, n=4096, dim=32):
        self.x, self.y = torch.randn(n, dim), torch.randint(0, 4, (n,))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        time.sleep(0.002)
        return self.x[i], self.y[i]


def slow_data():
    return tensorpilot.Workload(model=nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)),
                                train_data=SlowSamples())


def tiny_layers():
    """48 Linear(16, 16) + ReLU: at batch 1 each matmul is ~8 kFLOP, nothing next to its dispatch."""
    layers = [m for _ in range(48) for m in (nn.Linear(16, 16), nn.ReLU())]
    data = torch.utils.data.TensorDataset(torch.randn(4096, 16), torch.randint(0, 16, (4096,)))
    return tensorpilot.Workload(model=nn.Sequential(*layers), train_data=data)
