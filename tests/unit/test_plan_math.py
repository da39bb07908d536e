"""Planner formulas against hand arithmetic and published numbers (independent references)."""

from __future__ import annotations

import re

import pytest

from tensorpilot.errors import ConfigError
from tensorpilot.plan import memory as mem
from tensorpilot.plan import timing as tm
from tensorpilot.plan.flops import hardware_flops, train_flops
from tensorpilot.plan.models import get_model


def test_weights_of_a_7b_model():
    # 7e9 x 4 bytes = 28 GB in fp32; x 2 bytes = 14 GB in bf16 (seed document arithmetic)
    assert mem.weights_bytes(7e9, "fp32") == 28e9
    assert mem.weights_bytes(7e9, "bf16") == 14e9


@pytest.mark.parametrize("stage,gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_model_states(stage, gb):
    # Rajbhandari et al. 2020, Fig. 1: 7.5B params, 64 GPUs, mixed-precision Adam (K = 12):
    # stage 0: 16 x 7.5 = 120 GB; 1: (2 + 2 + 12/64) x 7.5 = 31.4; 2: (2 + 14/64) x 7.5 = 16.6;
    # 3: 16/64 x 7.5 = 1.875 ~ 1.9
    states = mem.model_state_bytes(7.5e9, mem.precision("fp16"), zero_stage=stage, dp=64)
    assert sum(states.values()) / 1e9 == pytest.approx(gb, abs=0.05)


@pytest.mark.parametrize("p,m", [(1, 8), (4, 8), (8, 64), (35, 280)])
def test_pipeline_bubble(p, m):
    assert tm.bubble_fraction(p, m) == pytest.approx((p - 1) / (m + p - 1))
    # the pipeline takes (m + p - 1) slots of one micro-batch
    assert tm.pipeline_time_s(1.0, p, m) == pytest.approx(m + p - 1)


def test_interleaved_bubble_shrinks_by_chunks():
    # Narayanan et al. 2021: bubble (p - 1) / v slots with v model chunks per device
    assert tm.pipeline_time_s(1.0, 8, 64, "interleaved", 4) == pytest.approx(64 + 7 / 4)


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_ring_allreduce_bytes_factor(n):
    assert tm.ring_allreduce_bytes_factor(n) == pytest.approx(2 * (n - 1) / n)
    # time without latency: factor x bytes / bandwidth
    assert tm.allreduce_time_s(1e9, n, 1e11, 0.0) == pytest.approx(2 * (n - 1) / n * 1e-2)


def test_korthikanti_activation_formulas():
    # Korthikanti et al. 2022, Table 2, per layer: s b h (34 + 5 a s / h) without parallelism;
    # with tp t: s b h (10 + 24/t + 5 a s / (h t)); sp + selective: 34 s b h / t; full: 2 s b h
    spec = get_model("gpt3-175b")
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    kw = dict(seq_len=s, micro_batch=b, attention="materialized")
    assert mem.layer_activation_bytes(spec, **kw) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert mem.layer_activation_bytes(spec, tp=t, **kw) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert mem.layer_activation_bytes(spec, tp=t, sequence_parallel=True, recompute="selective", **kw) == \
        pytest.approx(34 * sbh / t)
    assert mem.layer_activation_bytes(spec, recompute="full", **kw) == pytest.approx(2 * sbh)


def test_megatron_flops_formula():
    # Narayanan et al. 2021: 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) with full recomputation,
    # 72 B s L h^2 (1 + s/(6h) + V/(12 L h)) without; GPT with 4h MLP
    spec = get_model("megatron-18.4b")
    B, s, L, h, V = 4, 2048, 40, 6144, 51200
    assert hardware_flops(spec, B, s, "full") == pytest.approx(96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h)))
    assert train_flops(spec, B, s) == pytest.approx(72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h)))


def test_llama_parameter_counts_match_published():
    # Meta: Llama 3 8B 8.03B, Llama 3.1 405B 405.9B (config.json shapes), Llama 2 70B 69.0B
    assert get_model("llama3-8b").n_params / 1e9 == pytest.approx(8.03, abs=0.01)
    assert get_model("llama3.1-405b").n_params / 1e9 == pytest.approx(405.9, abs=0.1)
    assert get_model("llama2-70b").n_params / 1e9 == pytest.approx(68.98, abs=0.01)
    # Hugging Face: bert-base-uncased 109,482,240; gpt2 124,439,808
    assert get_model("bert-base").n_params == 109_482_240
    assert get_model("gpt2").n_params == 124_439_808


def test_kv_cache_of_llama2_7b():
    # 2 (K, V) x 32 layers x 4096 x 2 bytes = 512 KiB per token; 4096 tokens -> 2 GiB
    assert mem.kv_cache_bytes(get_model("llama2-7b"), batch=1, context=4096) == 2 * 2**30


def test_unknown_model_suggests_closest():
    with pytest.raises(ConfigError, match="did you mean llama3-8b"):
        get_model("llama3-8")


def test_hf_config_llama(tmp_path):
    import json

    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 8192, "hidden_act": "silu", "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    from tensorpilot.plan.models import model_spec_from_hf_config

    spec = model_spec_from_hf_config(path)
    assert spec.mlp == "swiglu" and spec.kv_dim == 1024
    assert spec.n_params == get_model("llama3-8b").n_params


def test_hf_config_gpt2_matches_preset(tmp_path):
    import json

    cfg = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
           "n_positions": 1024, "activation_function": "gelu_new", "resid_pdrop": 0.1}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    from tensorpilot.plan.models import model_spec_from_hf_config

    assert model_spec_from_hf_config(path).n_params == 124_439_808


# ------------------------------------------------------------------ Hugging Face configs: bad input

LLAMA_FIELDS = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                "vocab_size": 32000}


def _hf(tmp_path, cfg, name="config.json"):
    import json

    path = tmp_path / name
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return path


@pytest.mark.parametrize("change,needle", [
    ({"hidden_size": "big"}, "hidden_size is 'big', not a whole number"),
    ({"hidden_size": 4096.5}, "hidden_size is 4096.5, not a whole number"),
    ({"hidden_size": True}, "hidden_size is True, not a whole number"),
    ({"hidden_size": 0}, "hidden_size must be between 1 and 16,777,216, got 0"),
    ({"num_hidden_layers": -3}, "num_hidden_layers must be between 1 and 16,777,216, got -3"),
    ({"vocab_size": 10**30}, "vocab_size must be between 1 and 16,777,216"),
    ({"num_attention_heads": 3}, "num_attention_heads 3 does not divide hidden_size 4096"),
    ({"num_key_value_heads": 5}, "num_key_value_heads 5 does not divide num_attention_heads 32"),
    ({"vocab_size": None}, "lacks vocab_size"),
    ({"resid_pdrop": "0.1"}, "resid_pdrop is '0.1', not a number between 0 and 1"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings is 'no', not true or false"),
    ({"max_position_embeddings": 10**12}, "max_position_embeddings must be between 1 and 1,000,000,000"),
    ({"num_key_value_heads": 0}, "num_key_value_heads is 0, and attention needs at least one key/value head"),
    ({"num_key_value_heads": -1}, "num_key_value_heads must be between 0 and 16,777,216, got -1"),
    ({"head_dim": "x"}, "head_dim is 'x', not a whole number"),
    ({"head_dim": 0}, "head_dim must be between 1 and 16,777,216, got 0"),
    ({"num_local_experts": "x"}, "num_local_experts is 'x', not a whole number"),
    ({"num_experts": -2}, "num_experts must be between 0 and 16,777,216, got -2"),
    # mixture of experts: refused, not planned as a dense model with a fraction of its weights
    ({"num_local_experts": 8}, "num_local_experts is 8: a mixture-of-experts model, which the planner "
                               "does not model"),
    ({"n_routed_experts": 64}, "n_routed_experts is 64: a mixture-of-experts model"),
    ({"ffn_config": {"moe_num_experts": 16}}, "ffn_config: moe_num_experts is 16: a mixture-of-experts"),
])
def test_hf_config_bad_field_names_the_field(tmp_path, change, needle):
    from tensorpilot.plan.models import model_spec_from_hf_config

    cfg = {k: v for k, v in {**LLAMA_FIELDS, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=re.escape(needle)):
        model_spec_from_hf_config(_hf(tmp_path, cfg))


def test_hf_config_one_expert_or_none_is_a_dense_model(tmp_path):
    from tensorpilot.plan.models import model_spec_from_hf_config

    dense = model_spec_from_hf_config(_hf(tmp_path, LLAMA_FIELDS)).n_params
    for experts in (0, 1, None):
        spec = model_spec_from_hf_config(_hf(tmp_path, {**LLAMA_FIELDS, "num_local_experts": experts}))
        assert spec.n_params == dense


def test_hf_config_head_dim_wider_than_hidden_over_heads(tmp_path):
    """Gemma 7B: 16 heads of 256 = 4096 on a 3072-wide model (google/gemma-7b config.json)."""
    from tensorpilot.plan import flops
    from tensorpilot.plan.models import model_spec_from_hf_config

    cfg = {"model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576, "num_attention_heads": 16,
           "num_key_value_heads": 16, "head_dim": 256, "num_hidden_layers": 28, "vocab_size": 256000,
           "hidden_act": "gelu", "max_position_embeddings": 8192, "tie_word_embeddings": True}
    spec = model_spec_from_hf_config(_hf(tmp_path, cfg))
    assert spec.head_dim == 256 and spec.q_dim == 4096 and spec.kv_dim == 4096
    # per layer: q, k, v 3 x 3072 x 4096 = 37,748,736; o 4096 x 3072 = 12,582,912; GeGLU MLP
    # 3 x 3072 x 24576 = 226,492,416; 2 RMSNorm scales 6,144 -> 276,830,208; x 28 = 7,751,245,824;
    # + tied embedding 256000 x 3072 = 786,432,000 + final norm 3,072 = 8,537,680,896 (Google: 8.54B)
    assert spec.n_params == 8_537_680_896
    # the FLOP formula's matmuls are the same weights: one token through every layer and the head
    per_layer = sum(g.k * g.n for g in flops.layer_gemms(spec, tokens=1))
    assert spec.layers * per_layer + spec.vocab * spec.hidden == spec.n_matmul_params
    assert flops.attention_core_flops(spec, 1, 8) == 2 * 2 * 8 * 8 * 4096
    # a head_dim equal to hidden / heads changes nothing
    same = model_spec_from_hf_config(_hf(tmp_path, {**LLAMA_FIELDS, "head_dim": 128}))
    dense = model_spec_from_hf_config(_hf(tmp_path, LLAMA_FIELDS))
    assert same.attn_head_dim == 0 and same.n_params == dense.n_params


def test_sliding_window_attention_pairs_by_hand():
    from dataclasses import replace

    from tensorpilot.plan import flops

    base = get_model("llama3-8b")                                     # 32 layers, q_dim 4096
    spec = replace(base, attention_window=1024, windowed_layers=16)
    s, w = 4096, 1024
    # causal: a full block computes s^2 / 2 pairs, a windowed one s w - w^2 / 2 (the first w
    # queries see fewer keys); half the blocks of each kind
    full, windowed = s * s / 2, s * w - w * w / 2                     # 8,388,608 and 3,670,016
    assert flops.attention_core_flops(spec, 1, s, "causal") == 2 * 2 * (full + windowed) / 2 * 4096
    assert flops.attention_core_flops(spec, 1, s, "full") == 2 * 2 * (s * s + s * w) / 2 * 4096
    # a window as long as the sequence changes nothing
    assert flops.attention_core_flops(spec, 2, w, "causal") == flops.attention_core_flops(base, 2, w, "causal")
    with pytest.raises(ConfigError, match="go together"):
        replace(base, attention_window=1024)
    with pytest.raises(ConfigError, match="exceeds"):
        replace(base, attention_window=1024, windowed_layers=33)


def test_a_sliding_window_shortens_long_context_steps_and_caches():
    from dataclasses import replace

    from tensorpilot.hardware import catalog
    from tensorpilot.plan.predict import Layout, TrainSetup, predict

    base = get_model("llama3-8b")
    spec = replace(base, attention_window=4096, windowed_layers=32)
    acc, lo, setup = catalog.get("h100-sxm"), Layout(dp=8, recompute="full"), TrainSetup(seq_len=32768, global_batch=8)
    assert predict(spec, acc, lo, setup).step_time_s < 0.7 * predict(base, acc, lo, setup).step_time_s
    # the KV cache of a windowed block holds the window's latest keys only
    assert mem.kv_cache_bytes(spec, batch=1, context=32768) == 2 * 32 * 1024 * 4096 * 1 * 2
    assert mem.kv_cache_bytes(base, batch=1, context=32768) == 8 * mem.kv_cache_bytes(spec, batch=1, context=32768)


def test_packed_documents_under_a_document_mask_cost_each_documents_pairs():
    """A 32k-token sequence packing 16 documents of 2,048 tokens under a document mask that the
    kernel skips: causal pairs 16 x 2,048^2 / 2 instead of 32,768^2 / 2 (a sixteenth); with a
    sliding window each document is windowed; materialised scores are computed in full."""
    from dataclasses import replace

    from tensorpilot.hardware import catalog
    from tensorpilot.plan.flops import attention_core_flops
    from tensorpilot.plan.predict import Layout, TrainSetup, predict

    spec = get_model("llama3-8b")                                  # q_dim 4096
    assert attention_core_flops(spec, 1, 32768, "causal", doc_len=2048) == 2 * 2 * 16 * 2048 * 2048 / 2 * 4096
    whole = attention_core_flops(spec, 1, 32768, "causal")
    assert attention_core_flops(spec, 1, 32768, "causal", doc_len=32768) == whole
    windowed = replace(spec, attention_window=512, windowed_layers=32)
    assert attention_core_flops(windowed, 1, 32768, "causal", doc_len=2048) == \
        2 * 2 * 16 * (2048 * 512 - 512 * 512 / 2) * 4096
    acc, lo = catalog.get("h100-sxm"), Layout(dp=8, sharding="fsdp", recompute="full")
    whole = TrainSetup(seq_len=32768, global_batch=8)
    docs = replace(whole, doc_len=2048)
    assert predict(spec, acc, lo, docs).step_time_s < 0.6 * predict(spec, acc, lo, whole).step_time_s
    eager = replace(whole, attention="materialized")
    assert predict(spec, acc, lo, replace(eager, doc_len=2048)).step_time_s == \
        pytest.approx(predict(spec, acc, lo, eager).step_time_s)


@pytest.mark.parametrize("extra,window,windowed", [
    ({"model_type": "mistral", "sliding_window": 4096}, 4096, 32),                    # Mistral 7B v0.1
    ({"model_type": "mistral", "sliding_window": None}, 0, 0),                        # v0.2 and later
    ({"model_type": "gemma2", "sliding_window": 4096}, 4096, 16),                     # even blocks windowed
    ({"model_type": "gemma3_text", "sliding_window": 1024, "sliding_window_pattern": 6}, 1024, 27),
    ({"model_type": "gemma3_text", "sliding_window": 512,
      "layer_types": ["sliding_attention"] * 24 + ["full_attention"] * 8}, 512, 24),
    ({"model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False}, 0, 0),
    ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 28}, 4096, 4),
])
def test_hf_config_sliding_windows(tmp_path, extra, window, windowed):
    from tensorpilot.plan.models import model_spec_from_hf_config

    spec = model_spec_from_hf_config(_hf(tmp_path, {**LLAMA_FIELDS, **extra}))
    # 32 layers: Gemma 3 keeps every 6th block global (5 of them), 27 windowed; Qwen2 windows
    # the blocks from max_window_layers on
    assert (spec.attention_window, spec.windowed_layers) == (window, windowed)


def test_hf_config_gemma2_mlp_is_gated(tmp_path):
    from tensorpilot.plan.models import model_spec_from_hf_config

    cfg = {**LLAMA_FIELDS, "model_type": "gemma2", "hidden_activation": "gelu_pytorch_tanh",
           "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 14336}
    assert model_spec_from_hf_config(_hf(tmp_path, cfg)).mlp == "swiglu"     # GeGLU: gate, up, down


def test_hf_config_integral_float_is_a_whole_number(tmp_path):
    # some exporters write 4096.0; it means 4096
    from tensorpilot.plan.models import model_spec_from_hf_config

    spec = model_spec_from_hf_config(_hf(tmp_path, {**LLAMA_FIELDS, "hidden_size": 4096.0}))
    assert spec.hidden == 4096 and isinstance(spec.hidden, int)


@pytest.mark.parametrize("content,needle", [
    ("not json", "is not JSON (Expecting value at line 1, column 1)"),
    ("", "is not JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"hidden_size": NaN, "num_hidden_layers": 2, "num_attention_heads": 1, "vocab_size": 8}',
     "hidden_size is nan, not a whole number"),
    ('{"hidden_size": 1e400, "num_hidden_layers": 2, "num_attention_heads": 1, "vocab_size": 8}',
     "hidden_size is inf, not a whole number"),
    ('{"hidden_size": ' + "9" * 5000 + "}", "holds a number too long to read"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"model_type": "llava", "text_config": {"hidden_size": 4096}}', "'text_config' holds a multimodal"),
])
def test_hf_config_bad_file_is_one_sentence(tmp_path, content, needle):
    from tensorpilot.plan.models import model_spec_from_hf_config

    with pytest.raises(ConfigError, match=re.escape(needle)):
        model_spec_from_hf_config(_hf(tmp_path, content))


def test_hf_config_paths(tmp_path):
    import os

    from tensorpilot.errors import PathError
    from tensorpilot.plan.models import model_spec_from_hf_config

    with pytest.raises(PathError, match="does not exist"):
        model_spec_from_hf_config(tmp_path / "missing.json")
    with pytest.raises(PathError, match="is a directory"):
        model_spec_from_hf_config(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)                      # reading it would block forever
    with pytest.raises(PathError, match="not a regular file"):
        model_spec_from_hf_config(fifo)
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        model_spec_from_hf_config(tmp_path / "bin.json")
    # a .json --model name is a path: a missing one says so instead of "unknown model"
    with pytest.raises(PathError, match="does not exist"):
        get_model(str(tmp_path / "nope.json"))


def test_model_spec_rejects_non_integer_shapes():
    from tensorpilot.plan.models import ModelSpec

    with pytest.raises(ConfigError, match="hidden must be a whole number"):
        ModelSpec(name="m", hidden="64", layers=2, heads=2, vocab=8, ffn_hidden=256)
    with pytest.raises(ConfigError, match="layers must be between 1 and 16,777,216"):
        ModelSpec(name="m", hidden=64, layers=2**30, heads=2, vocab=8, ffn_hidden=256)
