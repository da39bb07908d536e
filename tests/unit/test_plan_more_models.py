"""Models the traced planner first met in the "plan any model" sweep: RNNs (oneDNN's fused LSTM),
frozen parameters, Mixture-of-Experts grouped matmuls, an error raised in backward, and Hugging
Face configs beyond text decoders (GPT-Neo, T5, Whisper, ViT, wav2vec2, Mixtral). Tiny shapes,
fake tensors, no weights, no network."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tensorpilot.errors import ConfigError
from tensorpilot.modelplan import planner, sources
from tensorpilot.observe.trace import TraceError, flop_formulas, trace_step


def _trace(model_fn, batch, loss=lambda o, y: o.float().sum(), opt=lambda ps: torch.optim.SGD(ps, lr=0.1), **kw):
    with torch.device("meta"):
        model = model_fn()
    return trace_step(model, lambda: (batch(), None), loss, opt, **kw)


# ----------------------------------------------------------------------------------- RNNs
class LSTMNet(nn.Module):
    def __init__(self, bidirectional=False):
        super().__init__()
        self.inp = nn.Linear(8, 16)                 # so the LSTM's input needs a gradient
        self.rnn = nn.LSTM(16, 32, num_layers=2, batch_first=True, bidirectional=bidirectional)

    def forward(self, x):
        return self.rnn(self.inp(x))[0]


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_flops_match_the_hand_count(bidirectional):
    b, t = 2, 10
    trace = _trace(lambda: LSTMNet(bidirectional), lambda: torch.randn(b, t, 8))
    dirs = 2 if bidirectional else 1
    # per direction and time step, 4 gates x hidden 32: W_ih (128 x input) and W_hh (128 x 32);
    # layer 1 reads the 16 inputs, layer 2 the 32 x dirs outputs of layer 1
    weights = dirs * (128 * 16 + 128 * 32) + dirs * (128 * 32 * dirs + 128 * 32)
    lstm = 2 * b * t * weights * 3                   # forward, then input/hidden and weight gradients
    linear = 2 * b * t * 8 * 16 * 2                  # forward and weight gradient (x needs none)
    assert trace.flops == lstm + linear
    ops = {o.op for o in trace.ops if o.flops}
    assert {"aten.mkldnn_rnn_layer", "aten.mkldnn_rnn_layer_backward"} <= ops, ops
    # the backward reads the forward's oneDNN workspace, which a fake forward leaves empty: a replay
    # of it on random operands wrote past its end and aborted the process (`plan --gpu local`)
    assert all(o.replay is None for o in trace.ops if o.op == "aten.mkldnn_rnn_layer_backward")
    if not bidirectional:                             # what `--gpu local` replays runs, and times
        from tensorpilot.modelplan.costs import replay_time_s

        rnn = [o for o in trace.ops if o.op.startswith("aten.mkldnn_rnn") and o.replay is not None]
        assert [o.phase for o in rnn] == ["forward", "forward"]
        assert all(replay_time_s(o.replay, "cpu", repeats=1, flush=1 << 16) > 0 for o in rnn)


def test_cudnn_rnn_flops_count_every_layer_and_direction():
    formula = flop_formulas()[torch.ops.aten._cudnn_rnn]
    x = torch.empty(10, 2, 16)                        # (T, B, I)
    weights = [torch.empty(128, 16), torch.empty(128, 32), torch.empty(128), torch.empty(128),
               torch.empty(128, 32), torch.empty(128, 32), torch.empty(128), torch.empty(128)]
    assert formula(x, weights, 4) == 2 * 20 * (128 * 16 + 128 * 32 + 128 * 32 + 128 * 32)


# --------------------------------------------------------------------------- frozen weights
class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))
        self.backbone.requires_grad_(False)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.backbone(x))


def test_a_frozen_backbone_traces_and_only_the_head_trains():
    """MemTracker hooks every parameter for its gradient; a frozen one refused the hook and no
    fine-tuning model (nor Whisper, whose position embedding is fixed) could be planned."""
    trace = _trace(Frozen, lambda: torch.randn(8, 16), opt=lambda ps: torch.optim.AdamW(ps, fused=True))
    head = 32 * 4 + 4
    assert trace.params == 16 * 32 + 32 + 32 * 32 + 32 + head and trace.trainable_params == head
    assert trace.memory["optimizer"] == 8 * head + 2 * 4        # m and v of the head, a step per tensor
    # forward everywhere; backward: the head's weight gradient only (nothing below it trains)
    fwd = 2 * 8 * (16 * 32 + 32 * 32 + 32 * 4)
    assert trace.flops == fwd + 2 * 8 * 32 * 4


# ---------------------------------------------------------------------- Mixture of Experts
class Experts(nn.Module):
    """Tokens already sorted by expert, one fp32 weight per expert, as transformers' MoE
    layers call torch's grouped matmul."""

    def __init__(self, e=4, d=16, f=32):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.w = nn.Parameter(torch.empty(e, d, f))

    def forward(self, x):                                   # (T, d) -> (T, f)
        offs = torch.tensor([3, 6, 9, 12], dtype=torch.int32)
        # in the weights' dtype, as transformers does: the kernel is not autocast
        return F.grouped_mm(self.inp(x).to(self.w.dtype), self.w, offs=offs)


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_grouped_matmul_of_fp32_experts_traces_with_flops(autocast):
    """torch's meta kernel of _grouped_mm takes bf16 only; the CPU kernel multiplies fp32 too."""
    t, d, f = 12, 16, 32
    # a loss whose gradient is a real tensor: sum()'s is an expanded one, which the kernel refuses
    trace = _trace(Experts, lambda: torch.randn(t, d), loss=lambda o, y: o.float().square().sum(),
                   autocast_dtype=autocast)
    grouped = [o for o in trace.ops if o.op == "aten._grouped_mm"]
    # forward, the input's gradient and the experts' weight gradient: each row meets one expert's d x f
    assert [o.phase for o in grouped] == ["forward", "backward", "backward"]
    assert sum(o.flops for o in grouped) == 3 * 2 * t * d * f
    assert all(o.dtype == "float32" and o.replay is None for o in grouped)
    assert trace.output_shape == (t, f)


# ------------------------------------------------------------------- errors, named where
class Masked(nn.Module):
    """SpecAugment-style (wav2vec2): in its own forward, rows a mask picks become a learned vector;
    below it, a weight-normed layer, whose parametrization backward enters and never leaves."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.fill = nn.Parameter(torch.zeros(8))
        self.enc = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(8, 8)), nn.ReLU())

    def forward(self, x):
        h = self.inp(x)
        mask = torch.from_numpy(np.arange(h.shape[0] * h.shape[1]).reshape(h.shape[:2]) % 3 == 0)
        h[mask] = self.fill
        return self.enc(h)


def test_an_op_failing_in_backward_names_the_module_whose_forward_made_it():
    model = lambda: nn.Sequential(Masked(), nn.Linear(8, 4))    # noqa: E731
    with pytest.raises(TraceError) as err:
        _trace(model, lambda: torch.randn(2, 5, 8))
    assert "nonzero" in str(err.value)
    assert err.value.module == "0", err.value.module             # not "0.enc.0.parametrizations.weight"


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        warnings.warn("a deprecation the model's own code raises")
        return self.l(x["x"] if isinstance(x, dict) else x)


def test_warnings_of_a_step_that_failed_are_dropped_and_of_one_that_traced_kept():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(TraceError):
            _trace(Noisy, lambda: torch.randn(2, 3))              # 3 features where 4 are expected
        assert not seen, [str(w.message) for w in seen]
        _trace(Noisy, lambda: torch.randn(2, 4))
        assert any("deprecation" in str(w.message) for w in seen)


def test_import_failure_names_the_broken_dependency():
    code = compile("raise RuntimeError('operator torchvision::nms does not exist')",
                   "/venv/lib/python3.11/site-packages/torchvision/_meta_registrations.py", "exec")
    try:
        try:
            exec(code)
        except RuntimeError as inner:
            raise ModuleNotFoundError("Could not import module 'X'") from inner
    except ModuleNotFoundError as exc:
        said = sources._import_failure("transformers", exc)
    assert "inside torchvision" in said and "torchvision::nms" in said and torch.__version__ in said
    assert sources._import_failure("timm", ModuleNotFoundError("No module named 'timm'", name="timm")) \
        == "which is not installed: pip install timm"


# ----------------------------------------------------------------- Hugging Face configs
@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """transformers, importable (a CUDA torchvision beside a CPU torch is declared first, as
    benchmarks/user_models.py does); a function writing a config.json and loading it."""
    root = Path(__file__).resolve().parents[2]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from benchmarks.user_models import _torchvision_importable

    _torchvision_importable()
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("hf")

    def load(name: str, **cfg):
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(cfg))
        try:
            return sources.load(f"hf:{path}")
        except ConfigError as exc:
            if "fails to import" in str(exc):
                pytest.skip(str(exc))
            raise
    return load


def _plan_trace(src, batch=2, **kw):
    return planner.trace_source(src, batch_size=batch, precision="fp32", optimizer="sgd", **kw)


def test_gpt_neo_without_sdpa_falls_back_to_its_own_attention(hf):
    src = hf("gpt_neo", model_type="gpt_neo", architectures=["GPTNeoForCausalLM"], vocab_size=64, hidden_size=16,
             num_layers=2, num_heads=2, attention_types=[[["global", "local"], 1]], window_size=8,
             max_position_embeddings=32, use_cache=False)
    assert src.model.config._attn_implementation == "eager" and src.sample_shape == (32,)
    trace = _plan_trace(src)
    assert trace.output_shape == (2, 32, 64) and trace.flops > 0


def test_t5_and_whisper_get_decoder_ids(hf):
    t5 = hf("t5", model_type="t5", architectures=["T5ForConditionalGeneration"], vocab_size=64, d_model=16, d_kv=8,
            d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2, n_positions=24, use_cache=False)
    assert t5.name.startswith("T5ForConditionalGeneration") and t5.sample_shape == (24,)
    assert _plan_trace(t5).output_shape == (2, 24, 64)          # the decoder reads the encoder's ids
    whisper = hf("whisper", model_type="whisper", architectures=["WhisperForConditionalGeneration"], vocab_size=64,
                 d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                 encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=8, max_source_positions=20,
                 max_target_positions=12, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                 use_cache=False)
    # log-mel features: its mel bins x twice the encoder's positions (two frames per position);
    # its fixed position embedding is a frozen parameter
    assert whisper.sample_shape == (8, 40) and whisper.sample_dtype == torch.float32
    trace = _plan_trace(whisper)
    assert trace.output_shape == (2, 12, 64) and trace.trainable_params < trace.params


def test_image_and_audio_configs_default_to_their_own_input(hf):
    vit = hf("vit", model_type="vit", architectures=["ViTForImageClassification"], hidden_size=16,
             num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=32, patch_size=8,
             num_channels=3, num_labels=5)
    assert vit.sample_shape == (3, 32, 32) and vit.tokens_per_sample is None
    assert _plan_trace(vit).output_shape == (2, 5)
    w2v = hf("wav2vec2", model_type="wav2vec2", architectures=["Wav2Vec2ForCTC"], vocab_size=12, hidden_size=16,
             num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, conv_dim=[8, 8], conv_kernel=[10, 3],
             conv_stride=[5, 2], num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, layerdrop=0.0,
             mask_time_prob=0.0)
    assert w2v.sample_shape == (16_000,) and w2v.sample_dtype == torch.float32
    assert _plan_trace(w2v, input_shape=(400,)).output_shape == (2, 39, 12)   # 400 -> 79 -> 39 frames


def test_mixtral_experts_trace_with_their_flops(hf):
    d, f, layers, top_k = 32, 64, 1, 2
    src = hf("mixtral", model_type="mixtral", architectures=["MixtralForCausalLM"], vocab_size=100, hidden_size=d,
             intermediate_size=f, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
             num_local_experts=4, num_experts_per_tok=top_k, max_position_embeddings=16, use_cache=False)
    trace = _plan_trace(src)
    tokens = 2 * 16
    grouped = sum(o.flops for o in trace.ops if o.op == "aten._grouped_mm")
    # each token's top-k experts: gate+up (d x 2f) and down (f x d); forward, input and weight gradients
    assert grouped == 3 * 2 * tokens * top_k * (d * 2 * f + f * d) * layers


def test_bad_configs_are_one_sentence(hf):
    with pytest.raises(ConfigError, match=r"not a multiple of the number of attention heads \(3\)\.$"):
        hf("uneven", model_type="llama", hidden_size=250, num_attention_heads=3)
    with pytest.raises(ConfigError, match="not a model_type transformers") as err:
        hf("unknown", model_type="no_such_model")
    assert "Should contain" not in str(err.value)
