"""``tensorpilot plan validate FILE.csv``: predict published measurements and report the error.

Rows follow the columns of the project's reference file (id, model, params_b, hidden, layers,
heads, vocab, ffn_hidden, kv_heads, gpu, n_gpus, tp, pp, dp, seq_len, global_batch, micro_batch,
precision, recompute, sharding, metric, value, unit, flops_convention, source).

How a row becomes a prediction, with every rule stated (none is per row):
- shapes come from the row; the family (from the model name) sets what the columns lack:
  Llama: SwiGLU, no biases/dropout, untied; MPT: no biases/dropout, tied; BERT: encoder with
  dropout and a classification head; otherwise GPT/Megatron: GeLU, biases, dropout 0.1, learned
  positions. A row with only params_b supports the memory metrics that need nothing else.
- the attention kernel follows the software the source used: Megatron-LM papers of 2021-22 and
  the Hugging Face BERT guide materialise the s x s scores; llm-foundry and torchtitan use flash.
- precision: 'fp16 mixed' -> half weights + fp32 master (Megatron, DeepSpeed); 'amp' / HF
  'mixed adamw' -> torch.autocast; 'bf16' (torchtitan FSDP2 mixed precision) -> autocast-like.
- units: GB = 1e9 bytes (papers' arithmetic); MB = MiB, 2^20 bytes (what nvidia-smi, PyTorch
  and accelerate print under that name).
- a blank micro_batch is 1; 'interleaved pipeline (N chunks)' in flops_convention selects the
  interleaved schedule.
"""

from __future__ import annotations

import csv
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from tensorpilot.errors import ConfigError
from tensorpilot.plan import memory as mem
from tensorpilot.plan.models import ModelSpec

__all__ = ["RowResult", "load_rows", "summarize", "validate_rows", "validate_file"]

# metric -> kind reported in the summary
METRIC_KINDS = {
    "achieved_tflops_per_gpu": "throughput", "tokens_per_s_per_gpu": "throughput",
    "iteration_time": "step_time", "model_state_memory_per_gpu": "memory",
    "activation_memory_per_gpu": "memory", "nvidia_smi_memory": "memory", "weights_memory": "memory",
}
UNITS = {"GB": 1e9, "MB": 2**20, "s": 1.0, "TFLOP/s/GPU": 1e12, "tokens/s/GPU": 1.0}
# the reference file's GPU names -> catalog keys (SXM boards: DGX/HGX systems)
GPU_NAMES = {"a100-80gb": "a100-sxm4-80gb", "h100-80gb": "h100-sxm", "a100-40gb": "a100-sxm4-40gb",
             # the 16 GB V100 is not in the catalog; its rates equal the 32 GB part's, and the rows
             # that use it are memory measurements, which do not depend on capacity
             "v100-16gb": "v100-sxm2-32gb", "v100-32gb": "v100-sxm2-32gb", "any": "h100-sxm"}
_FLASH_SOURCES = ("llm-foundry", "torchtitan")
_PRECISIONS = [("fp16 mixed adamw", "fp16-amp"), ("bf16 amp", "bf16-amp"), ("bf16 pure", "bf16-pure"),
               ("fp16 mixed", "fp16"), ("bf16 mixed", "bf16"), ("fp32", "fp32"), ("bf16", "bf16-amp"),
               ("fp16", "fp16")]
_SHARDINGS = {"none": "none", "": "none", "ddp (no sharding)": "none", "zero-1": "zero1", "zero-2": "zero2",
              "zero-3": "zero3", "fsdp-full": "zero3", "fsdp2": "zero3", "fsdp": "zero3"}


@dataclass(slots=True)
class RowResult:
    id: str
    metric: str
    kind: str
    published: float
    predicted: float | None
    unit: str
    note: str = ""

    @property
    def error(self) -> float | None:
        """Signed relative error, (predicted - published) / published."""
        return None if self.predicted is None else (self.predicted - self.published) / self.published

    def to_dict(self) -> dict:
        return {"id": self.id, "metric": self.metric, "kind": self.kind, "published": self.published,
                "predicted": self.predicted, "unit": self.unit, "error_pct":
                None if self.error is None else 100 * self.error, "note": self.note}


def load_rows(path: str | Path) -> list[dict[str, str]]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"validation file {str(p)!r} does not exist.")
    with p.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    needed = {"id", "metric", "value", "unit", "params_b", "n_gpus"}
    if not rows or needed - set(rows[0]):
        raise ConfigError(f"{str(p)!r} is not a published-runs CSV (needs columns {', '.join(sorted(needed))}).")
    return rows


def _int(row, key, default=0):
    v = (row.get(key) or "").strip()
    return int(float(v)) if v else default


def _spec(row) -> ModelSpec | None:
    if not (row.get("hidden") or "").strip():
        return None
    name = row["model"].lower()
    h, f = _int(row, "hidden"), _int(row, "ffn_hidden")
    shape = dict(name=row["model"], hidden=h, layers=_int(row, "layers"), heads=_int(row, "heads"),
                 vocab=_int(row, "vocab"), ffn_hidden=f or 4 * h, kv_heads=_int(row, "kv_heads"))
    if "llama" in name:
        return ModelSpec(**shape, mlp="swiglu")
    if "mpt" in name:
        return ModelSpec(**shape, tied_embeddings=True)
    if "bert" in name:
        return ModelSpec(**shape, tied_embeddings=True, learned_positions=514, bias=True, dropout=True,
                         causal=False, lm_head=False, extra_params=h * h + h)
    return ModelSpec(**shape, learned_positions=_int(row, "seq_len", 2048), bias=True, dropout=True)


def _precision(text: str) -> str:
    t = text.lower()
    for needle, name in _PRECISIONS:
        if needle in t:
            return name
    raise ConfigError(f"unknown precision {text!r} in validation row.")


def _layout_setup(row, spec: ModelSpec):
    from tensorpilot.plan.predict import Layout, TrainSetup

    rec = (row.get("recompute") or "none").strip().lower() or "none"
    sp = "sequence-parallel" in rec
    rec = rec.split("+")[0]
    conv = (row.get("flops_convention") or "").lower()
    m = re.search(r"interleaved pipeline \((\d+) chunks\)", conv)
    tp, pp, dp = _int(row, "tp", 1), _int(row, "pp", 1), _int(row, "dp", 1)
    layout = Layout(tp=tp, pp=pp, dp=dp, sharding=_SHARDINGS[(row.get("sharding") or "").strip().lower()],
                    sequence_parallel=sp and tp > 1, micro_batch=_int(row, "micro_batch", 1),
                    schedule="interleaved" if m else "1f1b", virtual_stages=int(m.group(1)) if m else 1,
                    recompute=rec)
    source = row.get("source", "")
    flash = any(s in source for s in _FLASH_SOURCES)
    prec = _precision(row.get("precision", ""))
    opt = "adam"
    setup = TrainSetup(seq_len=_int(row, "seq_len", spec.max_seq_len if spec else 2048),
                       global_batch=_int(row, "global_batch", 1), precision=prec, optimizer=opt,
                       attention="flash" if flash else "materialized")
    return layout, setup


def predict_row(row: dict[str, str]) -> RowResult:
    from tensorpilot.hardware import catalog
    from tensorpilot.plan.predict import predict

    metric = row["metric"].strip()
    unit = row["unit"].strip()
    kind = METRIC_KINDS.get(metric, "other")
    published = float(row["value"])
    result = RowResult(row["id"], metric, kind, published, None, unit)
    if metric not in METRIC_KINDS or unit not in UNITS:
        result.note = f"metric {metric!r} / unit {unit!r} not modelled"
        return result
    scale = UNITS[unit]
    spec = _spec(row)
    n_params = float(row["params_b"]) * 1e9
    prec_name = _precision(row.get("precision", ""))
    if metric == "weights_memory":
        dtype = mem.precision(prec_name).compute
        n = spec.n_params if spec else n_params
        result.predicted = mem.weights_bytes(n, "fp32" if dtype == "tf32" else dtype) / scale
        return result
    if metric == "model_state_memory_per_gpu" and spec is None:
        layout_sh = _SHARDINGS[(row.get("sharding") or "").strip().lower()]
        from tensorpilot.plan.predict import SHARDINGS

        states = mem.model_state_bytes(n_params, mem.precision(prec_name), zero_stage=SHARDINGS[layout_sh],
                                       dp=_int(row, "dp", 1))
        result.predicted = sum(states.values()) / scale
        return result
    if spec is None:
        result.note = "row has no model shape"
        return result
    layout, setup = _layout_setup(row, spec)
    gpu = (row.get("gpu") or "any").strip()
    acc = catalog.get(GPU_NAMES.get(gpu.lower(), gpu))
    plan = predict(spec, acc, layout, setup)
    if layout.n_devices != _int(row, "n_gpus", layout.n_devices):
        result.note = f"tp x pp x dp = {layout.n_devices} != n_gpus"
    if metric == "achieved_tflops_per_gpu":
        result.predicted = plan.hardware_flops_per_step / plan.step_time_s / plan.n_devices / scale
    elif metric == "tokens_per_s_per_gpu":
        result.predicted = plan.tokens_per_s_per_device / scale
    elif metric == "iteration_time":
        result.predicted = plan.step_time_s / scale
    elif metric == "model_state_memory_per_gpu":
        result.predicted = sum(plan.memory_bytes[k] for k in ("params", "grads", "master_params", "optimizer")) / scale
    elif metric == "activation_memory_per_gpu":
        result.predicted = plan.memory_bytes["activations"] / scale
    elif metric == "nvidia_smi_memory":
        result.predicted = plan.memory_bytes["total"] / scale
    if "uncertain" in (row.get("flops_convention") or ""):
        result.note = "published value marked uncertain"
    return result


def validate_rows(rows: list[dict[str, str]]) -> list[RowResult]:
    return [predict_row(r) for r in rows]


def summarize(results: list[RowResult]) -> dict[str, dict[str, float]]:
    """Median and max absolute relative error (fractions) and row count, per metric kind."""
    kinds: dict[str, list[float]] = {}
    for r in results:
        if r.error is not None:
            kinds.setdefault(r.kind, []).append(abs(r.error))
    return {k: {"median_abs_error": statistics.median(v), "max_abs_error": max(v), "rows": len(v)}
            for k, v in sorted(kinds.items())}


def validate_file(path: str | Path) -> tuple[list[RowResult], dict[str, dict[str, float]]]:
    results = validate_rows(load_rows(path))
    return results, summarize(results)
