"""How well "plan any model" predicts a training step on this CPU, on models tensorpilot did not write.

Each model x precision (fp32, bf16 autocast) x batch size (B, 2B), AdamW, cross-entropy over the
output's last dimension:

  predicted   planner.trace_source (one step on fake tensors) + plan_local(calibrate=False): step
              time from this machine's measured op costs; peak memory = MemTracker's traced peak.
  measured    planner.measure_step: median wall time of 7 real steps after 3 warm-up steps, with freed
              host memory kept for reuse as `tensorpilot train` runs a CPU step; peak =
              bytes live at step start (parameters, buffers, AdamW state, the batch) + the largest
              running sum of the allocator's allocation/free events of one more step, recorded by
              torch.profiler(profile_memory=True) -- the CPU counterpart of CUDA's
              max_memory_allocated. That profiled step also gives each op's time.
  calibrated  leave-one-model-out: per-class factors (compute / memory / host) fitted ONLY on the
              OTHER models' runs, factor_c = clamp(geometric mean of measured_c / predicted_c,
              calibration.BOUNDS[c]), times this model's uncalibrated class times: the error a user
              gets on a model this machine has never run.
  anchored    the model's own measured step at its smaller batch B solves the share of the planner's
              rates this stack reaches (planner.anchor: the kernels', or the host's where the step
              follows the host), which then plans batch 2B: the error a user gets from one measured
              step of their model (`tensorpilot plan --measured-step-s`, then --stack-efficiency).
  peers       peak memory from torch-kitsune's predict_memory and accelerate's estimate-memory
              (benchmarks/plan_peers.py), given the same model builder and batch.

Errors are predicted / measured - 1; rows worse than 30% list the ops with the largest gap
(predicted vs profiled seconds per aten op). The machine is shared: every op replay and step waits
for the CPUs to be idle, a step measured under load is repeated, and the load is recorded. The op
costs go to a fresh cache (--cache to reuse one). Nothing here asserts a speed.

    python benchmarks/plan_any_model.py                      # all models, ~15-30 minutes
    python benchmarks/plan_any_model.py --quick              # 3 small models, one batch size
    python benchmarks/plan_any_model.py --models resnet18,gpt2 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:            # the factories below load as benchmarks.plan_any_model:NAME
    sys.path.insert(0, str(REPO))

import torch                              # noqa: E402
from torch import nn                      # noqa: E402

from benchmarks.user_models import NanoGPT, _torchvision_importable  # noqa: E402

_torchvision_importable()                 # before timm/transformers: the CUDA torchvision wheel fails here

from benchmarks.benchutil import LoadMeter, machine                      # noqa: E402
from benchmarks.plan_peers import accelerate_bytes, kitsune_peak_bytes   # noqa: E402
from tensorpilot.hardware.device import detect                          # noqa: E402
from tensorpilot.modelplan import calibration, costs, planner, sources  # noqa: E402
from tensorpilot.modelplan.predict import class_times, op_class_group   # noqa: E402

SELF = "benchmarks.plan_any_model"
BAD = 0.30                                # rows worse than this are listed and diagnosed


# ------------------------------------------------------------------------ factories (zero-arg)
class T5Ids(nn.Module):                   # T5 needs decoder ids: the same ids on both sides
    def __init__(self, t5: nn.Module):
        super().__init__()
        self.t5 = t5

    def forward(self, ids):
        return self.t5(input_ids=ids, decoder_input_ids=ids).logits


def t5_small() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=32128, d_model=256, d_kv=32, d_ff=1024, num_layers=4, num_decoder_layers=4,
                   num_heads=8, use_cache=False)
    return T5Ids(T5ForConditionalGeneration(cfg))


def nanogpt() -> nn.Module:
    return NanoGPT(vocab_size=256, block_size=256, n_layer=6, n_head=6, n_embd=384)


def torch_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 1000))


# Hugging Face models from config.json files (sources.load("hf:PATH")), no weights downloaded
HF_CONFIGS = {
    "bert": {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 30522, "hidden_size": 256,
             "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024},
    "gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 4, "n_embd": 256, "n_head": 4,
             "vocab_size": 50257, "n_positions": 1024, "use_cache": False},
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4, "hidden_size": 256,
              "intermediate_size": 688, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 32000,
              "max_position_embeddings": 2048, "use_cache": False},
}

# name: (family, source, one sample's input shape (None: the source's own), input dtype, batch sizes,
# int_high for token ids (None: the source's own)). Sizes keep a step under ~1.5 s on 2 cores.
I64 = torch.int64
MODELS = {
    "resnet18": ("timm", "timm:resnet18", (3, 128, 128), None, (16, 32), None),
    "resnet50": ("timm", "timm:resnet50", (3, 128, 128), None, (8, 16), None),
    "convnext_atto": ("timm", "timm:convnext_atto", (3, 128, 128), None, (16, 32), None),
    "efficientnet_b0": ("timm", "timm:efficientnet_b0", (3, 128, 128), None, (8, 16), None),
    "vit_tiny": ("timm", "timm:vit_tiny_patch16_224", None, None, (4, 8), None),
    "bert": ("transformers", "hf:bert", (128,), None, (4, 8), None),
    "gpt2": ("transformers", "hf:gpt2", (128,), None, (4, 8), None),
    "llama": ("transformers", "hf:llama", (128,), None, (4, 8), None),
    "t5": ("transformers", f"{SELF}:t5_small", (128,), I64, (4, 8), 32128),
    "nanogpt": ("nanoGPT-style", f"{SELF}:nanogpt", (256,), I64, (4, 8), 256),
    "torch_mlp": ("plain torch", f"{SELF}:torch_mlp", (1024,), None, (64, 128), None),
    "gpt": ("tensorpilot built-in", "gpt", None, None, (4, 8), None),
    "cnn": ("tensorpilot built-in", "cnn", None, None, (32, 64), None),
}
QUICK = ("torch_mlp", "cnn", "resnet18")


def load_source(name: str, tmp: Path):
    spec = MODELS[name][1]
    if spec.startswith("hf:"):
        path = tmp / spec[3:] / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(HF_CONFIGS[spec[3:]]))
        spec = f"hf:{path}"
    src = sources.load(spec)
    if MODELS[name][5]:
        src.int_high = MODELS[name][5]
    return src


# ------------------------------------------------------------------------------------- one config
QUIET, MAX_WAIT_S, TRIES = 0.15, 900.0, 3


def wait_quiet() -> float:
    """The machine is shared: wait (at most MAX_WAIT_S) until other processes use less than
    QUIET of the CPUs over 2 s, so op replays and steps run on an idle machine. Seconds waited."""
    t0, said = time.perf_counter(), False
    while time.perf_counter() - t0 < MAX_WAIT_S:
        with LoadMeter() as m:
            time.sleep(2.0)
        if m.result.foreign is not None and m.result.foreign < QUIET:
            break
        if not said and time.perf_counter() - t0 > 30:
            print(f"  waiting for the CPUs: other processes use {m.result.foreign:.0%} of them", flush=True)
            said = True
    return time.perf_counter() - t0


def _err(pred, meas):
    return None if pred is None or not meas else pred / meas - 1


def _forget(ops) -> None:
    """Drop these ops' replay times from the op-cost cache (they were timed while others loaded the CPUs)."""
    data, sigs = costs._load("cpu"), {o.signature for o in ops}
    data["ops"] = {k: v for k, v in data["ops"].items() if k not in sigs}
    costs._save("cpu", data)


def run_config(name: str, tmp: Path, precision: str, batch: int) -> dict:
    family, _, shape, dtype, _, _ = MODELS[name]
    kw = dict(batch_size=batch, precision=precision, optimizer="adamw")
    waited = 0.0
    for _ in range(TRIES):               # plan_local replays (and caches) the op shapes it has not timed yet
        waited += wait_quiet()
        # a fresh source each time: trace_step turns a meta-built source model into fake tensors
        # in place, so a second trace of one ModelSource fails
        src = load_source(name, tmp)
        with LoadMeter() as plan_meter:
            trace = planner.trace_source(src, **kw, input_shape=shape, input_dtype=dtype)
            plan = planner.plan_local(trace, src, **kw, calibrate=False)
        if (plan_meter.result.foreign or 0.0) < QUIET:
            break
        _forget(trace.ops)
    # the same costs plan_local used (cached per machine: this call measures nothing new)
    dc = costs.local_costs(detect("cpu"), trace.ops)
    raw = class_times(trace, dc)
    known = {"aten::" + o.op.split(".")[1]: op_class_group(o.op_class) for o in trace.ops}
    best = None
    for _ in range(TRIES):               # a step measured while others loaded the CPUs is measured again
        gc.collect()
        waited += wait_quiet()
        with LoadMeter() as meter:
            m = planner.measure_step(src, **kw, input_shape=shape, input_dtype=dtype, known=set(known),
                                     steps=7, warmup=3)
        load = meter.result.foreign if meter.result.foreign is not None else 0.0
        if best is None or load < best[1]:
            best = (m, load)
        if load < QUIET:
            break
    m, load = best
    meas = calibration.measured_classes(m["op_self_s"], known, m["step_time_s"])

    # peers: the real builder, a real batch of the same shape, CE targets shaped like the loss's
    shape_, dtype_ = shape or src.sample_shape, dtype or src.sample_dtype
    x, _ = sources.batch_maker(shape_, dtype_, batch, src.int_high)()
    y = torch.zeros(trace.output_shape[:-1], dtype=torch.int64)
    build = src.build or src.real_model
    kit = kitsune_peak_bytes(build, x, y, sources.Loss("ce"), precision=precision, optimizer="adamw", batch_size=batch)
    acc = accelerate_bytes(build, precision=precision, optimizer="adamw")

    # per-op: predicted seconds (uncalibrated) vs the profiled step's, by aten op name
    pred_ops, meas_ops = defaultdict(float), defaultdict(float)
    for o in trace.ops:
        pred_ops["aten::" + o.op.split(".")[1]] += dc.op_time_s(o)
    for op, s in m["op_self_s"]:
        meas_ops[op] += s
    gap = sorted(set(pred_ops) | set(meas_ops), key=lambda k: -abs(pred_ops[k] - meas_ops[k]))[:8]
    mem_pred, mem_meas = plan.memory_bytes["total"], m["peak_bytes"]
    return {
        "model": name, "family": family, "source": src.name, "precision": precision, "batch": batch,
        "input_shape": list(shape_), "params": trace.params, "flops": trace.flops, "n_ops": len(trace.ops),
        "pred_step_s": plan.step_time_s, "meas_step_s": m["step_time_s"], "meas_times_s": m["times_s"],
        "step_err": _err(plan.step_time_s, m["step_time_s"]),
        "pred_classes_s": raw, "meas_classes_s": meas, "plan_breakdown_s": plan.time_breakdown_s,
        "pred_mem": mem_pred, "meas_mem": mem_meas, "mem_err": _err(mem_pred, mem_meas),
        "pred_mem_parts": plan.memory_bytes, "peak_method": m["peak_method"],
        "kitsune_mem": kit["bytes"], "kitsune_err": _err(kit["bytes"], mem_meas), "kitsune_note": kit["note"],
        "accelerate_mem": acc["bytes"], "accelerate_err": _err(acc["bytes"], mem_meas),
        "accelerate_note": acc["note"],
        "unrecorded_op_s": sum(s for op, s in m["op_self_s"] if op not in known),
        "op_gap": [{"op": k, "pred_s": pred_ops[k], "meas_s": meas_ops[k]} for k in gap],
        "foreign_load": load, "plan_foreign_load": plan_meter.result.foreign, "plan_s": plan_meter.result.seconds,
        "waited_s": waited,
    }


# ------------------------------------------------------------------------ leave-one-model-out
def fit(rows: list[dict]) -> dict[str, float]:
    """Per class: clamped geometric mean of measured / predicted over ``rows`` (a class measured
    as 0 s -- host time is wall time less the profiled ops, which can come out negative -- is skipped)."""
    out = {}
    for c in calibration.CLASSES:
        logs = [math.log(r["meas_classes_s"][c] / r["pred_classes_s"][c]) for r in rows
                if r["pred_classes_s"][c] > 0 and r["meas_classes_s"][c] > 0]
        out[c] = calibration.clamp(c, math.exp(statistics.fmean(logs))) if logs else 1.0
    return out


def add_loo(rows: list[dict]) -> None:
    ok = [r for r in rows if "error" not in r]
    for r in ok:
        others = [o for o in ok if o["model"] != r["model"]]      # never the model being predicted
        f = fit(others) if others else None
        r["loo_factors"] = f
        r["cal_step_s"] = sum(f[c] * r["pred_classes_s"][c] for c in f) if f else None
        r["cal_err"] = _err(r["cal_step_s"], r["meas_step_s"])


def _classes_step(pred: dict, stack_efficiency: float = 1.0, host_efficiency: float = 1.0) -> float:
    """A CPU step (the host does not overlap the ops) from its uncalibrated class seconds, at a
    stack's share of the op rates and of the host's: modelplan.predict.predict_step's sum."""
    return (pred["compute"] + pred["memory"]) / stack_efficiency + pred["host"] / host_efficiency


def add_anchored(rows: list[dict]) -> None:
    """Each row at the larger batch, planned at the share its model's smaller-batch step measured."""
    from types import SimpleNamespace

    ok = [r for r in rows if "error" not in r]
    for r in ok:
        smaller = [a for a in ok if a["model"] == r["model"] and a["precision"] == r["precision"]
                   and a["batch"] < r["batch"]]
        if not smaller:
            continue
        a = max(smaller, key=lambda x: x["batch"])

        def make(stack_efficiency=1.0, host_efficiency=1.0, pred=a["pred_classes_s"]):
            return SimpleNamespace(step_time_s=_classes_step(pred, stack_efficiency, host_efficiency), anchor=None)
        _, found = planner.anchor(make, a["meas_step_s"])
        r["anchor"] = {"from_batch": a["batch"], "part": found.part, "efficiency": found.efficiency,
                       "reached": found.reached}
        r["anc_step_s"] = _classes_step(r["pred_classes_s"], **{found.part: found.efficiency})
        r["anc_err"] = _err(r["anc_step_s"], r["meas_step_s"])


def stats(errs: list) -> dict:
    a = [abs(e) for e in errs if e is not None]
    return {"n": len(a), "median_abs": statistics.median(a) if a else None, "max_abs": max(a, default=None),
            "worse_than_30pct": sum(e > BAD for e in a)}


def _bad(r: dict) -> list[str]:
    return [k for k in ("step_err", "cal_err", "mem_err") if r.get(k) is not None and abs(r[k]) > BAD]


def summarize(rows: list[dict]) -> dict:
    ok = [r for r in rows if "error" not in r]
    # quiet: the op replays and the step both ran while other processes used < QUIET of the CPUs
    quiet = [r for r in ok if r["foreign_load"] < QUIET and (r["plan_foreign_load"] or 0) < QUIET]
    groups = {"": ok, "_quiet": quiet, "_fp32": [r for r in ok if r["precision"] == "fp32"],
              "_bf16": [r for r in ok if r["precision"] == "bf16"]}
    s = {"rows": len(rows), "quiet_rows": len(quiet),
         "failed": [f"{r['model']} {r['precision']} b{r['batch']}: {r['error']}" for r in rows if "error" in r]}
    for tag, sub in groups.items():
        s[f"step_uncalibrated{tag}"] = stats([r["step_err"] for r in sub])
        s[f"step_loo_calibrated{tag}"] = stats([r["cal_err"] for r in sub])
        anchored = [r for r in sub if "anc_err" in r]
        s[f"step_anchored_at_half_batch{tag}"] = stats([r["anc_err"] for r in anchored])
        s[f"step_uncalibrated_same_rows{tag}"] = stats([r["step_err"] for r in anchored])
    for tool, key in (("tensorpilot", "mem_err"), ("kitsune", "kitsune_err"), ("accelerate", "accelerate_err")):
        s[f"memory_{tool}"] = stats([r[key] for r in ok])
    s["factors_all_models"] = fit(ok) if ok else None
    s["rows_worse_than_30pct"] = [f"{r['model']} {r['precision']} b{r['batch']}: "
                                  + ", ".join(f"{k} {r[k]:+.0%}" for k in _bad(r)) for r in ok if _bad(r)]
    return s


# ------------------------------------------------------------------------------------ output
def _pct(e):
    return "n/a" if e is None else f"{e:+.0%}"


def _mib(b):
    return "n/a" if b is None else f"{b / 2**20:,.0f}"


def markdown(data: dict) -> str:
    mach, s = data["machine"], data["summary"]
    out = [f"# plan any model: predicted vs measured, {mach['cpu']} ({mach['logical_cpus']} CPUs, torch {mach['torch']})",
           "", f"`{data['command']}`, {data['finished']}. AdamW, cross-entropy. Step: median of 7 real steps (after 3 warm-up) "
           "(flush-to-zero on); peak: live bytes at step start + allocator peak of a profiled step; cal: leave-one-"
           "model-out factors; anc: planned at the share of the planner's rates the model's own smaller-batch step "
           "measured (planner.anchor). Error = predicted / measured - 1. load: others' share of the CPUs while measuring.", "",
           "| model | family | prec | batch | pred ms | cal ms | meas ms | err | cal err | anc err | pred MiB | meas MiB "
           "| err | kitsune MiB | err | accelerate MiB | err | load |", "|" + "---|" * 18]
    for r in data["rows"]:
        head = f"| {r['model']} | {r['family']} | {r['precision']} | {r['batch']} |"
        if "error" in r:
            out.append(f"{head} failed: {r['error'][:100]} |" + " |" * 13)
            continue
        cal = "n/a" if r["cal_step_s"] is None else f"{r['cal_step_s'] * 1e3:,.0f}"
        out.append(f"{head} {r['pred_step_s'] * 1e3:,.0f} | {cal} | {r['meas_step_s'] * 1e3:,.0f} | "
                   f"{_pct(r['step_err'])} | {_pct(r['cal_err'])} | {_pct(r.get('anc_err'))} | "
                   f"{_mib(r['pred_mem'])} | {_mib(r['meas_mem'])} | "
                   f"{_pct(r['mem_err'])} | {_mib(r['kitsune_mem'])} | {_pct(r['kitsune_err'])} | "
                   f"{_mib(r['accelerate_mem'])} | {_pct(r['accelerate_err'])} | {r['foreign_load']:.0%} |")
    out += ["", "| abs. error | rows | median | max | rows > 30% |", "|---|---|---|---|---|"]
    for k, v in s.items():
        if isinstance(v, dict) and "n" in v:
            med, mx = ("n/a", "n/a") if not v["n"] else (f"{v['median_abs']:.0%}", f"{v['max_abs']:.0%}")
            out.append(f"| {k} | {v['n']} | {med} | {mx} | {v['worse_than_30pct']} |")
    if s["factors_all_models"]:
        out += ["", "Factors fitted on all models (reference only; each row's cal uses the other models' runs): "
                + ", ".join(f"{k} x{v:.2f}" for k, v in s["factors_all_models"].items())]
    bad = [r for r in data["rows"] if "error" not in r and _bad(r)]
    if bad or s["failed"]:
        out += ["", "## Rows worse than 30%: the ops with the largest predicted - measured gap", ""]
        for r in bad:
            gaps = "; ".join(f"{g['op'][6:]} {g['pred_s'] * 1e3:.1f} vs {g['meas_s'] * 1e3:.1f} ms"
                             for g in r["op_gap"][:4])
            out.append(f"- {r['model']} {r['precision']} b{r['batch']} ({', '.join(f'{k} {r[k]:+.0%}' for k in _bad(r))}):"
                       f" {gaps}")
        out += [f"- failed: {t}" for t in s["failed"]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help=f"comma-separated subset of {', '.join(MODELS)}")
    ap.add_argument("--quick", action="store_true", help=f"smoke run: {', '.join(QUICK)}, first batch size only")
    ap.add_argument("--out", default=str(HERE / "results" / "plan_any_model.json"),
                    help="JSON path (the Markdown table goes beside it, .md)")
    ap.add_argument("--cache", help="op-cost cache directory (default: a fresh temporary one, so every op shape is "
                    "timed by this run on an idle machine; a long-lived cache may hold costs timed under load)")
    ap.add_argument("--keep-denormals", action="store_true", help="measure without flush-to-zero")
    args = ap.parse_args(argv)
    # Subnormal floats: on this x86 CPU a few early AdamW steps of some models (the MLP: steps 4-7,
    # 20x slower) run on denormal gradients / optimizer state, a transient of the training state no
    # shape-based cost model can predict, which swings a median of 5 steps by 2-10x. The planner's
    # replays run on normal random data, so the steps are measured with flush-to-zero too.
    torch.set_flush_denormal(not args.keep_denormals)
    names = args.models.split(",") if args.models else list(QUICK if args.quick else MODELS)
    if [n for n in names if n not in MODELS]:
        ap.error(f"unknown model in {names}; choose from {', '.join(MODELS)}")
    rows: list[dict] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TENSORPILOT_CACHE"] = args.cache or str(Path(tmp) / "cache")
        for name in names:
            for precision in ("fp32", "bf16"):
                for batch in MODELS[name][4][:1 if args.quick else 2]:
                    t0 = time.perf_counter()
                    try:
                        row = run_config(name, Path(tmp), precision, batch)
                        print(f"{name:16s} {precision} b{batch:<4d} step pred {row['pred_step_s'] * 1e3:7.1f} ms "
                              f"meas {row['meas_step_s'] * 1e3:7.1f} ms ({_pct(row['step_err'])})  mem pred "
                              f"{_mib(row['pred_mem'])} meas {_mib(row['meas_mem'])} MiB ({_pct(row['mem_err'])})  "
                              f"load {row['foreign_load']:.0%} [{time.perf_counter() - t0:.0f} s]", flush=True)
                    except Exception as exc:    # noqa: BLE001 - keep going; the failure is a result
                        traceback.print_exc()
                        row = {"model": name, "family": MODELS[name][0], "precision": precision, "batch": batch,
                               "error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
                    rows.append(row)
                    gc.collect()
    add_loo(rows)
    add_anchored(rows)
    data = {"machine": machine(), "command": " ".join(["python", f"benchmarks/{Path(__file__).name}", *sys.argv[1:]]),
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "wall_s": time.perf_counter() - started, "flush_denormal": not args.keep_denormals, "rows": rows}
    data["summary"] = summarize(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, default=str))
    out.with_suffix(".md").write_text(markdown(data))
    print(markdown(data).split("| abs. error")[1], f"\nwrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
