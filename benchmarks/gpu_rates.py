"""The formula planner's device rates and its whole-step prediction against one real GPU: GEMMs by
shape, fused attention by sequence length and head width, and training steps of Hugging Face models
built from their published configs (nobody here wrote them), trained the way a user's script does
(fp32 weights under bf16 autocast or pure bf16, fused AdamW, SDPA attention, eager).

    python benchmarks/gpu_rates.py plan --gpu h200-sxm --out planned.json     # any machine, before
    python benchmarks/gpu_rates.py measure --out measured.json --deadline-s 240 # on the GPU
    python benchmarks/gpu_rates.py report planned.json measured.json
    python benchmarks/gpu_rates.py traced --gpu h200-sxm --out traced.json    # any machine
    python benchmarks/gpu_rates.py report planned.json measured.json --traced traced.json

``plan`` records what the planner says before anything runs (commit it before the lease): a GEMM's
time from ``timing.gemm_time_s`` at the part's rates, the fused-attention rate, and each model's
step time and peak memory from ``tensorpilot plan --hf-config`` at both stacks (calibration.STACKS).
``measure`` times the same shapes and steps with CUDA events (torch only; transformers for the
models). ``traced`` plans the same steps the other way, by tracing the model itself (``tensorpilot
plan --hf-config`` with ``--batch-size``: modelplan/, the planner for a user's own model).
``report`` prints measured over planned. The planner's rates include the sustained-load
factor (calibration.SUSTAINED_COMPUTE_FRACTION) that a burst of one kernel does not pay, so the
kernel tables also give the ratio with it taken out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# reduction depth k x output width n of the weight GEMMs of 768- to 8192-wide transformers, at
# m = 16,384 tokens (a micro-batch of 8 x 2048) and 2,048 (a small one)
GEMM_M = (16384, 2048)
GEMM_K = (256, 768, 1024, 2048, 4096, 8192, 16384)
GEMM_N = (1024, 4096, 16384)
# causal attention, 16,384 tokens a call (batch = 16384 / seq), 16 heads
ATTN_SEQ = (1024, 2048, 4096, 8192)
ATTN_HEAD_DIM = (64, 128)
ATTN_HEADS = 16
ATTN_TOKENS = 16384

# Published configs (the Hugging Face hub's config.json of each checkpoint, the fields the planner
# and transformers both read); built with random weights, nothing downloaded.
CONFIGS = {
    "gpt2": {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
             "n_positions": 1024, "architectures": ["GPT2LMHeadModel"]},
    "gpt2-medium": {"model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16, "vocab_size": 50257,
                    "n_positions": 1024, "architectures": ["GPT2LMHeadModel"]},
    "gpt2-large": {"model_type": "gpt2", "n_embd": 1280, "n_layer": 36, "n_head": 20, "vocab_size": 50257,
                   "n_positions": 1024, "architectures": ["GPT2LMHeadModel"]},
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                     "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                     "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": True,
                     "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu",
                     "architectures": ["Qwen2ForCausalLM"]},
    "llama-3.2-1b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
                     "tie_word_embeddings": True, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                     "hidden_act": "silu", "architectures": ["LlamaForCausalLM"]},
    "llama-3.2-3b": {"model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192,
                     "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
                     "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
                     "tie_word_embeddings": True, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                     "hidden_act": "silu", "architectures": ["LlamaForCausalLM"]},
}
# (model, micro-batch, seq, precision): precision as `plan --precision` names it
RUNS = (
    ("gpt2", 8, 1024, "bf16-amp"), ("gpt2", 32, 1024, "bf16-amp"), ("gpt2", 32, 1024, "bf16-pure"),
    ("gpt2-medium", 16, 1024, "bf16-amp"), ("gpt2-large", 8, 1024, "bf16-amp"),
    ("qwen2.5-0.5b", 8, 2048, "bf16-amp"), ("llama-3.2-1b", 4, 2048, "bf16-amp"),
    ("llama-3.2-1b", 8, 2048, "bf16-amp"), ("llama-3.2-1b", 8, 2048, "bf16-pure"),
    ("llama-3.2-3b", 4, 2048, "bf16-amp"),
)


def run_key(model: str, mb: int, seq: int, precision: str) -> str:
    return f"{model} b{mb} s{seq} {precision}"


# ------------------------------------------------------------------------------------ plan
def plan(gpu: str, out: Path) -> None:
    from tensorpilot.hardware import catalog
    from tensorpilot.plan import calibration as cal
    from tensorpilot.plan import timing as tm
    from tensorpilot.plan.predict import device_rates

    acc = catalog.get(gpu)
    rates = device_rates(acc, "bf16")
    gemms = {f"{m}x{k}x{n}": tm.gemm_time_s(m, k, n, rates, 2) for m in GEMM_M for k in GEMM_K for n in GEMM_N}
    attention = {str(d): rates.attention_flops_per_s * cal.flash_head_dim_factor(d) for d in ATTN_HEAD_DIM}
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model, mb, seq, precision in RUNS:
            cfg = Path(tmp) / f"{model}.json"
            cfg.write_text(json.dumps(CONFIGS[model]))
            runs[run_key(model, mb, seq, precision)] = {
                stack: _plan_run(cfg, gpu, mb, seq, precision, stack) for stack in cal.STACKS}
    out.write_text(json.dumps({"gpu": gpu, "sustained": cal.SUSTAINED_COMPUTE_FRACTION, "gemm_s": gemms,
                               "attention_flops_per_s": attention, "runs": runs}, indent=1))
    print(f"wrote {out}")


def _plan_run(cfg: Path, gpu: str, mb: int, seq: int, precision: str, stack: str) -> dict:
    cmd = [sys.executable, "-m", "tensorpilot", "plan", "--hf-config", str(cfg), "--gpu", gpu, "--gpus", "1",
           "--seq-len", str(seq), "--micro-batch", str(mb), "--global-batch", str(mb), "--precision", precision,
           "--optimizer", "adamw", "--optimizer-impl", "fused", "--attention", "flash", "--kernels", "eager",
           "--stack", stack, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    d = json.loads(p.stdout)
    mem = d["memory_bytes"]
    return {"step_s": d["step_time_s"], "peak_bytes": mem["total"] - mem.get("cuda_context", 0),
            "breakdown_s": d["time_breakdown_s"]}


def traced(gpu: str, out: Path) -> None:
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model, mb, seq, precision in RUNS:
            cfg = Path(tmp) / f"{model}.json"
            cfg.write_text(json.dumps(CONFIGS[model]))
            cmd = [sys.executable, "-m", "tensorpilot", "plan", "--hf-config", str(cfg), "--gpu", gpu,
                   "--batch-size", str(mb), "--input-shape", str(seq), "--input-dtype", "int64",
                   "--precision", precision.removesuffix("-amp"), "--optim", "adamw", "--json"]
            d = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
            runs[run_key(model, mb, seq, precision)] = {"step_s": d["step_time_s"],
                                                        "peak_bytes": d["memory_bytes"]["total"]}
            print(run_key(model, mb, seq, precision), runs[run_key(model, mb, seq, precision)], flush=True)
    out.write_text(json.dumps({"gpu": gpu, "runs": runs}, indent=1))
    print(f"wrote {out}")


# --------------------------------------------------------------------------------- measure
def _time_cuda(fn, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` runs, each between two CUDA events, after 3 warm-ups."""
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return sorted(times)[len(times) // 2]


def measure(out: Path, deadline_s: float, models: bool) -> None:
    import torch

    t0 = time.time()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = dev.type == "cpu"           # a dry run of the code path on a CPU, at toy sizes
    res = {"device": torch.cuda.get_device_name(0) if not small else "cpu", "torch": torch.__version__,
           "gemm_s": {}, "attention": {}, "runs": {}}

    def save():
        out.write_text(json.dumps(res, indent=1))

    for m in GEMM_M[:1] if small else GEMM_M:
        for k in GEMM_K:
            for n in GEMM_N:
                if small and (k > 1024 or n > 1024):
                    continue
                a = torch.randn(m if not small else 256, k, device=dev, dtype=torch.bfloat16)
                w = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
                res["gemm_s"][f"{m}x{k}x{n}"] = _time_cuda(lambda: a @ w, 20) if not small else None
    save()
    print(f"gemms done at {time.time() - t0:.0f} s", flush=True)
    F = torch.nn.functional
    for d in ATTN_HEAD_DIM:
        for s in ATTN_SEQ[:1] if small else ATTN_SEQ:
            b = ATTN_TOKENS // s if not small else 1
            q, k, v = (torch.randn(b, ATTN_HEADS, s if not small else 64, d, device=dev, dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            g = torch.randn_like(q)

            def fwd():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                o = fwd()
                torch.autograd.backward(o, g)

            if small:
                fwd_bwd()
                continue
            tf, tfb = _time_cuda(fwd, 10), _time_cuda(fwd_bwd, 10)
            flops_fwd = 2 * 2 * b * ATTN_HEADS * s * s / 2 * d        # QK^T and AV, causal half
            res["attention"][f"{s}x{d}"] = {"fwd_s": tf, "fwd_bwd_s": tfb,
                                             "fwd_flops_per_s": flops_fwd / tf,
                                             "fwd_bwd_flops_per_s": flops_fwd * 3.5 / tfb}
    save()
    print(f"attention done at {time.time() - t0:.0f} s", flush=True)
    if models:
        for model, mb, seq, precision in RUNS:
            if time.time() - t0 > deadline_s:
                print(f"deadline: {run_key(model, mb, seq, precision)} and later skipped", flush=True)
                break
            key = run_key(model, mb, seq, precision)
            try:
                res["runs"][key] = _measure_run(CONFIGS[model], mb, seq, precision, dev, small)
            except Exception as e:            # an OOM or a missing transformers: recorded, the others run
                res["runs"][key] = {"error": f"{type(e).__name__}: {e}"[:300]}
            print(key, res["runs"][key], flush=True)
            save()
    save()


def _training_step(config: dict, mb: int, seq: int, precision: str, dev):
    """A model built from ``config`` (random weights) and one training step of it as a user's loop
    runs it: SDPA attention, the loss inside the model, fused AdamW on a GPU, bf16 autocast over fp32
    weights ("bf16-amp") or bf16 weights ("bf16-pure"). Returns the step function."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    kind = cfg.pop("model_type")
    cfg.pop("architectures")
    built = AutoConfig.for_model(kind, **cfg)
    torch.manual_seed(0)
    with dev:
        net = AutoModelForCausalLM.from_config(built, attn_implementation="sdpa")
    pure = precision == "bf16-pure"
    if pure:
        net = net.to(torch.bfloat16)
    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=dev.type == "cuda")
    ids = torch.randint(0, built.vocab_size, (mb, seq), device=dev)

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=not pure):
            loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _measure_run(config: dict, mb: int, seq: int, precision: str, dev, small: bool) -> dict:
    """Median step of 10 (after warm-ups) and the allocator's peak of one ``_training_step``."""
    import torch

    if small:           # the code path at toy sizes: two blocks, 1 x 64 tokens, one step
        config = {**config, **{k: 2 for k in ("n_layer", "num_hidden_layers") if k in config}}
        _training_step(config, 1, 64, precision, dev)()
        return {"step_s": None}
    step = _training_step(config, mb, seq, precision, dev)
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = _time_cuda(step, 10)
    peak = torch.cuda.max_memory_allocated()
    del step
    torch.cuda.empty_cache()
    return {"step_s": t, "peak_bytes": peak, "tokens_per_s": mb * seq / t}


# -------------------------------------------------------------------------------- diagnose
def diagnose(out: Path) -> None:
    """Where a run's time goes: each SDPA backend on its own (causal, 4 x 4096 tokens, 16 heads of
    128), GPT-2 with and without its default dropout, and the top CUDA-time ops of one profiled step
    of GPT-2 b8 and Llama-3.2-1B b4 (torch.profiler)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "sdpa": {}, "runs": {}, "profiles": {}}
    F = torch.nn.functional
    q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn_like(q)
    flops = 2 * 2 * 4 * 16 * 4096 * 4096 / 2 * 128 * 3.5
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        try:
            with sdpa_kernel(getattr(SDPBackend, name)):
                t = _time_cuda(lambda: torch.autograd.backward(F.scaled_dot_product_attention(
                    q, k, v, is_causal=True), g), 5)
            res["sdpa"][name] = flops / t
        except Exception as e:
            res["sdpa"][name] = f"{type(e).__name__}: {e}"[:200]
    print("sdpa", res["sdpa"], flush=True)
    for model, mb, seq, extra in (("gpt2", 8, 1024, {}), ("gpt2", 8, 1024, {"resid_pdrop": 0.0, "embd_pdrop": 0.0,
                                                                          "attn_pdrop": 0.0})):
        key = f"{model} b{mb} s{seq} " + ("no dropout" if extra else "default")
        res["runs"][key] = _measure_run(dict(CONFIGS[model], **extra), mb, seq, "bf16-amp", torch.device("cuda"), False)
        print(key, res["runs"][key], flush=True)
    for model, mb, seq in (("gpt2", 8, 1024), ("llama-3.2-1b", 4, 2048)):
        res["profiles"][model] = _profile_run(model, mb, seq)
        print(model, "\n" + res["profiles"][model], flush=True)
    out.write_text(json.dumps(res, indent=1))


def _profile_run(model: str, mb: int, seq: int) -> str:
    """The top CUDA-time ops of one profiled bf16-amp step, after three warm-ups."""
    import torch

    step = _training_step(CONFIGS[model], mb, seq, "bf16-amp", torch.device("cuda"))
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                            torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60)
    del step
    torch.cuda.empty_cache()
    return table


# ----------------------------------------------------------------------------------- align
def align(out: Path) -> None:
    """A 16-bit GEMM with a dimension that is not a multiple of 8 elements (16 bytes: GPT-2's
    vocabulary of 50,257) against the same GEMM padded (50,304): the LM head's forward (tokens x
    hidden) @ (hidden x vocab) and its two backward GEMMs, at 8 x 1024 tokens and GPT-2's 768 /
    GPT-2 XL's 1600 hidden; then GPT-2 b8's whole step at both vocabularies. Also small GEMMs run
    20 back to back between one pair of events, against one alone (what an event pair adds)."""
    import torch

    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "gemm_s": {}, "runs": {},
           "back_to_back": {}}
    bf = torch.bfloat16
    for h in (768, 1600):
        for v in (50257, 50304):
            x = torch.randn(8192, h, device="cuda", dtype=bf)
            w = torch.randn(v, h, device="cuda", dtype=bf)          # nn.Linear's (out, in) weight
            dy = torch.randn(8192, v, device="cuda", dtype=bf)
            res["gemm_s"][f"h{h} v{v} forward"] = _time_cuda(lambda: x @ w.t(), 10)
            res["gemm_s"][f"h{h} v{v} input grad"] = _time_cuda(lambda: dy @ w, 10)
            res["gemm_s"][f"h{h} v{v} weight grad"] = _time_cuda(lambda: dy.t() @ x, 10)
    print(res["gemm_s"], flush=True)
    for m, k, n in ((2048, 1024, 1024), (2048, 1024, 4096), (16384, 256, 1024), (16384, 1024, 1024)):
        a = torch.randn(m, k, device="cuda", dtype=bf)
        b = torch.randn(k, n, device="cuda", dtype=bf)

        def twenty():
            for _ in range(20):
                a @ b
        res["back_to_back"][f"{m}x{k}x{n}"] = {"one_s": _time_cuda(lambda: a @ b, 20),
                                               "per_gemm_of_20_s": _time_cuda(twenty, 10) / 20}
    print(res["back_to_back"], flush=True)
    for v in (50257, 50304):
        res["runs"][f"gpt2 b8 s1024 vocab {v}"] = _measure_run(dict(CONFIGS["gpt2"], vocab_size=v), 8, 1024, "bf16-amp",
                                                               torch.device("cuda"), False)
    print(res["runs"], flush=True)
    out.write_text(json.dumps(res, indent=1))


# ---------------------------------------------------------------------------------- report
def report(planned: dict, measured: dict, traced_plans: dict | None = None) -> None:
    sus = planned["sustained"]
    print(f"planned for {planned['gpu']}; measured on {measured['device']} (torch {measured['torch']})\n")
    print("| GEMM m x k x n | measured TFLOP/s | planned TFLOP/s | measured / planned | "
          "measured / planned burst (x sustained) |\n|---|---:|---:|---:|---:|")
    for key, t in measured["gemm_s"].items():
        if t is None or key not in planned["gemm_s"]:
            continue
        m, k, n = map(int, key.split("x"))
        fl = 2 * m * k * n
        tp = planned["gemm_s"][key]
        print(f"| {key} | {fl / t / 1e12:.0f} | {fl / tp / 1e12:.0f} | {tp / t:.2f} | {tp / t * sus:.2f} |")
    print("\n| attention s x head_dim | fwd TFLOP/s | fwd+bwd TFLOP/s | planned fwd+bwd | measured / planned |"
          "\n|---|---:|---:|---:|---:|")
    for key, a in measured["attention"].items():
        d = key.split("x")[1]
        p = planned["attention_flops_per_s"][d]
        print(f"| {key} | {a['fwd_flops_per_s'] / 1e12:.0f} | {a['fwd_bwd_flops_per_s'] / 1e12:.0f} | "
              f"{p / 1e12:.0f} | {a['fwd_bwd_flops_per_s'] / p:.2f} |")
    print("\n| run | measured step | planned typical | error | planned recipe | error | "
          "peak measured | peak planned | error |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key, m in measured["runs"].items():
        if not m.get("step_s"):
            print(f"| {key} | {m.get('error', 'not run')} |||||||")
            continue
        p = planned["runs"][key]
        ty, re_ = p["typical"], p["recipe"]
        print(f"| {key} | {m['step_s'] * 1e3:.1f} ms | {ty['step_s'] * 1e3:.1f} | "
              f"{ty['step_s'] / m['step_s'] - 1:+.0%} | {re_['step_s'] * 1e3:.1f} | "
              f"{re_['step_s'] / m['step_s'] - 1:+.0%} | "
              f"{m['peak_bytes'] / 2**30:.1f} GiB | {ty['peak_bytes'] / 2**30:.1f} | "
              f"{ty['peak_bytes'] / m['peak_bytes'] - 1:+.0%} |")
    if traced_plans is None:
        return
    print("\n| run (traced planner) | measured step | planned | error | peak measured | peak planned | error |"
          "\n|---|---:|---:|---:|---:|---:|---:|")
    for key, t in traced_plans["runs"].items():
        m = measured["runs"].get(key, {})
        if not m.get("step_s"):
            continue
        print(f"| {key} | {m['step_s'] * 1e3:.1f} ms | {t['step_s'] * 1e3:.1f} | {t['step_s'] / m['step_s'] - 1:+.0%} | "
              f"{m['peak_bytes'] / 2**30:.1f} GiB | {t['peak_bytes'] / 2**30:.1f} | "
              f"{t['peak_bytes'] / m['peak_bytes'] - 1:+.0%} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--gpu", default="h200-sxm")
    p.add_argument("--out", type=Path, required=True)
    tr = sub.add_parser("traced")
    tr.add_argument("--gpu", default="h200-sxm")
    tr.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--deadline-s", type=float, default=240, help="start no model run after this many seconds")
    m.add_argument("--no-models", action="store_true")
    dg = sub.add_parser("diagnose")
    dg.add_argument("--out", type=Path, required=True)
    al = sub.add_parser("align")
    al.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("report")
    r.add_argument("planned", type=Path)
    r.add_argument("measured", type=Path)
    r.add_argument("--traced", type=Path, help="traced.json: the traced planner's plans as well")
    a = ap.parse_args(argv)
    if a.cmd == "plan":
        plan(a.gpu, a.out)
    elif a.cmd == "traced":
        traced(a.gpu, a.out)
    elif a.cmd == "measure":
        measure(a.out, a.deadline_s, not a.no_models)
    elif a.cmd == "align":
        align(a.out)
    elif a.cmd == "diagnose":
        diagnose(a.out)
    else:
        report(json.loads(a.planned.read_text()), json.loads(a.measured.read_text()),
               json.loads(a.traced.read_text()) if a.traced else None)


if __name__ == "__main__":
    main()
