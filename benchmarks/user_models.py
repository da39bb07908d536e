"""Models and data that tensorpilot did not write, for the benchmarks that measure it on a
user's model (peers.py, train_overhead.py). Built without downloads.

  nanogpt       a nanoGPT-style GPT written here in the style of the public tutorials (Karpathy's
                nanoGPT / "Let's build GPT"), not tuned for tensorpilot: fused c_attn,
                F.scaled_dot_product_attention(is_causal=True), nn.GELU, learned positions,
                untied head, blocks in ``transformer.h``
  hf-gpt2       transformers' GPT2LMHeadModel from a GPT2Config (attn_implementation="sdpa")
  hf-llama      transformers' LlamaForCausalLM from a LlamaConfig (RMSNorm, RoPE, SwiGLU, GQA off)
  timm-resnet   timm's resnet18 (10 classes), on 3 x 64 x 64 images

Language models read byte windows of the Python standard library's source (a map-style dataset
of (input, target) pairs, the way a user writes one); the image model reads a synthetic,
learnable image set (class = the quadrant with the brightest mean), generated from a seed.

    pip install -e ".[bench]" timm transformers     # model libraries: benchmark extras only
"""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

LM_MODELS = ("nanogpt", "hf-gpt2", "hf-llama")
MODELS = LM_MODELS + ("timm-resnet",)


# ------------------------------------------------------------------------------- nanoGPT style
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)   # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, vocab_size=256, block_size=256, n_layer=6, n_head=6, n_embd=384):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# --------------------------------------------------------------------------- transformers models
class LogitsOnly(nn.Module):
    """A Hugging Face LM called with input ids (and ``call_kwargs``: a causal LM's use_cache=False),
    returning the logits tensor (the loss is computed by the training loop, the same for every arm)."""

    def __init__(self, hf_model: nn.Module, **call_kwargs):
        super().__init__()
        self.hf = hf_model
        self.call_kwargs = call_kwargs

    def forward(self, idx):
        return self.hf(input_ids=idx, **self.call_kwargs).logits


def hf_gpt2(seq_len: int, n_layer=4, n_embd=256, n_head=4) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=256, bos_token_id=0, eos_token_id=0, n_positions=seq_len, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return LogitsOnly(GPT2LMHeadModel(cfg), use_cache=False)


def hf_llama(seq_len: int, n_layer=4, hidden=256, heads=4) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64 + 64,
                      num_hidden_layers=n_layer, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=seq_len, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return LogitsOnly(LlamaForCausalLM(cfg), use_cache=False)


_TV_LIB = None


def _torchvision_importable() -> None:
    """torchvision's PyPI wheel links its C++ ops against CUDA libraries that a CPU-only torch
    build lacks; its __init__ then fails registering fake kernels for two ops it never loaded
    (nms, qnms). Declaring their schemas lets the pure-Python parts that timm uses (layers,
    FrozenBatchNorm2d) import; no torchvision op is called by the models here."""
    global _TV_LIB
    if _TV_LIB is not None:
        return
    import ctypes
    import importlib.util

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.submodule_search_locations is None:
        return
    try:
        ctypes.CDLL(str(Path(list(spec.submodule_search_locations)[0]) / "_C.so"))
        return                                            # its extension loads: nothing to do
    except OSError:
        pass
    try:                                                  # declared already: by another import of this
        torch.ops.torchvision.nms                         # file under another name (user_models vs
        return                                            # benchmarks.user_models), or by torchvision
    except (AttributeError, RuntimeError):
        pass
    _TV_LIB = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        _TV_LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def timm_resnet(num_classes: int = 10, arch: str = "resnet18") -> nn.Module:
    import timm

    return timm.create_model(arch, num_classes=num_classes, pretrained=False)


def build(name: str, seq_len: int = 256, size: str = "cpu") -> nn.Module:
    """``size`` "cpu": ~10M-parameter models a 2-core step takes a fraction of a second on;
    "gpu": GPT-2-small-shaped language models (12 layers, width 768, 12 heads; byte vocabulary,
    ~85M parameters) and timm's resnet50, sized to keep one datacenter GPU busy."""
    _torchvision_importable()          # transformers and timm both import torchvision if present
    gpu = size == "gpu"
    if name == "nanogpt":
        return NanoGPT(block_size=seq_len, n_layer=12, n_head=12, n_embd=768) if gpu else NanoGPT(block_size=seq_len)
    if name == "hf-gpt2":
        return hf_gpt2(seq_len, n_layer=12, n_embd=768, n_head=12) if gpu else hf_gpt2(seq_len)
    if name == "hf-llama":
        return hf_llama(seq_len, n_layer=12, hidden=768, heads=12) if gpu else hf_llama(seq_len)
    if name == "timm-resnet":
        return timm_resnet(arch="resnet50" if gpu else "resnet18")
    raise SystemExit(f"unknown model {name!r}: choose from {', '.join(MODELS)}")


# ------------------------------------------------------------------------------------ data
def stdlib_bytes(limit: int = 8 << 20) -> torch.Tensor:
    """Up to ``limit`` bytes of the standard library's .py files, sorted by path (uint8)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    buf, n = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        buf.append(data)
        n += len(data)
        if n >= limit:
            break
    return torch.frombuffer(bytearray(b"".join(buf)[:limit]), dtype=torch.uint8)


class ByteWindows(torch.utils.data.Dataset):
    """Sample i: the window of seq_len + 1 bytes at a fixed pseudo-random offset -> (x, y)."""

    def __init__(self, data: torch.Tensor, seq_len: int, n: int, seed: int):
        self.data, self.seq_len = data, seq_len
        g = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(0, data.numel() - seq_len - 1, (n,), generator=g)

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        s = int(self.starts[i])
        w = self.data[s:s + self.seq_len + 1].long()
        return w[:-1], w[1:]


class QuadrantImages(torch.utils.data.Dataset):
    """Synthetic 3 x S x S images: noise plus a brighter patch in one of 4 quadrants and one of
    the 3 channels with a per-sample stripe pattern; the class (0..9) is a function of quadrant,
    channel and stripe orientation, learnable by a CNN."""

    def __init__(self, n: int, size: int, seed: int):
        self.n, self.size, self.seed = n, size, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        s, h = self.size, self.size // 2
        img = torch.randn(3, s, s, generator=g) * 0.5
        label = int(torch.randint(0, 10, (1,), generator=g))
        quad, chan, vertical = label % 4, (label // 4) % 3, label >= 8
        r, c = (quad // 2) * h, (quad % 2) * h
        stripes = (torch.arange(h) % 4 < 2).float()
        patch = stripes[None, :].expand(h, h) if vertical else stripes[:, None].expand(h, h)
        img[chan, r:r + h, c:c + h] += 1.5 * patch
        return img, torch.tensor(label)


def datasets(name: str, *, seq_len: int, n_train: int, n_val: int, seed: int = 0, image_size: int = 64):
    """(train, val) map-style datasets for ``name``."""
    if name == "timm-resnet":
        return QuadrantImages(n_train, image_size, seed), QuadrantImages(n_val, image_size, seed + 1)
    data = stdlib_bytes()
    split = int(data.numel() * 0.9)
    return (ByteWindows(data[:split], seq_len, n_train, seed),
            ByteWindows(data[split:], seq_len, n_val, seed + 1))


def loss_fn(output, target):
    """Cross-entropy over every position (LMs: (B, T, V) logits, (B, T) targets)."""
    return F.cross_entropy(output.flatten(0, -2).float(), target.flatten())


def tokens_per_sample(name: str, seq_len: int) -> int | None:
    return None if name == "timm-resnet" else seq_len


# zero-argument factories of the GPU-sized models, for `tensorpilot plan --model` (token ids of
# 1024 positions: --input-shape 1024 --input-dtype int64)
def nanogpt_gpu() -> nn.Module:
    return build("nanogpt", 1024, size="gpu")


def hf_llama_gpu() -> nn.Module:
    return build("hf-llama", 1024, size="gpu")


# timm's ImageNet models at their own size (1000 classes, 3 x 224 x 224: --input-shape 3,224,224)
def _timm(arch: str) -> nn.Module:
    _torchvision_importable()
    import timm

    return timm.create_model(arch, pretrained=False)


def vit_base_gpu() -> nn.Module:
    return _timm("vit_base_patch16_224")


def resnet50_gpu() -> nn.Module:
    return _timm("resnet50")


def convnext_tiny_gpu() -> nn.Module:
    return _timm("convnext_tiny")


def hf_gpt2_gpu() -> nn.Module:
    return build("hf-gpt2", 1024, size="gpu")


# Models added for the third GPU lease's blind check (planned and committed before any GPU ran them)
def efficientnet_b0_gpu() -> nn.Module:
    return _timm("efficientnet_b0")


def mobilenetv3_gpu() -> nn.Module:
    return _timm("mobilenetv3_large_100")


def swin_tiny_gpu() -> nn.Module:
    return _timm("swin_tiny_patch4_window7_224")


def hf_bert_gpu() -> nn.Module:
    """BERT-base (12 x 768, 12 heads, WordPiece vocabulary 30,522) with its masked-LM head, SDPA
    attention; token ids of 512 positions."""
    _torchvision_importable()
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg._attn_implementation = "sdpa"
    return LogitsOnly(BertForMaskedLM(cfg))


def hf_pythia_gpu() -> nn.Module:
    """Pythia-160M's shape in transformers' GPT-NeoX (12 x 768, 12 heads, rotary on a quarter of
    each head, parallel attention and MLP, vocabulary 50,304), SDPA attention; 1024 positions."""
    _torchvision_importable()
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, rotary_pct=0.25, max_position_embeddings=2048,
                        use_parallel_residual=True, tie_word_embeddings=False, attention_dropout=0.0,
                        hidden_dropout=0.0)
    cfg._attn_implementation = "sdpa"
    return LogitsOnly(GPTNeoXForCausalLM(cfg), use_cache=False)
