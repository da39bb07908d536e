"""Planned before running vs measured: one training step of models tensorpilot did not write, eager
and under torch.compile, on one GPU.

Two halves, run on different machines:

    python benchmarks/compiled_steps.py plan --gpu h100-sxm --out benchmarks/results/compiled_planned_c.json
        # here, before any GPU run (compiled_planned.json: the second lease's, before its GPU autocast
        # lists and second norm pass): `tensorpilot plan --kernels eager|fused` of each model (the traced
        # planner; fused = its step under torch.compile, modelplan/fusion.py). Commit the file first.
    python benchmarks/compiled_steps.py measure --out measured.json [--models vit_base,...]
        # on the GPU: a plain PyTorch loop per model (bf16 autocast, cross-entropy, gradients clipped
        # to norm 1 with foreach, fused AdamW -- the step `tensorpilot plan` traces), eager, then
        # torch.compile(model) in the same process; median step of the timed steps, each step
        # synchronised, and torch.cuda.max_memory_allocated
    python benchmarks/compiled_steps.py report --planned P.json --measured M.json

Each model runs in its own process with a time limit, so one that fails or hangs costs only itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (user_models factory, one sample's input shape, input dtype, batch size)
MODELS = {
    "vit_base": ("vit_base_gpu", "3,224,224", "float32", 64),
    "resnet50": ("resnet50_gpu", "3,224,224", "float32", 64),
    "convnext_tiny": ("convnext_tiny_gpu", "3,224,224", "float32", 64),
    "hf_gpt2": ("hf_gpt2_gpu", "1024", "int64", 16),
    "nanogpt": ("nanogpt_gpu", "1024", "int64", 16),
    "hf_llama": ("hf_llama_gpu", "1024", "int64", 16),
    # added for the third lease, planned (benchmarks/results/compiled_planned_c.json) before any GPU ran them
    "efficientnet_b0": ("efficientnet_b0_gpu", "3,224,224", "float32", 128),
    "mobilenetv3": ("mobilenetv3_gpu", "3,224,224", "float32", 128),
    "swin_tiny": ("swin_tiny_gpu", "3,224,224", "float32", 64),
    "hf_bert": ("hf_bert_gpu", "512", "int64", 32),
    "hf_pythia": ("hf_pythia_gpu", "1024", "int64", 16),
}
KERNELS = {"eager": "eager", "compiled": "fused"}


def plan(args) -> int:
    out = {"gpu": args.gpu, "precision": "bf16", "planned_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "command": "tensorpilot plan --model user_models:FACTORY --input-shape S --input-dtype D --batch-size B "
                      f"--precision bf16 --gpu {args.gpu} --kernels eager|fused --json (run from benchmarks/)",
           "models": {}}
    for name in (args.models.split(",") if args.models else MODELS):
        factory, shape, dtype, batch = MODELS[name]
        row = {"factory": factory, "input_shape": shape, "input_dtype": dtype, "batch_size": batch}
        for mode, kernels in KERNELS.items():
            cmd = [sys.executable, "-m", "tensorpilot", "plan", "--model", f"user_models:{factory}", "--input-shape",
                   shape, "--input-dtype", dtype, "--batch-size", str(batch), "--precision", "bf16", "--gpu", args.gpu,
                   "--kernels", kernels, "--json"]
            res = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=900)
            if res.returncode:
                row[mode] = {"error": res.stderr.strip().splitlines()[-1:]}
                continue
            p = json.loads(res.stdout)
            row[mode] = {"step_s": p["step_time_s"], "memory_bytes": p["memory_bytes"]["total"],
                         "breakdown_s": p["time_breakdown_s"], "params": p["params"]}
        print(name, {m: round(row[m].get("step_s", float("nan")) * 1e3, 2) for m in KERNELS}, flush=True)
        out["models"][name] = row
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def make_step(name: str, compiled: bool = False, device: str = "cuda", batch: int = 0):
    """(step, batch size): one training step of model ``name`` as `tensorpilot plan` traces it --
    bf16 autocast, cross-entropy, gradients clipped to norm 1 with foreach, fused AdamW; the model
    under torch.compile when ``compiled``."""
    import torch

    sys.path.insert(0, str(HERE))
    import user_models
    from tensorpilot.modelplan.sources import Loss

    factory, shape, dtype, default_batch = MODELS[name]
    batch = batch or default_batch
    torch.manual_seed(0)
    model = getattr(user_models, factory)().to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    loss_fn = Loss("ce")
    dims = tuple(int(d) for d in shape.split(","))
    if dtype == "int64":
        x = torch.randint(0, 256, (batch, *dims), device=device)
    else:
        x = torch.randn((batch, *dims), device=device)
    fwd = torch.compile(model) if compiled else model

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            out = fwd(x)
            out = out if isinstance(out, torch.Tensor) else getattr(out, "logits", out)
            loss = loss_fn(out, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, batch


def _loop(name: str, compiled: bool, steps: int, warmup: int, device: str = "cuda", batch: int = 0) -> dict:
    """One model, one mode, in this process: the median of ``steps`` timed steps after ``warmup``."""
    import torch

    step, batch = make_step(name, compiled, device, batch)
    cuda = device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    sync()
    first_s = time.perf_counter() - t0
    for _ in range(warmup):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    return {"step_s": statistics.median(times), "min_step_s": min(times), "first_step_s": first_s,
            "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None, "steps": steps, "batch_size": batch}


def measure(args) -> int:
    import torch

    device = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    out = {"device": device, "torch": torch.__version__, "models": {}}
    names = args.models.split(",") if args.models else list(MODELS)
    for name in names:
        row = {}
        for mode in ("eager", "compiled"):
            cmd = [sys.executable, __file__, "_one", name, mode, str(args.steps), args.device, str(args.batch)]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.limit_s)
                lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
                row[mode] = json.loads(lines[-1]) if res.returncode == 0 and lines else \
                    {"error": (res.stderr.strip().splitlines() or ["exit %d" % res.returncode])[-1][:300]}
            except subprocess.TimeoutExpired:
                row[mode] = {"error": f"over {args.limit_s} s"}
            print(name, mode, row[mode], flush=True)
        out["models"][name] = row
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def report(args) -> int:
    planned = json.loads(Path(args.planned).read_text())["models"]
    measured = json.loads(Path(args.measured).read_text())
    print(f"measured on {measured['device']}, torch {measured['torch']}")
    print("| model | batch | eager planned | eager measured | error | compiled planned | compiled measured | error "
          "| gain planned | gain measured | peak memory planned / measured (eager) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, m in measured["models"].items():
        p = planned.get(name)
        if not p:
            continue
        cells = [name, str(p["batch_size"])]
        got = {}
        for mode in ("eager", "compiled"):
            pl, me = p[mode].get("step_s"), m.get(mode, {}).get("step_s")
            got[mode] = (pl, me)
            cells += [f"{pl * 1e3:.1f} ms" if pl else "-",
                      f"{me * 1e3:.1f} ms" if me else m.get(mode, {}).get("error", "-"),
                      f"{(pl / me - 1) * 100:+.0f}%" if pl and me else "-"]
        (pe, me_), (pc, mc) = got["eager"], got["compiled"]
        cells += [f"{pe / pc:.2f}x" if pe and pc else "-", f"{me_ / mc:.2f}x" if me_ and mc else "-"]
        mem_p, mem_m = p["eager"].get("memory_bytes"), m.get("eager", {}).get("peak_bytes")
        cells.append(f"{mem_p / 2**20:,.0f} / {mem_m / 2**20:,.0f} MiB ({(mem_p / mem_m - 1) * 100:+.0f}%)"
                     if mem_p and mem_m else "-")
        print("| " + " | ".join(cells) + " |")
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_one":
        name, mode, steps, device, batch = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
        print(json.dumps(_loop(name, mode == "compiled", steps, warmup=3, device=device, batch=batch)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--gpu", default="h100-sxm")
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="")
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--models", default="")
    m.add_argument("--steps", type=int, default=20)
    m.add_argument("--limit-s", type=int, default=150)
    m.add_argument("--device", default="cuda", help="cpu: a smoke test of the loop (with a small --batch)")
    m.add_argument("--batch", type=int, default=0, help="override each model's batch size (smoke tests)")
    r = sub.add_parser("report")
    r.add_argument("--planned", required=True)
    r.add_argument("--measured", required=True)
    args = ap.parse_args()
    return {"plan": plan, "measure": measure, "report": report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
