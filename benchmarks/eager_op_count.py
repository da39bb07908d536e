"""How many ops an eager block dispatches, forward and backward: the counts behind the planner's
host-dispatch wait (calibration.EAGER_OPS_PER_BLOCK).

Each model family of Hugging Face transformers is built tiny (hidden 64, 16 tokens, so the host's
dispatch, not the arithmetic, is what runs) at 2 and 6 blocks; aten ops are counted with a
TorchDispatchMode through one forward + backward, and a block's share is the difference / 4; so are
the ops among them that launch no kernel on a GPU (views, transposes, detach: aliases of their
input), whose complement is the launching share behind calibration.LAUNCHING_OP_SHARE. Each is
counted in fp32 and under bf16 autocast, whose inserted casts are calibration.AUTOCAST_OPS_PER_BLOCK;
what the 2-block model dispatches beyond its blocks (embeddings, final norm, head, loss) is
calibration.EAGER_OPS_OUTSIDE_BLOCKS. The marginal time per op (the 6-block step minus the 2-block
one, over the extra ops) is printed too, for this CPU only: the planner's per-op cost is the
published 4.5 us, and on a GPU the driver's launch for the launching share (calibration.py says
where).

    pip install "transformers>=4.44"        # not a tensorpilot dependency
    python benchmarks/eager_op_count.py
"""

from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0
        self.aliases = 0       # ops returning a view of an input: no kernel on a GPU

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        self.aliases += func.is_view or func.overloadpacket in (torch.ops.aten.detach, torch.ops.aten.alias)
        return func(*args, **(kwargs or {}))


def _model(family: str, layers: int, attention: str):
    import transformers as tf

    tiny = dict(vocab_size=128, attn_implementation=attention)
    if family == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                                  num_attention_heads=4, num_key_value_heads=2, **tiny))
    if family == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=64, n_layer=layers, n_head=4, **tiny))
    if family == "opt":
        return tf.OPTForCausalLM(tf.OPTConfig(hidden_size=64, ffn_dim=256, num_hidden_layers=layers,
                                              num_attention_heads=4, word_embed_proj_dim=64, **tiny))
    return tf.BertForMaskedLM(tf.BertConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=layers,
                                            num_attention_heads=4, **tiny))


def _measure(family: str, layers: int, attention: str, autocast: bool = False,
             repeats: int = 20) -> tuple[int, int, int, float]:
    """(forward ops, backward ops, alias ops, seconds a step) of ``layers`` blocks, under bf16
    autocast (mixed precision: the casts it inserts are ops too) or in the weights' fp32."""
    m = _model(family, layers, attention)
    x = torch.randint(0, 128, (1, 16))

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return m(input_ids=x, labels=x).loss

    for _ in range(2):                                    # warm-up
        loss().backward()
    count = _Count()
    with count:
        out = loss()
        forward = count.n
        out.backward()
    t0 = time.perf_counter()
    for _ in range(repeats):
        loss().backward()
    return forward, count.n - forward, count.aliases, (time.perf_counter() - t0) / repeats


def main() -> None:
    import transformers

    torch.set_num_threads(1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print("| model | attention | precision | ops / block forward | ops / block backward | launching a kernel | "
          "ops outside the blocks | us per op (marginal, this CPU) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for attention in ("sdpa", "eager"):       # a fused kernel, or the scores materialised op by op
        for family in ("llama", "gpt2", "opt", "bert"):
            for autocast in (False, True):
                (f2, b2, a2, t2), (f6, b6, a6, t6) = (_measure(family, n, attention, autocast) for n in (2, 6))
                ops = (f6 + b6) - (f2 + b2)
                per_op = (t6 - t2) / ops * 1e6
                outside = (f2 + b2) - 2 * ops / 4            # embeddings, final norm, head and loss
                print(f"| {family} | {attention} | {'bf16 autocast' if autocast else 'fp32'} | {(f6 - f2) / 4:.0f} "
                      f"| {(b6 - b2) / 4:.0f} | {1 - (a6 - a2) / ops:.0%} | {outside:.0f} | {per_op:.1f} |")


if __name__ == "__main__":
    main()
