"""The traced planner against published training steps of Hugging Face models it never saw.

Transformers' model docs and pull requests that added SDPA to a model publish a training table made
with fxmarty's SDPA benchmark script: the checkpoint loaded with ``torch_dtype=float16``, random
token ids, ``model.zero_grad(); loss = model(ids).logits.sum(); loss.backward()`` (forward and
backward, no optimizer step), CUDA-event time per batch and ``torch.cuda.max_memory_allocated``, once
with eager attention and once with SDPA, on one GPU (RTX 2060, RTX 3080 Ti laptop, T4, L40S,
A100). Those rows are in tests/unit/data/published_runs.csv, each with its source and the harness
as read. This plans each with ``tensorpilot plan --hf-config`` (the model traced on fake tensors,
modelplan/: the planner for a user's own model), ``--precision fp16-pure --optim none --loss sum``,
and reports the error beside the formula planner's on the same rows (``plan validate``'s row
prediction, from the rows' shape columns).

    python benchmarks/traced_published.py plan --out traced_published.jsonl [--jobs 2]
    python benchmarks/traced_published.py report traced_published.jsonl

transformers must import (on a machine whose torchvision does not load beside torch, put a
directory on PYTHONPATH whose sitecustomize.py sets ``sys.modules['torchvision'] = None``).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "unit" / "data" / "published_runs.csv"
HARDWARE = ROOT / "tests" / "unit" / "data" / "published_runs_hardware.toml"
METRICS = ("iteration_time", "peak_memory_per_gpu")

# source text -> checkpoint; configs are the Hugging Face hub's config.json of each (the fields
# transformers reads to build the class; dropout as published, the harness trains with model.train())
SOURCES = {
    "transformers docs/source/en/model_doc/gpt2.md": "openai-community/gpt2-large",
    "transformers docs/source/en/model_doc/gpt_neox.md": "EleutherAI/pythia-410m-deduped",
    "transformers docs/source/en/model_doc/biogpt.md": "microsoft/biogpt",
    "transformers docs/source/en/model_doc/distilbert.md": "distilbert-base-uncased",
    "transformers docs/source/en/model_doc/albert.md": "albert/albert-base-v2",
    "transformers pull request #33298": "facebook/opt-350m",
    "transformers pull request #28802": "bert-base-uncased",
    "transformers pull request #37106": "google/electra-base-discriminator",
}
CONFIGS = {
    "openai-community/gpt2-large": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 1280,
                                    "n_layer": 36, "n_head": 20, "vocab_size": 50257, "n_positions": 1024},
    "EleutherAI/pythia-410m-deduped": {
        "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 1024,
        "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096, "vocab_size": 50304,
        "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True,
        "max_position_embeddings": 2048, "tie_word_embeddings": False, "hidden_act": "gelu"},
    "microsoft/biogpt": {
        "model_type": "biogpt", "architectures": ["BioGptForCausalLM"], "hidden_size": 1024,
        "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096, "vocab_size": 42384,
        "max_position_embeddings": 1024, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "scale_embedding": True, "layerdrop": 0.0},
    "distilbert-base-uncased": {
        "model_type": "distilbert", "architectures": ["DistilBertForMaskedLM"], "dim": 768, "n_layers": 6,
        "n_heads": 12, "hidden_dim": 3072, "vocab_size": 30522, "max_position_embeddings": 512,
        "dropout": 0.1, "attention_dropout": 0.1, "activation": "gelu"},
    "albert/albert-base-v2": {
        "model_type": "albert", "architectures": ["AlbertForMaskedLM"], "hidden_size": 768,
        "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "embedding_size": 128,
        "vocab_size": 30000, "max_position_embeddings": 512, "hidden_act": "gelu_new",
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "facebook/opt-350m": {
        "model_type": "opt", "architectures": ["OPTForCausalLM"], "hidden_size": 1024, "num_hidden_layers": 24,
        "num_attention_heads": 16, "ffn_dim": 4096, "vocab_size": 50272, "word_embed_proj_dim": 512,
        "max_position_embeddings": 2048, "do_layer_norm_before": False, "dropout": 0.1,
        "attention_dropout": 0.0, "activation_function": "relu"},
    "bert-base-uncased": {
        "model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
        "max_position_embeddings": 512, "type_vocab_size": 2},
    "google/electra-base-discriminator": {
        "model_type": "electra", "architectures": ["ElectraForMaskedLM"], "hidden_size": 768,
        "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "embedding_size": 768,
        "vocab_size": 30522, "max_position_embeddings": 512},
}
EAGER = re.compile(r"\(eager|eager peak|eager attention|eager - s", re.I)
SDPA = re.compile(r"sdpa", re.I)


def checkpoint(row: dict[str, str]) -> str | None:
    return next((c for s, c in SOURCES.items() if s in row["source"]), None)


def attention(row: dict[str, str]) -> str | None:
    """eager or sdpa, from the row's model label or the opening of its notes (the table's column)."""
    text = row["model"] + " " + row["flops_convention"][:200]
    eager, sdpa = bool(EAGER.search(text)), bool(SDPA.search(text.split(".")[0]))
    return "eager" if eager and not sdpa else "sdpa" if sdpa and not eager else None


def rows() -> list[dict[str, str]]:
    out = []
    for r in csv.DictReader(DATA.open()):
        if r["metric"] in METRICS and r["n_gpus"] == "1" and checkpoint(r) and attention(r):
            out.append(r)
    return out


def run_key(row: dict[str, str]) -> str:
    return f"{checkpoint(row)}|{attention(row)}|{row['gpu']}|{row['micro_batch']}|{row['seq_len']}"


def _parts() -> None:
    """The parts the rows name that the catalog lacks (RTX 2060 8 GB, RTX 3080 Ti laptop)."""
    from tensorpilot.hardware import catalog

    catalog.load_hardware_file(HARDWARE)


def _gpu_key(name: str) -> str:
    """The catalog key of a row's GPU (after _parts())."""
    from tensorpilot.hardware import catalog
    from tensorpilot.plan.validate import GPU_NAMES

    return catalog.get(GPU_NAMES.get(name.lower(), name)).key


def _plan_one(key: str, tmp: Path) -> dict:
    ckpt, attn, gpu, mb, seq = key.split("|")
    cfg = dict(CONFIGS[ckpt], attn_implementation=attn)
    path = tmp / (re.sub(r"\W", "_", key) + ".json")
    path.write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "tensorpilot", "plan", "--hf-config", str(path), "--hardware-file", str(HARDWARE),
           "--gpu", _gpu_key(gpu), "--batch-size", mb, "--input-shape", seq, "--input-dtype", "int64",
           "--precision", "fp16-pure", "--optim", "none", "--loss", "sum", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"key": key, "error": p.stderr.strip().splitlines()[-1][:300] if p.stderr.strip() else "failed"}
    d = json.loads(p.stdout)
    return {"key": key, "step_s": d["step_time_s"], "peak_bytes": d["memory_bytes"]["total"],
            "fits": d["fits"]}


def plan(out: Path, jobs: int) -> None:
    done = set()
    if out.exists():
        done = {json.loads(line)["key"] for line in out.read_text().splitlines() if line.strip()}
    keys = sorted({run_key(r) for r in rows()} - done)
    _parts()
    print(f"{len(keys)} runs to plan ({len(done)} already in {out})", flush=True)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(jobs) as pool, out.open("a") as f:
        for res in pool.map(lambda k: _plan_one(k, Path(tmp)), keys):
            f.write(json.dumps(res) + "\n")
            f.flush()
            print(res, flush=True)


def _formula_error(row: dict[str, str]) -> float | None:
    from tensorpilot.plan.validate import predict_row

    r = predict_row(row)
    return None if r.error is None else r.error


def errors(plans: dict[str, dict]) -> list[dict]:
    """Per row: traced and formula errors (planned / published - 1), time and memory alike."""
    from tensorpilot.plan.validate import UNITS

    _parts()
    out = []
    for r in rows():
        p = plans.get(run_key(r))
        if not p or "error" in p:
            continue
        published = float(r["value"]) * UNITS[r["unit"]]
        planned = p["step_s"] if r["metric"] == "iteration_time" else p["peak_bytes"]
        out.append({"id": r["id"], "key": run_key(r), "metric": r["metric"], "checkpoint": checkpoint(r),
                    "attention": attention(r), "gpu": r["gpu"], "traced": planned / published - 1,
                    "formula": _formula_error(r)})
    return out


def _summary(errs: list[float]) -> str:
    if not errs:
        return "-"
    med = statistics.median(abs(e) for e in errs)
    within = sum(abs(e) <= 0.10 for e in errs) / len(errs)
    return f"{med:.1%} ({statistics.median(errs):+.1%}), {within:.0%} within 10%"


def report(path: Path) -> None:
    plans = {}
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            plans[d["key"]] = d
    errs = errors(plans)
    failed = [p for p in plans.values() if "error" in p]
    print(f"{len(errs)} rows planned from {len(plans) - len(failed)} runs; {len(failed)} runs not planned")
    for p in failed:
        print(f"  not planned: {p['key']}: {p['error']}")
    print("\n| rows | n | traced: median abs (signed), within 10% | formula planner, same rows |\n|---|---:|---|---|")

    def line(label, sel):
        both = [e for e in sel if e["formula"] is not None]
        print(f"| {label} | {len(sel)} | {_summary([e['traced'] for e in sel])} | "
              f"{_summary([e['formula'] for e in both])} ({len(both)} predicted) |")
    for metric in METRICS:
        line(f"all, {metric}", [e for e in errs if e["metric"] == metric])
    for metric in METRICS:
        for attn in ("eager", "sdpa"):
            line(f"{attn}, {metric}", [e for e in errs if e["metric"] == metric and e["attention"] == attn])
    for ckpt in CONFIGS:
        for metric in METRICS:
            sel = [e for e in errs if e["checkpoint"] == ckpt and e["metric"] == metric]
            if sel:
                line(f"{ckpt} ({sel[0]['gpu']}), {metric}", sel)
    # eager / SDPA time ratios: the part's rates cancel, what the kernels change remains
    by = {(e["key"].replace("|eager|", "|sdpa|"), e["attention"]): e for e in errs if e["metric"] == "iteration_time"}
    pairs = [(e, by[(key, "sdpa")]) for (key, attn), e in by.items() if attn == "eager" and (key, "sdpa") in by]
    print(f"\neager / SDPA step-time ratio, planned over published - 1, {len(pairs)} pairs:")
    for planner in ("traced", "formula"):
        ratios = [(1 + e[planner]) / (1 + s[planner]) - 1 for e, s in pairs
                  if e[planner] is not None and s[planner] is not None]
        print(f"- {planner}: {_summary(ratios)} ({len(ratios)} pairs)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--jobs", type=int, default=2)
    r = sub.add_parser("report")
    r.add_argument("planned", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "plan":
        plan(a.out, a.jobs)
    else:
        report(a.planned)


if __name__ == "__main__":
    main()
