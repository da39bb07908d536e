"""Benchmark workloads for dense and convolutional nets: an MLP and a small ResNet-style CNN."""

from __future__ import annotations

import math

import torch
from torch import nn

MLP_SIZES = {"tiny": [256, 256], "small": [1024, 1024, 1024], "medium": [4096, 4096, 4096, 4096]}
CNN_SIZES = {"tiny": [16, 32, 64], "small": [32, 64, 128], "medium": [64, 128, 256, 512]}


class MLPNet(nn.Module):
    def __init__(self, in_features: int, hidden: list[int], num_classes: int):
        super().__init__()
        widths = [in_features, *hidden]
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(a, b), nn.LayerNorm(b), nn.GELU()) for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)                                              # (B, F)
        for block in self.blocks:
            x = block(x)
        return self.head(x)                                           # (B, classes)


class ResidualStage(nn.Module):
    """conv3x3(stride 2) -> BN -> ReLU, then a residual conv3x3 -> BN -> ReLU pair."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))
        self.body = nn.Sequential(nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                                  nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.down(x)                                              # (B, C_out, H/2, W/2)
        return torch.relu(x + self.body(x))


class CNN(nn.Module):
    def __init__(self, in_channels: int, channels: list[int], num_classes: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, channels[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels[0]), nn.ReLU(inplace=True))
        self.blocks = nn.ModuleList(ResidualStage(a, b) for a, b in zip(channels, channels[1:]))
        self.head = nn.Linear(channels[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)                                              # (B, C0, H, W)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))                          # global average pool -> (B, classes)


def num_features(shape: list[int]) -> int:
    return math.prod(shape)
