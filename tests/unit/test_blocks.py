"""Automatic discovery of the repeated blocks of models tensorpilot did not write: the units
activation checkpointing wraps and regional compilation compiles."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorpilot import modules


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v))


class Mlp(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = nn.LayerNorm(d), Attention(d), nn.LayerNorm(d), Mlp(d)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViTStyle(nn.Module):
    """timm's VisionTransformer layout: blocks in an nn.Sequential, not a ModuleList; a
    ModuleList of two small heads that must not be taken for the blocks."""

    def __init__(self, d=32, depth=3):
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.blocks = nn.Sequential(*[Block(d) for _ in range(depth)])
        self.heads = nn.ModuleList([nn.Linear(d, 2), nn.Linear(d, 3)])

    def forward(self, x):
        return self.heads[0](self.blocks(self.embed(x)))


class BasicBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class ResNetStyle(nn.Module):
    """timm/torchvision ResNet layout: layer1..layer2 are nn.Sequentials of BasicBlocks."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(c), BasicBlock(c))
        self.layer2 = nn.Sequential(BasicBlock(c), BasicBlock(c))
        self.fc = nn.Linear(c, 10)

    def forward(self, x):
        return self.fc(self.layer2(self.layer1(self.stem(x))).mean((2, 3)))


def test_vit_style_blocks_in_a_sequential_are_found_not_the_heads():
    m = ViTStyle()
    assert modules.repeated_blocks(m) == list(m.blocks)          # Block, not its Attention or Mlp


def test_resnet_style_blocks_inside_stages_are_found():
    m = ResNetStyle()
    assert modules.repeated_blocks(m) == [*m.layer1, *m.layer2]


def test_a_module_list_of_blocks_is_taken_as_is():
    class Listed(nn.Module):
        def __init__(self):
            super().__init__()
            self.h = nn.ModuleDict({"layers": nn.ModuleList([Block(16) for _ in range(2)])})

    m = Listed()
    assert modules.repeated_blocks(m) == list(m.h["layers"])


def test_nothing_repeats_in_a_plain_model():
    assert modules.repeated_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []


def test_found_blocks_checkpoint_and_keep_gradients():
    """Checkpointing the discovered blocks changes memory, not results (ViT-style model)."""
    torch.manual_seed(0)
    m = ViTStyle()
    x = torch.randn(2, 5, 8)
    m(x).sum().backward()
    ref = [p.grad.clone() for p in m.parameters() if p.grad is not None]
    m.zero_grad()
    done, skipped = modules.apply_activation_checkpointing(m)
    assert (done, skipped) == (3, 0)
    m(x).sum().backward()
    for a, b in zip([p.grad for p in m.parameters() if p.grad is not None], ref):
        torch.testing.assert_close(a, b)


def _library_model(name: str):
    """A model from transformers or timm, or a skip when the library is absent or broken here."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import user_models

        return user_models.build(name, 32)
    except Exception as exc:  # noqa: BLE001 - ImportError, or a library that fails to import
        pytest.skip(f"{name} unavailable: {type(exc).__name__}: {str(exc)[:80]}")


@pytest.mark.parametrize("name, cls, n", [("hf-gpt2", "GPT2Block", 4), ("hf-llama", "LlamaDecoderLayer", 4),
                                          ("timm-resnet", "BasicBlock", 8)])
def test_blocks_of_library_models(name, cls, n):
    m = _library_model(name)
    blocks = modules.repeated_blocks(m)
    assert [type(b).__name__ for b in blocks] == [cls] * n
