"""Training-step FLOPs, counted on a meta copy, against hand computations.

Counting conventions of torch.utils.flop_counter: a matmul (B, M, K) @ (K, N) is 2*B*M*K*N
FLOPs; bias adds, norms, softmax, GeLU, embeddings and the loss are not counted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tensorpilot.observe.flops import gpt_train_flops_formula, meta_copy, train_step_flops
from tensorpilot.workloads.gpt import GPT, GPTConfig


def lm_loss(logits, targets):
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


def small_gpt(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=256, seq_len=32, n_layer=2, n_head=2, d_model=64, **kw))


def test_gpt_train_step_flops_match_formula_and_hand_count():
    B, T = 4, 32
    model = small_gpt()
    x = torch.randint(0, 256, (B, T))
    y = torch.randint(0, 256, (B, T))
    counted = train_step_flops(model, x, y, lm_loss)

    # B=4, T=32, C=64, L=2, V=256; BT = 128 rows.
    # forward per layer:
    #   qkv   2 * 128 * 64 * 192     = 3_145_728
    #   proj  2 * 128 * 64 * 64      = 1_048_576
    #   fc    2 * 128 * 64 * 256     = 4_194_304
    #   proj2 2 * 128 * 256 * 64     = 4_194_304
    #   QK^T  2 * (4*2) * 32 * 32 * 32 =   524_288   (B*H batches, T x T scores, head dim 32)
    #   AV    2 * (4*2) * 32 * 32 * 32 =   524_288
    #   sum                          = 13_631_488
    # 2 layers                        = 27_262_976
    # head  2 * 128 * 64 * 256       =  4_194_304
    # forward                        = 31_457_280
    # Every matmul's input requires grad (it descends from the embeddings), so backward is two
    # matmuls of the same size each (input grad + weight grad): step = 3 x forward = 94_371_840.
    assert counted == 94_371_840
    assert gpt_train_flops_formula(batch=B, seq_len=T, n_layer=2, d_model=64, vocab=256) == 94_371_840


def test_gpt_flops_do_not_depend_on_head_tying():
    # the untied head adds parameters, not matmuls
    x = torch.randint(0, 256, (4, 32))
    assert train_step_flops(small_gpt(tie_head=False), x, x, lm_loss) == 94_371_840


def test_linear_whose_input_needs_no_grad():
    B, I, O = 4, 16, 8
    lin = nn.Linear(I, O)
    x = torch.randn(B, I)                    # data: requires_grad=False
    y = torch.randint(0, O, (B,))
    # forward x @ W^T: 2*B*I*O; backward computes only the weight grad (grad_out^T @ x), another
    # 2*B*I*O; no input grad because x does not require one; the bias (add / sum) is not counted.
    # 4 * 4 * 16 * 8 = 2048 (not 6*B*I*O = 3072).
    assert train_step_flops(lin, x, y, F.cross_entropy) == 2048


def test_two_linears_second_one_pays_the_input_grad():
    B, I, H, O = 4, 16, 32, 8
    net = nn.Sequential(nn.Linear(I, H), nn.ReLU(), nn.Linear(H, O))
    x, y = torch.randn(B, I), torch.randint(0, O, (B,))
    # layer 1 (input is data): 4*B*I*H = 4*4*16*32 = 8192
    # layer 2 (input is an activation): 6*B*H*O = 6*4*32*8 = 6144
    assert train_step_flops(net, x, y, F.cross_entropy) == 8192 + 6144


def test_frozen_first_layer_cuts_backward_of_both_layers():
    B, I, H, O = 4, 16, 32, 8
    net = nn.Sequential(nn.Linear(I, H), nn.ReLU(), nn.Linear(H, O))
    for p in net[0].parameters():
        p.requires_grad_(False)
    x, y = torch.randn(B, I), torch.randint(0, O, (B,))
    # layer 1: forward only, 2*4*16*32 = 4096; its output then needs no grad either, so
    # layer 2 pays forward + weight grad only: 4*4*32*8 = 4096
    assert train_step_flops(net, x, y, F.cross_entropy) == 4096 + 4096


def test_frozen_last_layer_still_propagates_input_grad():
    B, I, H, O = 4, 16, 32, 8
    net = nn.Sequential(nn.Linear(I, H), nn.ReLU(), nn.Linear(H, O))
    for p in net[2].parameters():
        p.requires_grad_(False)
    x, y = torch.randn(B, I), torch.randint(0, O, (B,))
    # layer 1: forward + weight grad, 4*4*16*32 = 8192
    # layer 2: forward + input grad (no weight grad), 4*4*32*8 = 4096
    assert train_step_flops(net, x, y, F.cross_entropy) == 8192 + 4096


def test_inputs_as_tuple_are_unpacked():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 4, bias=False), nn.Linear(6, 4, bias=False)

        def forward(self, u, v):
            return self.a(u) + self.b(v)

    u, v, y = torch.randn(3, 8), torch.randn(3, 6), torch.randint(0, 4, (3,))
    # 4*B*I*O per layer (inputs need no grad): 4*3*8*4 + 4*3*6*4 = 384 + 288
    assert train_step_flops(Two(), (u, v), y, F.cross_entropy) == 384 + 288


def test_counting_leaves_the_real_model_untouched():
    model = small_gpt()
    before = {n: (p.data_ptr(), p.detach().clone()) for n, p in model.named_parameters()}
    buffers_before = {n: (b.data_ptr(), b.clone()) for n, b in model.named_buffers()}
    x = torch.randint(0, 256, (4, 32))
    train_step_flops(model, x, x, lm_loss)
    for n, p in model.named_parameters():
        ptr, value = before[n]
        assert p.device.type == "cpu" and p.data_ptr() == ptr and torch.equal(p, value), n
        assert p.grad is None, n
    for n, b in model.named_buffers():
        assert b.data_ptr() == buffers_before[n][0] and torch.equal(b, buffers_before[n][1])
    assert model.head.weight is model.tok_emb.weight


def test_meta_copy_is_all_meta_and_keeps_ties_and_frozen_flags():
    model = small_gpt()
    model.pos_emb.weight.requires_grad_(False)
    m = meta_copy(model)
    assert all(p.is_meta for p in m.parameters()) and all(b.is_meta for b in m.buffers())
    assert m.head.weight is m.tok_emb.weight                     # the tie survives the copy
    assert m.pos_emb.weight.requires_grad is False and m.tok_emb.weight.requires_grad is True
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert {n: p.shape for n, p in m.named_parameters()} == {n: p.shape for n, p in model.named_parameters()}
    # and shares no storage with the real model
    assert not {p.data_ptr() for p in model.parameters()} & {p.data_ptr() for p in m.parameters()}


class ReadsAValue(nn.Module):
    """Calls ``.item()`` in forward, as some Hugging Face models do (meta tensors cannot), and
    holds BatchNorm statistics and dropout that counting must leave untouched."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.drop, self.fc2 = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 4)

    def forward(self, x):
        if x.abs().max().item() > 1e9:                 # a data-dependent branch
            x = x / 2
        return self.fc2(self.drop(self.bn(self.fc1(x))))


def test_a_model_meta_tensors_cannot_run_is_counted_on_one_real_sample():
    torch.manual_seed(0)
    m = ReadsAValue()
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    buffers = [b.clone() for b in m.buffers()]
    rng = torch.get_rng_state()
    flops = train_step_flops(m, x, y, F.cross_entropy)
    # hand count: forward 2*B*(8*16 + 16*4) matmul FLOPs; backward: weight grads of both layers,
    # the input grad of fc2 only (x needs none) -> step = 2*B*(3*16*4 + 2*8*16)
    assert flops == 2 * 6 * (3 * 16 * 4 + 2 * 8 * 16)
    assert all(torch.equal(a, b) for a, b in zip(m.buffers(), buffers))     # BatchNorm stats kept
    assert torch.equal(torch.get_rng_state(), rng)                          # dropout drew nothing of the run's
    assert all(p.grad is None for p in m.parameters())
