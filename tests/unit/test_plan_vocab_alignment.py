"""An output layer whose vocabulary is not a multiple of 8 runs cuBLAS's unaligned kernels
(calibration.MISALIGNED_GEMM_SPEED): the planner charges its three GEMMs at that share of the
aligned rate, on the parts where it was measured, and a padding stack escapes it."""

import dataclasses

import pytest

from tensorpilot.hardware import catalog
from tensorpilot.layout import Layout
from tensorpilot.plan import calibration as cal
from tensorpilot.plan.models import get_model
from tensorpilot.plan.predict import TrainSetup, predict

TOKENS = 8 * 1024          # micro-batch 8 x seq 1024, one device


def _step(gpu: str, vocab: int, multiple: int = 1, precision: str = "bf16-amp") -> float:
    spec = dataclasses.replace(get_model("gpt2"), vocab=vocab)
    setup = TrainSetup(seq_len=1024, global_batch=8, precision=precision, kernels="eager", vocab_multiple=multiple)
    return predict(spec, catalog.get(gpu), Layout(micro_batch=8), setup).step_time_s


def _hand_gemm_s(m: int, k: int, n: int, rate: float, k_half: float) -> float:
    """A compute-bound GEMM by the documented rule: FLOPs at rate x k / (k + K_half), plus the
    fixed cost (docs/planner.md, "GEMM shape")."""
    return 2 * m * k * n / (rate * k / (k + k_half)) + cal.GEMM_OVERHEAD_S


def test_an_odd_vocabulary_costs_the_head_gemms_their_unaligned_rate_on_a_hopper_part():
    """GPT-2's 50,257 columns against the same vocabulary padded to 50,264 (a multiple of 8): the
    step differs by the forward (T x h @ h x V), input-gradient (T x V @ V x h) and weight-gradient
    (h x T @ T x V) GEMMs at 0.16 of the rate, computed by hand from the H100's datasheet."""
    acc = catalog.get("h100-sxm")
    peak, bw = acc.bf16_tflops * 1e12, acc.mem_bw_gb_per_s * 1e9
    rate = peak * cal.SUSTAINED_COMPUTE_FRACTION * cal.MAMF_FRACTION["h100-sxm"]   # a recipe stack (TrainSetup default)
    k_half = cal.GEMM_HALF_DEPTH_PER_BALANCE * peak / bw
    h = 768

    def head(v, r):
        return (_hand_gemm_s(TOKENS, h, v, r, k_half) + _hand_gemm_s(TOKENS, v, h, r, k_half)
                + _hand_gemm_s(h, TOKENS, v, r, k_half))

    # the padded run's loss also reads its 7 extra logit columns: ~6 fp32 passes, 24 bytes each
    extra_loss_s = TOKENS * 7 * 24 / cal.streaming_bytes_per_s(acc)
    expected = head(50257, rate * cal.MISALIGNED_GEMM_SPEED["h100-sxm"]) - head(50264, rate) - extra_loss_s
    assert cal.MISALIGNED_GEMM_SPEED["h100-sxm"] == 0.16
    assert _step("h100-sxm", 50257) - _step("h100-sxm", 50257, multiple=8) == pytest.approx(expected, rel=1e-6)
    # padded by the stack (--vocab-multiple 64: 50,304) or by the model, the same step but for the
    # optimizer's 47 x 768 fewer parameters to update
    assert _step("h100-sxm", 50257, multiple=64) == pytest.approx(_step("h100-sxm", 50304), rel=1e-4)


def test_alignment_costs_nothing_where_it_was_not_measured_or_the_gemm_is_not_16_bit():
    """A part outside the table (MI300X) and fp32 GEMMs (no tensor-core loads) plan an odd
    vocabulary as the padded one, apart from the 7 extra columns' own FLOPs."""
    for gpu, precision in (("mi300x", "bf16-amp"), ("h100-sxm", "fp32")):
        odd, padded = _step(gpu, 50257, precision=precision), _step(gpu, 50257, 8, precision=precision)
        assert odd <= padded < odd * 1.001
    # an Ampere part pays the PyTorch blog's A100 share, less than a Hopper part's 6x
    a100 = _step("a100-sxm4-80gb", 50257) / _step("a100-sxm4-80gb", 50257, 8)
    h100 = _step("h100-sxm", 50257) / _step("h100-sxm", 50257, 8)
    assert 1.05 < a100 < h100


def test_a_padding_stacks_published_row_is_planned_padded():
    """Megatron-LM, NeMo, GPT-NeoX, llm.c, nanoGPT, fairseq and XLA pad the vocabulary whatever
    the config says; Hugging Face's Trainer and a plain PyTorch loop do not."""
    from tensorpilot.plan.validate import _layout_setup, _spec

    row = dict(id="V-1", model="GPT-2 124M", hidden="768", layers="12", heads="12", vocab="50257", gpu="A100-SXM4-80GB",
               n_gpus="1", tp="1", pp="1", dp="1", seq_len="1024", global_batch="8", micro_batch="8",
               precision="bf16 amp", metric="tokens_per_s_per_gpu", value="1", unit="tokens/s/GPU")
    pads = ("NVIDIA/Megatron-LM examples/gpt3 README", "EleutherAI/gpt-neox configs/125M.yml",
            "karpathy/llm.c discussion #481", "a blog post on karpathy/nanoGPT from scratch")
    unpadded = ("huggingface/transformers examples/pytorch/language-modeling run_clm.py",
                "a plain PyTorch training loop on one A100")
    multiple = {s: _layout_setup(dict(row, source=s), _spec(dict(row, source=s)))[1].vocab_multiple
                for s in pads + unpadded}
    assert [multiple[s] for s in pads] == [128] * len(pads)
    assert [multiple[s] for s in unpadded] == [1] * len(unpadded)
