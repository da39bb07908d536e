"""Transformer shapes the planner knows: presets, Hugging Face ``config.json`` files, built-in gpt.

A :class:`ModelSpec` is only shapes and a few architectural switches (MLP kind, attention heads
vs key/value heads, tied embeddings, learned positions, biases, dropout); every count the planner
needs (parameters, FLOPs, activation bytes) is a pure function of it. Pure Python, no torch.

>>> spec = get_model("llama3-8b")
>>> round(spec.n_params / 1e9, 2)                       # Meta reports 8.03B
8.03
>>> get_model("gpt2").n_params                          # GPT-2 small, tied head: 124,439,808
124439808
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tensorpilot.errors import ConfigError, PathError
from tensorpilot.files import existing_path, os_reason
from tensorpilot.plan.limits import MAX_DIM, MAX_SEQ_LEN, check_count, shown

__all__ = ["ModelSpec", "PRESETS", "UnknownModelError", "closest_models", "get_model",
           "model_spec_from_gpt_config", "model_spec_from_hf_config", "preset_names"]


class UnknownModelError(ConfigError, LookupError):
    """A model name that is neither a preset nor a readable config file."""


# (low, high) of each shape field; limits.py gives the reasons for the bounds
_SHAPE_LIMITS = {"hidden": (1, MAX_DIM), "layers": (1, MAX_DIM), "heads": (1, MAX_DIM), "vocab": (1, MAX_DIM),
                 "ffn_hidden": (1, MAX_DIM), "kv_heads": (0, MAX_DIM), "max_seq_len": (1, MAX_SEQ_LEN),
                 "learned_positions": (0, MAX_SEQ_LEN), "extra_params": (0, MAX_DIM**2),
                 "attn_head_dim": (0, MAX_DIM), "attention_window": (0, MAX_SEQ_LEN),
                 "windowed_layers": (0, MAX_DIM)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder (or encoder) transformer, described by shapes. h = hidden, L = layers."""

    name: str
    hidden: int                     # h, model width
    layers: int                     # L, transformer blocks
    heads: int                      # a, query heads
    vocab: int                      # V, embedding rows (Megatron pads to a multiple of 128 x tp)
    ffn_hidden: int                 # f, MLP inner width (4h for GPT; 8h/3 rounded for Llama)
    kv_heads: int = 0               # key/value heads; 0 = heads (multi-head attention), < heads = GQA
    attn_head_dim: int = 0          # width of one head when it is not h/a (Gemma 7B: 16 heads x 256 = 4096
                                    # on a 3072-wide model); 0 = h/a
    mlp: str = "gelu"               # "gelu": up + down (2 matrices); "swiglu": gate + up + down (3)
    tied_embeddings: bool = False   # output head shares the embedding matrix
    learned_positions: int = 0      # rows of a learned position table (GPT-2, BERT); 0 = RoPE/ALiBi
    bias: bool = False              # linear and norm biases (GPT-2, BERT: yes; Llama, MPT: no)
    dropout: bool = False           # dropout layers active in training (stores 1-byte masks)
    causal: bool = True             # decoder (causal mask) vs encoder (BERT)
    lm_head: bool = True            # vocabulary logits + loss; False: a small task head (BERT fine-tuning)
    extra_params: int = 0           # parameters outside the blocks/embeddings/head (BERT pooler)
    max_seq_len: int = 2048         # default context of the preset
    attention_window: int = 0       # sliding-window attention: keys a query sees in windowed blocks; 0 = none
    windowed_layers: int = 0        # how many of the blocks attend within the window (Mistral: all; Gemma 2:
                                    # every other one; Gemma 3: 5 of 6); the others attend to the whole sequence
    source: str = ""                # where the shape comes from

    def __post_init__(self) -> None:
        for f, (low, high) in _SHAPE_LIMITS.items():
            check_count(f"model {self.name!r}: {f}", getattr(self, f), high, low)
        if self.hidden % self.heads and not self.attn_head_dim:
            raise ConfigError(f"model {self.name!r}: hidden {self.hidden} is not divisible by heads {self.heads}.")
        if self.kv_heads and self.heads % self.kv_heads:
            raise ConfigError(f"model {self.name!r}: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}.")
        if self.mlp not in ("gelu", "swiglu"):
            raise ConfigError(f"model {self.name!r}: mlp must be 'gelu' or 'swiglu', not {self.mlp!r}.")
        if self.windowed_layers > self.layers:
            raise ConfigError(f"model {self.name!r}: windowed_layers {self.windowed_layers} exceeds its "
                              f"{self.layers} layers.")
        if bool(self.attention_window) != bool(self.windowed_layers):
            raise ConfigError(f"model {self.name!r}: attention_window and windowed_layers go together "
                              "(a window, and the blocks that use it).")

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of Q and of the attention output: heads x head_dim; = h unless attn_head_dim says."""
        return self.heads * self.head_dim

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads x head_dim; = h without GQA."""
        return self.n_kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    # -- parameter counts (weights + biases + norm scales), from the shapes ------------------------

    @property
    def layer_params(self) -> int:
        """One block: attention (q, k, v, out), MLP, two norms."""
        h, f, q, kv = self.hidden, self.ffn_hidden, self.q_dim, self.kv_dim
        attn = h * (q + 2 * kv) + q * h                       # W_qkv (h, q + 2kv), W_o (q, h); q = h usually
        mlp = self.mlp_matrices * h * f
        norms = 2 * h * (2 if self.bias else 1)              # LayerNorm: scale + shift; RMSNorm: scale
        biases = (q + 2 * kv) + h + (self.mlp_matrices - 1) * f + h if self.bias else 0
        return attn + mlp + norms + biases

    @property
    def layer_tensors(self) -> int:
        """Parameter tensors one block holds (what an optimizer loop steps one by one): its
        matrices (Q, K, V separate, as in :meth:`matrices`), a bias beside each where the family has
        biases, and two norms' scales (+ shifts)."""
        per = 1 + self.bias
        return (4 + self.mlp_matrices) * per + 2 * per

    @property
    def embedding_params(self) -> int:
        """Token (+ learned position) embeddings; the first pipeline stage holds them."""
        return self.vocab * self.hidden + self.learned_positions * self.hidden

    @property
    def head_params(self) -> int:
        """Final norm + output projection (0 extra when tied); the last pipeline stage holds them."""
        final_norm = self.hidden * (2 if self.bias else 1)
        untied = self.lm_head and not self.tied_embeddings
        return final_norm + (self.vocab * self.hidden if untied else 0) + self.extra_params

    @property
    def n_params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.head_params

    def matrices(self, layers: int | None = None, *, embedding: bool = True, head: bool = True,
                 tp: int = 1) -> list[tuple[int, int, int]]:
        """The 2-D weights as (rows, cols, count): ``layers`` blocks (default all; Q, K, V and
        the MLP's gate/up as separate matrices, as Hugging Face and torchtitan models hold them),
        the embedding tables and the untied output head; ``tp`` splits each block matrix."""
        h, f, q, kv = self.hidden, self.ffn_hidden, self.q_dim, self.kv_dim
        n = self.layers if layers is None else layers
        out = [(h, q // tp, n), (h, kv // tp, 2 * n), (q // tp, h, n),
               (h, f // tp, (self.mlp_matrices - 1) * n), (f // tp, h, n)]
        if embedding:
            out += [(self.vocab, h, 1)] + ([(self.learned_positions, h, 1)] if self.learned_positions else [])
        if head and self.lm_head and not self.tied_embeddings:
            out.append((h, self.vocab, 1))
        return [m for m in out if m[2] and m[0] and m[1]]

    @property
    def n_matmul_params(self) -> int:
        """Weights that take part in a matmul per token: blocks + the output head (tied or not)."""
        h, f, q, kv = self.hidden, self.ffn_hidden, self.q_dim, self.kv_dim
        head = self.vocab * h if self.lm_head else 0
        return self.layers * (h * (q + 2 * kv) + q * h + self.mlp_matrices * h * f) + head


def _gpt(name, h, L, a, V, *, s=2048, tied=False, pos=0, bias=True, dropout=False, source=""):
    return ModelSpec(name=name, hidden=h, layers=L, heads=a, vocab=V, ffn_hidden=4 * h,
                     tied_embeddings=tied, learned_positions=pos, bias=bias, dropout=dropout,
                     max_seq_len=s, source=source)


def _llama(name, h, L, a, kv, f, V, s, source):
    return ModelSpec(name=name, hidden=h, layers=L, heads=a, kv_heads=kv, ffn_hidden=f, vocab=V,
                     mlp="swiglu", max_seq_len=s, source=source)


_GPT2 = "Radford et al. 2019 (GPT-2), Hugging Face gpt2* config.json"
_MEG = "Narayanan et al. SC21 Table 1 (Megatron-LM scaling table), 4h GeLU MLP, vocab 51200"
_L2 = "Touvron et al. 2023 (Llama 2), meta-llama config.json"
_L3 = "Llama 3 herd paper (Dubey et al. 2024) Table 3, meta-llama config.json"
_MPT = "mosaicml/llm-foundry yamls (MPT: ALiBi, no biases, tied embeddings, vocab 50368)"


def _mpt(name, h, L, a, s=2048):
    return ModelSpec(name=name, hidden=h, layers=L, heads=a, vocab=50368, ffn_hidden=4 * h,
                     tied_embeddings=True, max_seq_len=s, source=_MPT)


PRESETS: dict[str, ModelSpec] = {m.name: m for m in [
    _gpt("gpt2", 768, 12, 12, 50257, s=1024, tied=True, pos=1024, dropout=True, source=_GPT2),
    _gpt("gpt2-medium", 1024, 24, 16, 50257, s=1024, tied=True, pos=1024, dropout=True, source=_GPT2),
    _gpt("gpt2-large", 1280, 36, 20, 50257, s=1024, tied=True, pos=1024, dropout=True, source=_GPT2),
    _gpt("gpt2-xl", 1600, 48, 25, 50257, s=1024, tied=True, pos=1024, dropout=True, source=_GPT2),
    # Megatron-LM GPT shapes: learned positions, untied output in the paper's FLOP formula
    *(_gpt(f"megatron-{n}", h, L, a, 51200, pos=2048, dropout=True, source=_MEG) for n, h, L, a in [
        ("1.7b", 2304, 24, 24), ("3.6b", 3072, 30, 32), ("7.5b", 4096, 36, 32), ("18.4b", 6144, 40, 48),
        ("39.1b", 8192, 48, 64), ("76.1b", 10240, 60, 80), ("145.6b", 12288, 80, 96),
        ("310.1b", 16384, 96, 128), ("529.6b", 20480, 105, 128), ("1t", 25600, 128, 160)]),
    _gpt("gpt3-175b", 12288, 96, 96, 50257, pos=2048, dropout=True,
         source="Brown et al. 2020 Table 2.1 (GPT-3 175B)"),
    _llama("llama2-7b", 4096, 32, 32, 32, 11008, 32000, 4096, _L2),
    _llama("llama2-13b", 5120, 40, 40, 40, 13824, 32000, 4096, _L2),
    _llama("llama2-70b", 8192, 80, 64, 8, 28672, 32000, 4096, _L2),
    _llama("llama3-8b", 4096, 32, 32, 8, 14336, 128256, 8192, _L3),
    _llama("llama3-70b", 8192, 80, 64, 8, 28672, 128256, 8192, _L3),
    _llama("llama3.1-8b", 4096, 32, 32, 8, 14336, 128256, 131072, _L3),
    _llama("llama3.1-70b", 8192, 80, 64, 8, 28672, 128256, 131072, _L3),
    _llama("llama3.1-405b", 16384, 126, 128, 8, 53248, 128256, 131072, _L3),
    # BERT: encoder, learned positions (512) + 2 token types; the pooler (h x h + h) and a small
    # classification head as in fine-tuning (BertForSequenceClassification), no vocabulary logits
    *(ModelSpec(name=n, hidden=h, layers=L, heads=a, vocab=30522, ffn_hidden=4 * h, tied_embeddings=True,
                learned_positions=512 + 2, bias=True, dropout=True, causal=False, max_seq_len=512,
                lm_head=False, extra_params=h * h + h,
                source="Devlin et al. 2019; bert-*-uncased config.json") for n, h, L, a in [
        ("bert-base", 768, 12, 12), ("bert-large", 1024, 24, 16)]),
    _mpt("mpt-125m", 768, 12, 12), _mpt("mpt-350m", 1024, 24, 16), _mpt("mpt-760m", 1536, 24, 12),
    _mpt("mpt-1b", 2048, 24, 16), _mpt("mpt-3b", 2560, 32, 20), _mpt("mpt-7b", 4096, 32, 32),
    _mpt("mpt-13b", 5120, 40, 40), _mpt("mpt-30b", 7168, 48, 64, s=8192), _mpt("mpt-70b", 8192, 80, 64),
]}

_GPT_PREFIX = "tp-gpt-"


# The built-in ``gpt`` workload's byte-level sizes (tensorpilot.workloads.gpt builds them): "small"
# is the 6-layer, 384-wide reference of the benchmarks; "large" is GPT-2 small's body (Radford et
# al. 2019) with a byte vocabulary. Kept here, with the other named shapes, so the planner needs
# neither torch nor the workload code to plan them.
GPT_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(n_layer=4, n_head=4, d_model=128, seq_len=128),
    "small": dict(n_layer=6, n_head=6, d_model=384, seq_len=256),
    "medium": dict(n_layer=8, n_head=8, d_model=512, seq_len=512),
    "large": dict(n_layer=12, n_head=12, d_model=768, seq_len=1024),
}
GPT_DEFAULTS = dict(vocab_size=256, dropout=0.0, tie_head=True)     # as GPTConfig's defaults


def _builtin_gpt_specs() -> dict[str, ModelSpec]:
    """The built-in gpt's sizes as presets ('tp-gpt-small')."""
    from types import SimpleNamespace

    return {f"{_GPT_PREFIX}{size}": model_spec_from_gpt_config(SimpleNamespace(**GPT_DEFAULTS, **shape),
                                                                 name=f"{_GPT_PREFIX}{size}")
            for size, shape in GPT_SIZES.items()}


def model_spec_from_gpt_config(cfg, *, name: str = "gpt") -> ModelSpec:
    """The ModelSpec of a ``tensorpilot.workloads.gpt.GPTConfig`` (duck-typed: any object with
    vocab_size, seq_len, n_layer, n_head, d_model, dropout, tie_head)."""
    return ModelSpec(name=name, hidden=cfg.d_model, layers=cfg.n_layer, heads=cfg.n_head,
                     vocab=cfg.vocab_size, ffn_hidden=4 * cfg.d_model, tied_embeddings=bool(cfg.tie_head),
                     learned_positions=cfg.seq_len, bias=True, dropout=bool(cfg.dropout),
                     max_seq_len=cfg.seq_len, source="tensorpilot built-in gpt workload")


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def preset_names() -> list[str]:
    """Every preset name (the built-in gpt's sizes by prefix)."""
    return [*PRESETS, f"{_GPT_PREFIX}<size>"]


def closest_models(name: str, n: int = 3) -> list[str]:
    import difflib

    return difflib.get_close_matches(_norm(name), list(PRESETS), n=n, cutoff=0.5)


def get_model(name: str) -> ModelSpec:
    """A preset by name ('llama3-8b', 'GPT2-XL', 'tp-gpt-small'), or a config.json path."""
    key = _norm(name)
    if key in PRESETS:
        return PRESETS[key]
    if key.startswith(_GPT_PREFIX):
        builtin = _builtin_gpt_specs()
        if key in builtin:
            return builtin[key]
        raise UnknownModelError(f"unknown built-in gpt size {name!r}; known: {', '.join(builtin)}.")
    if name.strip().lower().endswith(".json"):       # a config file: its own sentences if unreadable
        return model_spec_from_hf_config(name)
    hint = closest_models(name)
    tail = f"did you mean {', '.join(hint)}?" if hint else "see `tensorpilot plan --list-models`."
    raise UnknownModelError(f"unknown model {name!r}; {tail}")


# ----------------------------------------------------------------------------- Hugging Face configs

# A config.json is a few KB; anything this large is the wrong file (a checkpoint, a dataset).
_MAX_CONFIG_BYTES = 10 * 2**20


def _read_json_object(p: Path) -> dict:
    """The JSON object in ``p``, or one sentence on why there is none."""
    existing_path(p, "config file", kind="file")
    where = f"config file {str(p)!r}"
    try:
        if not p.is_file():                # a FIFO or a device would block or never end
            raise PathError(f"{where} is not a regular file.")
        if p.stat().st_size > _MAX_CONFIG_BYTES:
            raise ConfigError(f"{where} is {p.stat().st_size / 2**20:,.0f} MiB; a config.json is a few KB.")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text.") from None
    except OSError as exc:
        raise PathError(f"{where} cannot be read: {os_reason(exc)}.") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}).") from None
    except ValueError:                 # Python reads integers of at most 4,300 digits
        raise ConfigError(f"{where} holds a number too long to read.") from None
    except RecursionError:
        raise ConfigError(f"{where} is nested too deeply to be a model config.") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where} holds a JSON {type(cfg).__name__}, not an object of model settings.")
    return cfg


class _Fields:
    """Typed reads of a config's fields; every error names the field and the file."""

    def __init__(self, cfg: dict, where: str):
        self.cfg, self.where = cfg, where

    def _find(self, keys):
        return next(((k, self.cfg[k]) for k in keys if self.cfg.get(k) is not None), (keys[0], None))

    def whole(self, *keys, default=None, minimum: int = 1, maximum: int = MAX_DIM):
        """The first of ``keys`` present, as an int in [minimum, maximum]; ``default`` if none is."""
        key, value = self._find(keys)
        if value is None:
            return default
        if isinstance(value, float) and value.is_integer():       # 4096.0: written by some exporters
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self.where}: {key} is {shown(value)}, not a whole number.")
        if not minimum <= value <= maximum:
            raise ConfigError(f"{self.where}: {key} must be between {minimum} and {maximum:,}, got {value:,}.")
        return value

    def number(self, key: str, default: float, *, minimum: float = 0.0, maximum: float = 1e6) -> float:
        value = self.cfg.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not minimum <= value <= maximum:
            raise ConfigError(f"{self.where}: {key} is {shown(value)}, not a number between {minimum:g} "
                              f"and {maximum:g}.")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(f"{self.where}: {key} is {shown(value)}, not true or false.")
        return value


def model_spec_from_hf_config(path: str | Path, *, name: str | None = None) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (Llama/Mistral/Qwen, GPT-2, BERT, MPT field names)
    without transformers. A missing, unreadable or malformed file, a field of the wrong type or
    out of range, or a mixture-of-experts model (not modelled) raises one sentence naming the file
    and the field."""
    p = Path(path)
    where = f"config file {str(p)!r}"
    cfg = _read_json_object(p)
    get = _Fields(cfg, where)
    kind = str(cfg.get("model_type", "")).lower()
    h = get.whole("hidden_size", "n_embd", "d_model")
    L = get.whole("num_hidden_layers", "n_layer", "n_layers")
    a = get.whole("num_attention_heads", "n_head", "n_heads")
    V = get.whole("vocab_size")
    missing = [k for k, v in (("hidden_size", h), ("num_hidden_layers", L), ("num_attention_heads", a),
                              ("vocab_size", V)) if v is None]
    if missing:
        nested = " (its 'text_config' holds a multimodal model's language part, which is not read)" \
            if isinstance(cfg.get("text_config"), dict) else ""
        raise ConfigError(f"{where} lacks {', '.join(missing)}{nested}; "
                          "only Llama, GPT-2, BERT and MPT-style configs are understood.")
    _refuse_experts(get, where)
    head_dim = get.whole("head_dim")                     # Gemma, Qwen3, Mistral Nemo: may differ from h/a
    if head_dim is None and h % a:
        raise ConfigError(f"{where}: num_attention_heads {a} does not divide hidden_size {h}.")
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "gelu").lower()
    act = str(cfg.get("hidden_activation") or act).lower() if kind.startswith("gemma") else act
    # Gemma's MLP is gated too (GeGLU: gelu_pytorch_tanh on a gate, times an up projection)
    gated = kind.startswith(("llama", "mistral", "qwen", "gemma", "mixtral")) or act in ("silu", "swiglu")
    f = get.whole("intermediate_size", "n_inner")
    if f is None:              # MPT: expansion_ratio x d_model; GPT-2 leaves n_inner null for 4h
        f = round(get.number("expansion_ratio", 4, minimum=1 / h, maximum=MAX_DIM) * h)
    kv = get.whole("num_key_value_heads", default=0, minimum=0)
    if kv == 0 and cfg.get("num_key_value_heads") is not None:
        raise ConfigError(f"{where}: num_key_value_heads is 0, and attention needs at least one key/value "
                          "head; leave the field out for one per attention head.")
    if kv and a % kv:
        raise ConfigError(f"{where}: num_key_value_heads {kv} does not divide num_attention_heads {a}.")
    learned = 0
    if kind == "gpt2" or "n_positions" in cfg:
        learned = get.whole("n_positions", default=0, minimum=0, maximum=MAX_SEQ_LEN)
    elif kind == "bert":
        learned = get.whole("max_position_embeddings", default=512, minimum=0, maximum=MAX_SEQ_LEN) \
            + get.whole("type_vocab_size", default=2, minimum=0)
    seq = get.whole("max_position_embeddings", "n_positions", "max_seq_len", "n_ctx", default=2048,
                    maximum=MAX_SEQ_LEN)
    drop = any(get.number(k, 0.0, maximum=1.0) > 0 for k in (
        "hidden_dropout_prob", "resid_pdrop", "attention_dropout", "attention_probs_dropout_prob", "attn_pdrop"))
    tied = get.flag("tie_word_embeddings", kind in ("gpt2", "bert", "mpt"))
    bias = kind in ("gpt2", "bert") or get.flag("attention_bias", False) or get.flag("no_bias", True) is False
    is_bert = kind == "bert"
    wide_heads = head_dim if head_dim is not None and head_dim * a != h else 0
    window, windowed = _sliding_window(get, kind, L)
    return ModelSpec(name=name or p.parent.name or p.stem, hidden=h, layers=L, heads=a, vocab=V, ffn_hidden=f,
                     kv_heads=kv, attn_head_dim=wide_heads, mlp="swiglu" if gated else "gelu", tied_embeddings=tied,
                     learned_positions=learned, bias=bias, dropout=drop, causal=not is_bert, lm_head=not is_bert,
                     extra_params=h * h + h if is_bert else 0, max_seq_len=seq, attention_window=window,
                     windowed_layers=windowed, source=f"Hugging Face config {p}")


def _sliding_window(get: _Fields, kind: str, layers: int) -> tuple[int, int]:
    """(window, windowed blocks) of a config's sliding-window attention, (0, 0) for none: an
    explicit ``layer_types`` list (newer transformers: "sliding_attention" / "full_attention");
    Gemma 3's ``sliding_window_pattern`` (every n-th block global); Gemma 2's alternation (even
    blocks windowed, modeling_gemma2); Qwen2's ``use_sliding_window`` from ``max_window_layers``
    on; otherwise every block (Mistral v0.1)."""
    window = get.whole("sliding_window", default=0, minimum=0, maximum=MAX_SEQ_LEN)
    if not window or get.flag("use_sliding_window", True) is False:
        return 0, 0
    types = get.cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers and all(isinstance(t, str) for t in types):
        windowed = sum(t == "sliding_attention" for t in types)
    elif get.cfg.get("sliding_window_pattern") is not None:
        every = get.whole("sliding_window_pattern", minimum=1, maximum=MAX_DIM)
        windowed = layers - layers // every
    elif kind == "gemma2":
        windowed = (layers + 1) // 2
    elif kind.startswith("qwen") and get.cfg.get("max_window_layers") is not None:
        windowed = layers - min(layers, get.whole("max_window_layers", minimum=0, maximum=MAX_DIM))
    else:
        windowed = layers
    return (window, windowed) if windowed else (0, 0)


# fields that give a mixture-of-experts model's expert count (Mixtral, gpt-oss, Llama 4; Qwen-MoE,
# OLMoE, Jamba; DeepSeek V2/V3; DBRX under "ffn_config")
_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _refuse_experts(get: _Fields, where: str) -> None:
    """One sentence for a mixture-of-experts config: the planner's formulas are for dense
    transformers, and planning one as dense would undercount its weights by about the number of
    experts (Mixtral 8x7B: 7B instead of 47B), so memory verdicts would be wrong. A count of 0 or
    1 is a dense model."""
    ffn = get.cfg.get("ffn_config")
    for fields in (get, _Fields(ffn, f"{where}: ffn_config") if isinstance(ffn, dict) else None):
        if fields is None:
            continue
        for key in _EXPERT_FIELDS:
            experts = fields.whole(key, default=0, minimum=0)
            if experts > 1:
                raise ConfigError(f"{fields.where}: {key} is {experts}: a mixture-of-experts model, which the "
                                  "planner does not model (its formulas are for dense transformers, and "
                                  "planning it as one would count one expert's weights, not all of them).")
