"""``tensorpilot plan``: argparse wiring and printing. The math lives in predict/search/validate."""

from __future__ import annotations

import argparse
import json
import math

from tensorpilot.errors import ConfigError, UsageError
from tensorpilot.files import finite

DEFAULT_GPU = "h100-sxm"


def register(sub) -> dict[str, argparse.ArgumentParser]:
    from tensorpilot.plan.calibration import STACKS, TYPICAL_STACK_EFFICIENCY   # constants only, no torch

    p = sub.add_parser(
        "plan", help="Predict memory, step time, cost and energy of a training run; search layouts.",
        description="Before anything runs: per-device memory (weights, grads, optimizer, activations, "
        "buffers), step time, tokens/s, MFU, time, cost and energy to train a transformer on a "
        "catalogued accelerator and parallel layout. `tensorpilot plan validate FILE.csv` compares "
        "predictions with published runs. Formulas and calibration: docs/planner.md.")
    p.add_argument("action", nargs="?", choices=["validate"],
                   help="'validate FILE.csv': predict every row of a published-runs CSV and report errors.")
    p.add_argument("file", nargs="?", metavar="FILE.csv", help="The CSV for 'validate'.")
    p.add_argument("--anchor", nargs="?", const="first", default=None, choices=["first", "nearest"],
                   help="With 'validate': also predict each source's speed rows at the factor one other run of "
                        "the source measures (what one measured run of a stack buys; plan.anchor): its first "
                        "speed row (default), or for each row the source's most similar run ('nearest').")
    m = p.add_argument_group("model")
    m.add_argument("--model", default="llama3-8b", metavar="NAME",
                   help="Preset (see --list-models; tp-gpt-<size> is the built-in gpt) or a config.json "
                        "path (default: llama3-8b).")
    m.add_argument("--hf-config", metavar="config.json", help="Read the model from a Hugging Face config.json "
                   "(Llama, GPT-2, BERT, MPT fields; transformers not needed; mixture-of-experts models are "
                   "refused). Overrides --model.")
    m.add_argument("--list-models", action="store_true", help="List the presets and exit.")
    h = p.add_argument_group("hardware and layout")
    h.add_argument("--gpu", default=None, metavar="NAME",
                   help=f"Catalogued accelerator, e.g. h100-sxm, 'A100 80GB' (default: {DEFAULT_GPU}).")
    h.add_argument("--hardware-file", metavar="FILE.toml", action="append",
                   help="Parts of your own, [accelerator.KEY] tables with the catalog's fields (a variant: "
                        "base = \"h100-sxm\" plus the figures that differ); --gpu and validation rows may "
                        "then name them. Repeat it to add several files. docs/planner.md has an example.")
    h.add_argument("--memory-gb", type=float, default=None, metavar="GB",
                   help="Override the device's memory capacity (e.g. a 96 GB variant).")
    h.add_argument("--tdp-w", type=float, default=None, metavar="W", help="Override the board power (a power cap).")
    h.add_argument("--peak-scale", type=float, default=None, metavar="X",
                   help="Scale every compute peak (e.g. 0.9 for a power-capped or lower-clocked part).")
    h.add_argument("--mem-bw-gb-per-s", type=float, default=None, metavar="GB/S",
                   help="Override the device memory bandwidth.")
    h.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                   help="Devices the intra-node link joins (default: the catalog's, 8 on a board; 4 on a "
                        "four-GPU board or a GH200 node); larger groups talk over the network.")
    h.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="Number of devices (default: tp x pp x dp, or 8).")
    h.add_argument("--tp", type=int, default=1, metavar="N", help="Tensor-parallel ranks (default: 1).")
    h.add_argument("--pp", type=int, default=1, metavar="N", help="Pipeline stages (default: 1).")
    h.add_argument("--dp", type=int, default=None, metavar="N",
                   help="Data-parallel replicas (default: gpus / (tp x pp x cp)).")
    h.add_argument("--cp", type=int, default=1, metavar="N",
                   help="Context-parallel ranks: each holds seq_len / N tokens of every sequence and "
                        "passes keys/values round a ring (long sequences; default: 1).")
    h.add_argument("--cp-mode", default="ring", choices=["ring", "ulysses"],
                   help="How the --cp ranks share attention: ring (keys/values passed round; Megatron-Core, "
                        "torchtitan) or ulysses (all-to-alls swap tokens for heads; DeepSpeed-Ulysses; "
                        "cp must divide the heads of a tp rank) (default: ring).")
    h.add_argument("--sharding", default="none", choices=["none", "zero1", "zero2", "zero3", "fsdp", "hsdp"],
                   help="Data-parallel sharding: none (DDP), ZeRO stage 1/2, zero3 = fsdp, hsdp = fsdp "
                        "inside each node and replicated across nodes (default: none).")
    h.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron sequence parallelism with tp > 1 (splits norm/dropout activations).")
    h.add_argument("--micro-batch", type=int, default=1, metavar="N",
                   help="Sequences per micro-batch per replica (default: 1).")
    h.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe", "interleaved"],
                   help="Pipeline schedule (default: 1f1b).")
    h.add_argument("--virtual-stages", type=int, default=1, metavar="V",
                   help="Model chunks per stage for --schedule interleaved (default: 1).")
    h.add_argument("--recompute", default="none", choices=["none", "selective", "op", "full"],
                   help="Activation recomputation: selective = the attention core (Megatron), op = every "
                        "second matmul and all elementwise ops (torchtitan's op-level SAC), full = every "
                        "block (default: none).")
    h.add_argument("--recompute-layers", type=int, default=None, metavar="K",
                   help="With --recompute full: recompute only K blocks of each model chunk, the others keep "
                        "their activations (Megatron --recompute-method block --recompute-num-layers K; "
                        "default: every block). --search picks the fewest that fit.")
    h.add_argument("--overlap-comm", action="store_true",
                   help="The framework hides TP collectives inside the GEMMs and the ZeRO weight all-gather "
                        "behind the next forward (Megatron --tp-comm-overlap --overlap-param-gather, "
                        "torchtitan async TP).")
    h.add_argument("--grad-reduce-after-backward", action="store_true",
                   help="Reduce gradients after backward instead of behind it, bucket by bucket (DeepSpeed "
                        "ZeRO-0/1/2 with its default overlap_comm false).")
    h.add_argument("--grad-bucket-copies", action="store_true",
                   help="Data parallelism copies each gradient into its all-reduce bucket and back: PyTorch "
                        "DDP's default gradient_as_bucket_view=False, apex DDP, Horovod, DeepSpeed ZeRO-0. Adds "
                        "4 x the gradient bytes of memory traffic a step with more than one replica (default: "
                        "the buckets are the gradients, as in tensorpilot's DDP, FSDP and Megatron).")
    t = p.add_argument_group("training setup")
    t.add_argument("--seq-len", type=int, default=None, metavar="N",
                   help="Tokens per sequence (default: the model's context, at most 8192).")
    t.add_argument("--global-batch", type=int, default=None, metavar="N",
                   help="Sequences per optimizer step (default: ~1M tokens, at least one per replica).")
    t.add_argument("--precision", default="bf16",
                   choices=["fp32", "tf32", "bf16", "fp16", "bf16-amp", "fp16-amp", "bf16-pure", "fp16-pure", "fp8",
                            "fp4"],
                   help="bf16/fp16: half weights + fp32 master (Adam: 18 B/param, bf16 with fp32 gradients as "
                        "Megatron keeps them; fp16 16 B/param); *-amp: torch.autocast "
                        "with fp32 weights; bf16-pure / fp16-pure: everything in the half dtype; fp8 / fp4: bf16 "
                        "with the block GEMMs in fp8 or NVFP4 / MXFP4 (Blackwell, MI355X) (default: bf16).")
    t.add_argument("--optimizer", default="adam",
                   choices=["adam", "adamw", "sgd", "sgd-plain", "adafactor", "adamw8bit", "muon", "lamb", "lion",
                            "adam-mini", "none"],
                   help="optimizer whose state is counted (default: adam; sgd: with momentum; sgd-plain: "
                        "without, no state; adafactor and adamw8bit "
                        "keep much less, see plan/memory.py; muon: one momentum on the block matrices, "
                        "orthogonalised by Newton-Schulz GEMMs, AdamW on the rest; lamb: Adam's moments and a "
                        "trust ratio per tensor; lion: one momentum; adam-mini: Adam's first moment and one "
                        "second moment per block; none: forward and "
                        "backward only, no step)")
    t.add_argument("--optimizer-impl", default="fused", choices=["fused", "foreach", "loop"],
                   help="How the optimizer step runs: fused (one kernel: torch fused=True, Apex / Transformer "
                        "Engine FusedAdam in Megatron-LM and DeepSpeed), foreach (torch.optim's default on CUDA: "
                        "~3x the bytes of fused for AdamW) or loop (foreach=False or a hand-written per-parameter "
                        "update: the foreach passes, dispatched tensor by tensor from the host) (default: fused).")
    t.add_argument("--doc-len", type=int, default=None, metavar="N",
                   help="Packed sequences of documents N tokens long under a document mask that the attention "
                        "kernel skips (FlexAttention block mask, FlashAttention varlen): attention costs each "
                        "document's pairs, not the whole sequence's (default: one document a sequence).")
    t.add_argument("--offload", default="none", choices=["none", "optimizer", "params"],
                   help="Keep state in host memory: optimizer = fp32 master, Adam states and gradients with "
                        "Adam stepped on the CPU (DeepSpeed ZeRO-Offload, Megatron --optimizer-cpu-offload); "
                        "params = the weights too (ZeRO-Infinity offload_param, FSDP CPUOffload; needs "
                        "--sharding zero3) (default: none).")
    t.add_argument("--attention", default="flash", choices=["flash", "flash2", "flash1", "materialized"],
                   help="Fused attention (FlashAttention-2 class: flash-attn 2+, cuDNN, PyTorch 2.2+ SDPA), "
                        "FlashAttention-2 itself (flash2: flash-attn 2.x, which runs at its Hopper speed on "
                        "Blackwell), a first-generation fused kernel at half the fused speed (flash1: flash-attn "
                        "1.x, xformers, PyTorch 2.0-2.1 SDPA) or materialised s x s scores (default: flash).")
    t.add_argument("--kernels", default=None, choices=["fused", "eager"],
                   help="How norms, activations and rotary embeddings run: fused (torch.compile, Megatron / "
                        "Transformer Engine, XLA) or eager PyTorch, one kernel an op, which moves 2-4x the "
                        "bytes on a Llama-style block (default: fused). A traced model (--model PKG.MOD:FACTORY, "
                        "timm:NAME, --hf-config) is planned as traced, eagerly, by default; fused plans its step "
                        "under torch.compile, the memory-bound ops between two matmuls as one kernel.")
    t.add_argument("--loss-kernel", default="whole", choices=["whole", "chunked", "fused", "compiled"],
                   help="How the loss holds the logits: whole (fp32 copy and gradient); chunked (torchtune's "
                        "chunked output loss: fp32 one chunk at a time); fused (Liger-Kernel's fused linear "
                        "cross-entropy, Cut Cross-Entropy: never whole); compiled (under torch.compile with the "
                        "model: no fp32 copy, a third of the traffic). Default: whole.")
    t.add_argument("--vocab-multiple", type=int, default=1, metavar="N",
                   help="The output layer's vocabulary padded to a multiple of N (Megatron's "
                        "--make-vocab-size-divisible-by 128, nanoGPT's 50,304): a 16-bit GEMM whose width is not a "
                        "multiple of 8 runs cuBLAS's slower kernels on NVIDIA parts (default: 1, unpadded).")
    t.add_argument("--fp8-recipe", default="te", choices=["te", "torchao"],
                   help="With --precision fp8, whose GEMMs: te = Transformer Engine (cuBLASLt, 0.81 of the fp8 "
                        "peak on H100/H200), torchao = torchao float8 training via torch._scaled_mm (0.59) "
                        "(default: te).")
    t.add_argument("--grad-dtype", default=None, choices=["fp32", "bf16", "fp16"],
                   help="Dtype gradients are accumulated and reduced in (default: the precision's: fp32 for "
                        "bf16 and fp8 as Megatron-LM keeps them, the weights' dtype otherwise; NVIDIA's NeMo "
                        "performance recipes reduce in bf16).")
    a = p.add_argument_group("your stack (plan.anchor: one measured step carries to other layouts, sizes, parts)")
    a.add_argument("--measured-step-s", type=float, default=None, metavar="S",
                   help="A step of this layout (--gpu, --tp/--pp/--dp/..., --global-batch; a traced model's "
                        "--batch-size and --gpus) measured on your stack: the planner solves the share of its "
                        "kernel rates your stack reaches and plans (or --search-es) with it.")
    a.add_argument("--measured-tokens-per-s", type=float, default=None, metavar="N",
                   help="The same as a throughput: tokens a second over all devices of the measured layout.")
    a.add_argument("--stack", default=None, choices=STACKS,
                   help="Without a measurement, whose stack: typical = the median published run's, kernels at "
                        f"{TYPICAL_STACK_EFFICIENCY:g} of a tuned recipe's rates; recipe = a tuned recipe as its "
                        "team published it (NeMo / Megatron-Bridge performance configs, MLPerf submissions, "
                        "llm-foundry, torchtitan, MaxText) at the planner's full rates (default: typical; a traced "
                        "model is planned from its own ops at full rates).")
    a.add_argument("--stack-efficiency", type=float, default=None, metavar="X",
                   help="That share, as an earlier --measured-step-s printed it (default: --stack's).")
    a.add_argument("--host-efficiency", type=float, default=None, metavar="X",
                   help="The share of the planner's op-dispatch rate your host reaches, as --measured-step-s prints "
                        "it for a step that waits for the host (eager kernels, small batches; default 1).")
    c = p.add_argument_group("time, cost and energy")
    c.add_argument("--tokens", type=float, default=None, metavar="N",
                   help="Tokens to train (e.g. 1e12) for time, GPU-hours, cost and energy.")
    c.add_argument("--price-per-hour", type=float, default=None, metavar="USD",
                   help="Price of one device-hour (default: the catalog's dated list price, if any).")
    c.add_argument("--grid-intensity", type=float, default=None, metavar="G_PER_KWH",
                   help="Grid carbon intensity in g CO2/kWh for the CO2 estimate (default: 400).")
    c.add_argument("--goodput", type=float, default=None, metavar="FRACTION",
                   help="Share of wall-clock that trains, after restarts and the steps they replay, for "
                        "time, device-hours, cost and energy (default: what interruptions leave at Llama 3's "
                        "measured rate, 0.90 on 16,384 devices, ~1 on one node; 1 = steady state).")
    s = p.add_argument_group("search")
    s.add_argument("--search", action="store_true",
                   help="Enumerate tp/pp/dp(/cp from 16k-token sequences)/micro-batch/recompute/sharding for --gpus devices, drop invalid "
                        "or non-fitting layouts, print the best.")
    s.add_argument("--objective", default="throughput", choices=["throughput", "cost"],
                   help="Ranking for --search (default: throughput).")
    s.add_argument("--top", type=int, default=5, metavar="N", help="Layouts to show with --search (default: 5).")
    s.add_argument("--deadline", metavar="DURATION",
                   help="With --tokens: cheapest catalogued device type and count that trains in time "
                        "(e.g. 14d, 36h); --gpu restricts it to one type.")
    i = p.add_argument_group("inference sizing")
    i.add_argument("--inference", action="store_true",
                   help="Size inference instead: weights + KV cache for --batch x --context.")
    i.add_argument("--batch", type=int, default=1, metavar="N", help="Concurrent sequences (default: 1).")
    i.add_argument("--context", type=int, default=None, metavar="N",
                   help="Tokens per sequence held in the KV cache (default: the model's context).")
    i.add_argument("--kv-dtype", default=None, choices=["fp32", "bf16", "fp16", "fp8", "int8"],
                   help="KV-cache dtype (default: the weights' dtype).")
    p.add_argument("--json", action="store_true", help="Print machine-readable JSON.")
    p.set_defaults(func=cmd_plan)
    return {"plan": p}


# ---------------------------------------------------------------------------------------- command

def _model(args):
    from tensorpilot.plan.models import get_model, model_spec_from_hf_config

    return model_spec_from_hf_config(args.hf_config) if args.hf_config else get_model(args.model)


def _int_limits() -> dict[str, int]:
    """Upper bound of each integer option (limits.py gives the reasons)."""
    from tensorpilot.plan.limits import MAX_DEVICES, MAX_SEQ_LEN, MAX_SEQUENCES

    return {"gpus": MAX_DEVICES, "tp": MAX_DEVICES, "pp": MAX_DEVICES, "dp": MAX_DEVICES, "cp": MAX_DEVICES,
            "micro_batch": MAX_SEQUENCES, "virtual_stages": MAX_DEVICES, "recompute_layers": MAX_DEVICES,
            "seq_len": MAX_SEQ_LEN,
            "global_batch": MAX_SEQUENCES, "top": MAX_SEQUENCES, "batch": MAX_SEQUENCES, "context": MAX_SEQ_LEN}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_stack(args) -> list[str]:
    """The stack flags (measured step or throughput, stack and host efficiency) in range and not
    saying one thing twice; the ones given, in the group's order (a traced plan checks them too)."""
    from tensorpilot.plan.limits import MAX_STACK_EFFICIENCY, check_number

    given = [f for f in ("measured_step_s", "measured_tokens_per_s", "stack_efficiency", "host_efficiency")
             if getattr(args, f, None) is not None]
    for name in given:
        check_number(_flag(name), getattr(args, name), 1e30 if name.startswith("measured") else MAX_STACK_EFFICIENCY,
                     above_low=True)
    if len(given) > 1 and given[:2] != ["stack_efficiency", "host_efficiency"]:
        raise UsageError(f"{' and '.join(map(_flag, given))} say the same thing; pass one of them.")
    if getattr(args, "stack", None) and args.stack_efficiency is not None:
        raise UsageError(f"--stack {args.stack} and --stack-efficiency say the same thing; pass one of them.")
    return given


def _check_options(args) -> None:
    """Every number in range and every combination meaningful, before any model is read."""
    from tensorpilot.plan.limits import MAX_GRID_G_PER_KWH, MAX_PRICE_PER_HOUR, MAX_TOKENS, check_count, check_number

    for name, high in _int_limits().items():
        if getattr(args, name) is not None:
            check_count(_flag(name), getattr(args, name), high)
    if args.tokens is not None:
        check_number("--tokens", args.tokens, MAX_TOKENS, above_low=True)
    if args.price_per_hour is not None:
        check_number("--price-per-hour", args.price_per_hour, MAX_PRICE_PER_HOUR)
    if args.grid_intensity is not None:
        check_number("--grid-intensity", args.grid_intensity, MAX_GRID_G_PER_KWH)
    if args.goodput is not None:
        check_number("--goodput", args.goodput, 1.0, above_low=True)
    given = check_stack(args)
    if args.stack and args.inference:
        raise UsageError(f"--stack {args.stack} plans training kernels and --inference does not take it: drop it.")
    if given and args.inference:
        raise UsageError(f"{_flag(given[0])} is measured on training steps and --inference does not take it: "
                         "drop it.")
    if given and given[0].startswith("measured") and args.deadline is not None:
        raise UsageError(f"{_flag(given[0])} anchors one training layout and --deadline plans many; run "
                         f"`tensorpilot plan` with {_flag(given[0])} and your layout first, then pass the stack "
                         "or host efficiency it prints as --deadline ... --stack-efficiency X (--host-efficiency X).")
    modes = [m for m, on in (("--search", args.search), ("--deadline", args.deadline is not None),
                             ("--inference", args.inference)) if on]
    if len(modes) > 1:
        raise UsageError(f"{' and '.join(modes)} cannot be combined; pass one of them.")
    if args.recompute_layers is not None and args.recompute != "full":
        raise UsageError("--recompute-layers needs --recompute full (it says how many blocks of each model chunk "
                         "recompute).")
    if args.virtual_stages > 1 and args.schedule != "interleaved":
        raise UsageError("--virtual-stages needs --schedule interleaved (only that schedule splits a stage "
                         "into chunks).")


def _device_count(args) -> int:
    """--gpus, else tp x pp x dp when a layout is given, else 8 (one node)."""
    from tensorpilot.plan.limits import MAX_DEVICES

    if args.gpus:
        return args.gpus
    if not (args.dp or args.tp > 1 or args.pp > 1 or args.cp > 1):
        return 8
    n = args.tp * args.pp * args.cp * (args.dp or 1)
    if n > MAX_DEVICES:
        raise UsageError(f"--tp x --pp x --cp x --dp = {n:,} devices exceeds the planner's maximum of {MAX_DEVICES:,}.")
    return n


def _json(obj) -> str:
    """Strict JSON (RFC 8259 has no NaN or Infinity): a non-finite float becomes null."""
    return json.dumps(finite(obj), indent=1, allow_nan=False)


def _setup(args, spec, replicas: int):
    from tensorpilot.plan import calibration as cal
    from tensorpilot.plan.limits import MAX_SEQUENCES
    from tensorpilot.plan.predict import TrainSetup

    seq = args.seq_len or min(spec.max_seq_len, 8192)
    batch = args.global_batch
    if batch is None:                 # ~1M tokens, a power of two, at least one sequence per replica
        batch = max(replicas * args.micro_batch, 1 << max(0, round(math.log2(2**20 / seq))))
        if batch > MAX_SEQUENCES:
            raise UsageError(f"the default global batch, {replicas:,} replicas x --micro-batch {args.micro_batch:,}, "
                             f"exceeds {MAX_SEQUENCES:,} sequences; pass --global-batch.")
    return TrainSetup(seq_len=seq, global_batch=batch, precision=args.precision, optimizer=args.optimizer,
                      optimizer_impl=args.optimizer_impl, attention=args.attention, kernels=args.kernels or "fused",
                      fp8_recipe=args.fp8_recipe,
                      grad_dtype=args.grad_dtype, tokens=args.tokens,
                      price_per_hour=args.price_per_hour,
                      grid_g_per_kwh=args.grid_intensity if args.grid_intensity is not None
                      else cal.DEFAULT_GRID_G_PER_KWH,
                      goodput=args.goodput, offload=args.offload, doc_len=args.doc_len,
                      loss_kernel=args.loss_kernel, vocab_multiple=args.vocab_multiple,
                      stack_efficiency=args.stack_efficiency or cal.stack_efficiency(args.stack or "typical"),
                      host_efficiency=args.host_efficiency or 1.0)


def accelerator(args, default: str = DEFAULT_GPU):
    """The device ``--gpu`` names, after ``--hardware-file`` added the user's parts and with the
    figures ``--memory-gb/--tdp-w/--peak-scale/--mem-bw-gb-per-s/--gpus-per-node`` override."""
    from tensorpilot.hardware import catalog

    load_hardware(args)
    acc = catalog.get(default if getattr(args, "gpu", None) in (None, "local") else args.gpu)
    return catalog.variant(acc, memory_gb=getattr(args, "memory_gb", None), tdp_w=getattr(args, "tdp_w", None),
                           peak_scale=getattr(args, "peak_scale", None),
                           mem_bw_gb_per_s=getattr(args, "mem_bw_gb_per_s", None),
                           gpus_per_node=getattr(args, "gpus_per_node", None))


def load_hardware(args) -> None:
    if getattr(args, "hardware_file", None):
        from tensorpilot.hardware import catalog

        for path in args.hardware_file:         # each adds to the parts the ones before it added
            catalog.load_hardware_file(path)


def cmd_plan(args: argparse.Namespace) -> int:
    if args.action == "validate":
        return _cmd_validate(args)
    if args.file:
        raise UsageError(f"unexpected argument {args.file!r}; did you mean `tensorpilot plan validate FILE.csv`?")
    if args.anchor:
        raise UsageError("--anchor goes with validate (`tensorpilot plan validate FILE.csv --anchor`); to anchor a "
                         "plan on your stack pass --measured-step-s S.")
    if args.list_models:
        from tensorpilot.plan.models import preset_names

        print(_json(preset_names()) if args.json else "\n".join(preset_names()))
        return 0
    _check_options(args)
    if args.deadline is not None:
        return _cmd_deadline(args)
    acc = accelerator(args)
    spec = _model(args)
    if args.inference:
        return _cmd_inference(args, spec, acc)
    gpus = _device_count(args)
    if args.search:
        return _cmd_search(args, spec, acc, gpus)
    from tensorpilot.plan.predict import predict

    layout, setup, anchor = _layout_setup(args, spec, acc, gpus)
    plan = predict(spec, acc, layout, setup)
    if anchor:
        plan.notes.insert(0, anchor)
    elif args.stack_efficiency is None and args.host_efficiency is None:
        from tensorpilot.plan.anchor import expected_error_sentence

        plan.notes.append(_stack_sentence(args.stack or "typical", setup.stack_efficiency))
        plan.notes.append(expected_error_sentence())
    if args.json:
        print(_json(plan.to_dict()))
    else:
        _print_plan(plan, spec, setup)
    return 0


def _stack_sentence(stack: str, efficiency: float) -> str:
    """Which stack an unmeasured plan is of, and the flag for the other."""
    if stack == "recipe":
        from tensorpilot.plan.calibration import TYPICAL_STACK_EFFICIENCY

        return (f"kernels at a vendor's tuned recipe's rates (--stack recipe); other stacks run a median "
                f"{TYPICAL_STACK_EFFICIENCY:g} of them")
    return (f"kernels at {efficiency:g} of a tuned recipe's rates, the median published run's (--stack typical); "
            "pass --stack recipe for a NeMo / Megatron-Bridge / MLPerf-class recipe")


def _layout_setup(args, spec, acc, gpus: int):
    """The layout the flags describe, its setup, and -- when a measured step anchors it -- the
    setup at the stack efficiency that reproduces the measurement, with a sentence saying so."""
    from tensorpilot.plan import calibration as cal
    from tensorpilot.plan.predict import Layout, check_layout

    if gpus % (args.tp * args.pp * args.cp):
        raise ConfigError(f"tp x pp x cp = {args.tp * args.pp * args.cp} does not divide --gpus {gpus}.")
    dp = args.dp or gpus // (args.tp * args.pp * args.cp)
    hybrid = args.sharding == "hsdp"            # fsdp sharded over a node's devices, replicated across nodes
    layout = Layout(tp=args.tp, pp=args.pp, dp=dp, sharding="fsdp" if hybrid else args.sharding,
                    sequence_parallel=args.sequence_parallel, micro_batch=args.micro_batch, schedule=args.schedule,
                    virtual_stages=args.virtual_stages, recompute=args.recompute,
                    recompute_layers=args.recompute_layers or 0,
                    shard_group=max(1, cal.GPUS_PER_NODE // args.tp) if hybrid else 0, cp=args.cp,
                    cp_mode=args.cp_mode, overlap_comm=args.overlap_comm,
                    overlap_grad_reduce=not args.grad_reduce_after_backward,
                    grad_bucket_copies=args.grad_bucket_copies)
    setup = _setup(args, spec, dp)
    check_layout(spec, layout, setup, n_devices=gpus)
    step_s = args.measured_step_s
    if args.measured_tokens_per_s is not None:
        step_s = setup.global_batch * setup.seq_len / args.measured_tokens_per_s
    if step_s is None:
        return layout, setup, None
    from dataclasses import replace

    from tensorpilot.plan.anchor import sentence, stack_efficiency

    found = stack_efficiency(spec, acc, layout, setup, step_s)
    setup = replace(setup, **{found.part: found.efficiency})
    return layout, setup, sentence(found, layout.describe(), step_s,
                                   " (communication, not the stack, sets this step's time)")


def _gib(x: float) -> str:
    return f"{x / 2**30:,.2f} GiB"


def _duration(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s >= 86400:
        return f"{s / 86400:,.1f} days"
    if s >= 3600:
        return f"{s / 3600:,.1f} h"
    return f"{s:,.1f} s"


def _print_plan(plan, spec, setup) -> None:
    from rich.console import Console
    from rich.table import Table

    from tensorpilot.plan import calibration as cal
    from tensorpilot.plan.timing import FUSED_ATTENTION

    con = Console(highlight=False)
    lo = plan.layout_detail
    con.print(f"[bold]{spec.name}[/] ({spec.n_params / 1e9:,.2f}B params) on {plan.n_devices} x {plan.hardware}, "
              f"layout [bold]{plan.layout}[/] ({lo.describe()}), seq {setup.seq_len}, global batch "
              f"{setup.global_batch}, {setup.precision}, {setup.attention} attention, {setup.kernels} kernels")
    if setup.doc_len and setup.doc_len < setup.seq_len:
        con.print(f"packed documents of {setup.doc_len:,} tokens under a document mask"
                  + ("" if setup.attention in FUSED_ATTENTION else
                     " (materialised scores are computed in full: the mask saves nothing there)"))
    if spec.attention_window:
        con.print(f"sliding-window attention: {spec.windowed_layers} of {spec.layers} blocks see the "
                  f"latest {spec.attention_window:,} keys"
                  + ("" if setup.attention in FUSED_ATTENTION else " (materialised scores are full-size: "
                     "the window saves nothing there)"))
    mt = Table(title="memory per device (busiest)", show_header=False)
    for k, v in plan.memory_bytes.items():
        if k != "total" and (v or k != "optimizer_step"):     # the step's temporaries: foreach Adam only
            mt.add_row(k, _gib(v))
    verdict = "[green]fits[/]" if plan.fits else "[red]does NOT fit[/]"
    mt.add_row("[bold]total[/]", f"[bold]{_gib(plan.memory_bytes['total'])}[/] of {_gib(plan.device_memory_bytes)}: "
               f"{verdict} (limit {_gib(plan.memory_limit_bytes)}, {cal.SAFETY_MARGIN_FRACTION:.0%} kept free)")
    if setup.offload != "none":
        mt.add_row("host memory", f"{_gib(plan.host_memory_bytes)} a device offloaded ({setup.offload}), "
                   f"{_gib(plan.host_memory_bytes * min(plan.n_devices, cal.GPUS_PER_NODE))} a host")
    con.print(mt)
    tt = Table(title="step", show_header=False)
    tt.add_row("step time", f"{plan.step_time_s:,.3f} s")
    for k, v in plan.time_breakdown_s.items():
        if v > 1e-6:
            tt.add_row(f"  {k}", f"{v:,.3f} s")
    tt.add_row("tokens/s", f"{plan.tokens_per_s:,.0f} total, {plan.tokens_per_s_per_device:,.0f} per device")
    tt.add_row("MFU / HFU", f"{plan.mfu:.1%} / {plan.hfu:.1%} of the datasheet {plan.peak_flops_per_s / 1e12:,.0f} "
               "TFLOP/s" if plan.mfu is not None else "n/a")
    if plan.time_to_train_s is not None:
        tt.add_row("time to train", f"{_duration(plan.time_to_train_s)} ({plan.gpu_hours:,.0f} device-hours; "
                   f"{plan.goodput:.2%} goodput)")
        tt.add_row("cost", f"${plan.cost_usd:,.0f} at ${plan.price_per_gpu_hour:,.2f}/device-hour"
                   if plan.cost_usd is not None else "n/a (no price: --price-per-hour)")
        if plan.energy_kwh is not None:
            tt.add_row("energy", f"{plan.energy_kwh:,.0f} kWh at {plan.power_w_per_device:,.0f} W/device; "
                       f"{plan.co2_kg / 1000:,.1f} t CO2 at {setup.grid_g_per_kwh:g} g/kWh")
    else:
        tt.add_row("time to train", "pass --tokens N for time, cost and energy")
    con.print(tt)
    for note in plan.notes:
        con.print(f"note: {note}")


def _cmd_search(args, spec, acc, gpus: int) -> int:
    import time
    from dataclasses import replace

    from tensorpilot.plan.search import search

    t0 = time.perf_counter()
    setup, anchor = _setup(args, spec, 1), None
    if args.measured_step_s is not None or args.measured_tokens_per_s is not None:
        # the measured layout is the one the flags describe; the search plans every other at its efficiency
        _, anchored, anchor = _layout_setup(args, spec, acc, gpus)
        setup = replace(setup, stack_efficiency=anchored.stack_efficiency, host_efficiency=anchored.host_efficiency)
    res = search(spec, acc, gpus, setup, objective=args.objective, top=args.top)
    elapsed = time.perf_counter() - t0
    if args.json:
        print(_json({"objective": res.objective, "considered": res.considered, "invalid": res.invalid,
                     "not_fitting": res.not_fitting, "search_s": elapsed, "why": res.why,
                     "stack_efficiency": setup.stack_efficiency, "host_efficiency": setup.host_efficiency,
                     "anchor": anchor,
                     "ranked": [p.to_dict() for p in res.ranked]}))
        return 0 if res.ranked else 1
    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False)
    con.print(f"searched {res.considered} layouts of {spec.name} on {gpus} x {acc.key} in {elapsed:.2f} s "
              f"(seq {setup.seq_len}, global batch {setup.global_batch}); {res.not_fitting} do not fit, "
              f"{res.invalid} invalid")
    if anchor or args.stack_efficiency is not None or args.host_efficiency is not None:
        con.print(anchor or f"at stack efficiency {setup.stack_efficiency:g}, host efficiency "
                            f"{setup.host_efficiency:g} (--stack-efficiency, --host-efficiency)")
    else:
        con.print(_stack_sentence(args.stack or "typical", setup.stack_efficiency))
    if not res.considered:
        con.print(f"[red]no valid layout[/]: no tp x pp x dp split of {gpus:,} devices has a data-parallel size "
                  f"that divides the global batch of {setup.global_batch:,}; pass a --global-batch that is a "
                  "multiple of --gpus.")
        return 1
    if not res.ranked:
        con.print("[red]no layout fits[/]: add devices, use a larger --global-batch, or a device with more memory.")
        return 1
    with_cp = any(p.layout_detail.cp > 1 for p in res.ranked)
    tab = Table("#", "tp/pp/dp/cp" if with_cp else "tp/pp/dp", "sharding", "mb", "recompute", "step s", "tok/s/dev",
                "MFU", "GiB")
    for n, p in enumerate(res.ranked, 1):
        lo = p.layout_detail
        sched = f" {lo.schedule}" + (f"/{lo.virtual_stages}" if lo.virtual_stages > 1 else "") if lo.pp > 1 else ""
        degrees = f"{lo.tp}/{lo.pp}/{lo.dp}" + (f"/{lo.cp}" + (" ulysses" if lo.cp_mode == "ulysses" else "")
                                                if with_cp else "")
        tab.add_row(str(n), degrees, lo.sharding + (" sp" if lo.sequence_parallel else ""),
                    str(lo.micro_batch), lo.recompute + (f"({lo.recompute_layers})" if lo.recompute_layers else "") + sched, f"{p.step_time_s:,.3f}",
                    f"{p.tokens_per_s_per_device:,.0f}", f"{p.mfu:.1%}", f"{p.memory_bytes['total'] / 2**30:,.1f}")
    con.print(tab)
    for line in res.why:
        con.print(line)
    return 0


def _cmd_deadline(args) -> int:
    from tensorpilot.hardware import catalog
    from tensorpilot.plan.search import DEADLINE_MAX_DEVICES, cheapest_for_deadline, parse_duration_s

    if args.tokens is None:
        raise UsageError("--deadline needs --tokens (how many tokens to train).")
    deadline_s = parse_duration_s(args.deadline)
    if args.gpu is not None:
        accs = [accelerator(args)]              # loads --hardware-file itself
    else:
        load_hardware(args)
        accs = list(catalog.all_accelerators().values())
    if args.gpu is not None and args.price_per_hour is None and accs[0].price_usd_per_gpu_hour is None:
        raise UsageError(f"{accs[0].key} has no catalog price; pass --price-per-hour USD to size it for a deadline.")
    spec = _model(args)
    setup = _setup(args, spec, 1)
    found = cheapest_for_deadline(spec, args.tokens, deadline_s, setup, accelerators=accs)
    if args.json:
        print(_json({"deadline_s": deadline_s, "tokens": args.tokens,
                     "options": [{"cost_usd": c, **p.to_dict()} for p, c in found]}))
        return 0 if found else 1
    if not found:
        which = accs[0].key if args.gpu is not None else "catalogued device" + (
            "" if args.price_per_hour is not None else " with a price")
        hint = "" if args.price_per_hour is not None or args.gpu is not None else \
            "; pass --gpu NAME --price-per-hour USD for other devices"
        print(f"no {which} trains {args.tokens:.3g} tokens of {spec.name} within {_duration(deadline_s)} on up to "
              f"{DEADLINE_MAX_DEVICES:,} devices{hint}.")
        return 1
    print(f"{spec.name}, {args.tokens:.3g} tokens within {_duration(deadline_s)} "
          f"(seq {setup.seq_len}, global batch {setup.global_batch}); devices with a price, cheapest first:")
    for p, c in found:
        print(f"  {p.hardware:16s} x {p.n_devices:<6d} {p.layout_detail.describe():55s} "
              f"{_duration(p.time_to_train_s):>12s}  ${c:,.0f}  (${p.price_per_gpu_hour:.2f}/device-hour)")
    best = found[0][0]
    print(f"recommendation: {best.n_devices} x {best.hardware} ({best.layout}), ${found[0][1]:,.0f}, "
          f"{_duration(best.time_to_train_s)}.")
    return 0


def _cmd_inference(args, spec, acc) -> int:
    from tensorpilot.plan.predict import predict_inference

    dtype = {"bf16-amp": "bf16", "fp16-amp": "fp16", "bf16-pure": "bf16", "fp16-pure": "fp16",
             "tf32": "fp32"}.get(args.precision, args.precision)
    plan = predict_inference(spec, acc, batch=args.batch, context=args.context or spec.max_seq_len, dtype=dtype,
                             kv_dtype=args.kv_dtype, tp=args.tp)
    if args.json:
        print(_json(plan.to_dict()))
        return 0
    verdict = "fits" if plan.fits else "does NOT fit"
    print(f"{spec.name} inference on {args.tp} x {acc.key}, batch {args.batch} x context "
          f"{args.context or spec.max_seq_len}, {dtype} weights:")
    print(f"  weights {_gib(plan.weights_bytes)}, KV cache {_gib(plan.kv_cache_bytes)}, activations "
          f"{_gib(plan.activation_bytes)}, total {_gib(plan.total_bytes_per_device)} per device: {verdict} "
          f"(limit {_gib(plan.memory_limit_bytes)})")
    print(f"  memory-bound decode: ~{plan.decode_tokens_per_s:,.0f} tokens/s")
    return 0


def _cmd_validate(args) -> int:
    from tensorpilot.plan.validate import anchored, by_split, counts, load_rows, summarize, validate_rows

    if not args.file:
        raise UsageError("validate needs a CSV file: `tensorpilot plan validate FILE.csv`.")
    load_hardware(args)
    rows = load_rows(args.file)
    results = validate_rows(rows)
    summary = summarize(results)
    carried = anchored(rows, results, args.anchor) if args.anchor else None
    if args.json:
        out = {"rows": [r.to_dict() for r in results], "summary": summary, "counts": counts(results),
               "by_split": by_split(results)}
        if carried is not None:
            rows_a = [r for _, r in carried]
            out["anchored"] = {"rows": [r.to_dict() for r in rows_a], "summary": summarize(rows_a),
                               "unanchored_summary": summarize([results[i] for i, _ in carried]),
                               "by_split": by_split(rows_a)}
        print(_json(out))
        return 0
    print(format_validation(results, summary))
    if carried is not None:
        print("\n" + format_anchored(results, carried))
    return 0


def format_anchored(results, carried) -> str:
    """The anchored rows as a Markdown table, then their error beside the same rows' unanchored one."""
    from tensorpilot.plan.validate import summarize

    lines = ["## Anchored: one run of each source measures its stack's factor", "",
             "| id | metric | published | predicted | error | note |", "|---|---|---:|---:|---:|---|"]
    for _, r in carried:
        lines.append(f"| {_cell(r.id)} | {_cell(r.metric)} | {r.published:,.4g} {_cell(r.unit)} | "
                     f"{r.predicted:,.4g} | {100 * r.error:+.1f}% | {_cell(r.note)} |" if r.error is not None else
                     f"| {_cell(r.id)} | {_cell(r.metric)} | n/a | n/a | n/a | {_cell(r.note)} |")
    a = summarize([r for _, r in carried]).get("all")
    u = summarize([results[i] for i, _ in carried]).get("all")
    if a is None or u is None:
        lines += ["", "no source has two speed rows: nothing to anchor."]
    else:
        lines += ["", f"{a['rows']} rows anchored: median abs error {100 * a['median_abs_error']:.1f}% "
                      f"(the same rows unanchored: {100 * u['median_abs_error']:.1f}%)."]
    return "\n".join(lines)


def format_validation(results, summary) -> str:
    """A Markdown table (also what docs/planner.md shows)."""
    from tensorpilot.plan.validate import by_split, counts

    lines = ["| id | metric | published | predicted | error | note |", "|---|---|---:|---:|---:|---|"]
    for r in results:
        published = "n/a" if r.published is None else f"{r.published:,.4g} {r.unit}"
        pred = "n/a" if r.predicted is None else f"{r.predicted:,.4g}"
        err = "n/a" if r.error is None else f"{100 * r.error:+.1f}%"
        lines.append(f"| {_cell(r.id)} | {_cell(r.metric)} | {_cell(published)} | {pred} | {err} | {_cell(r.note)} |")
    lines += ["", "| kind | rows | median abs error | max abs error |", "|---|---:|---:|---:|"]
    for kind, s in summary.items():
        lines.append(f"| {kind} | {s['rows']} | {100 * s['median_abs_error']:.1f}% | {100 * s['max_abs_error']:.1f}% |")
    n = counts(results)
    lines += ["", f"{n['rows']} rows: {n['predicted']} predicted, {n['not_modelled']} not modelled"
              + (" (the note column says why)." if n["not_modelled"] else ".")]
    splits = by_split(results)
    if splits:                  # the file says which rows tuned the constants and which are held out
        lines += ["", "| split | rows | predicted | median abs error | max abs error |", "|---|---:|---:|---:|---:|"]
        for name, d in splits.items():
            a, c = d["summary"].get("all"), d["counts"]
            med, mx = ("n/a", "n/a") if a is None else (f"{100 * a['median_abs_error']:.1f}%",
                                                        f"{100 * a['max_abs_error']:.1f}%")
            lines.append(f"| {_cell(name)} | {c['rows']} | {c['predicted']} ({c['predicted'] / c['rows']:.0%}) "
                         f"| {med} | {mx} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: a '|' or a line break in a user's CSV would split the row."""
    return " ".join(str(text).split()).replace("|", "\\|")
