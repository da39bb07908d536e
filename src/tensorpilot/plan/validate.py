"""``tensorpilot plan validate FILE.csv``: predict published measurements and report the error.

Rows follow the columns of the project's reference file (id, model, params_b, hidden, layers,
heads, vocab, ffn_hidden, kv_heads, gpu, n_gpus, tp, pp, dp, seq_len, global_batch, micro_batch,
precision, recompute, sharding, metric, value, unit, flops_convention, source; optional: tokens,
optimizer, split).

How a row becomes a prediction, with every rule stated (none is per row):
- shapes come from the row; the family (from the model name) sets what the columns lack:
  Llama: SwiGLU, no biases/dropout, untied; MPT: no biases/dropout, tied; BERT: encoder with
  dropout and a classification head; otherwise GPT/Megatron: GeLU, biases, dropout 0.1, learned
  positions. A row with only params_b supports the memory metrics that need nothing else.
- the attention kernel follows the software the source used: Megatron-LM papers of 2021-22 and
  the Hugging Face BERT guide materialise the s x s scores; llm-foundry and torchtitan use flash;
  notes that say no flash kernel ran ("no flash attention", "flash attention not used") win.
- a TFLOP/s or MFU figure is predicted in the FLOP convention its notes state (flop_convention:
  6 N, causal-halved or full attention, the recomputed forward counted or not).
- the optimizer step is fused (Megatron-LM, NeMo, DeepSpeed, Apex; a fused flag) unless the notes
  say otherwise: a per-tensor loop (foreach=False, HF's adamw_hf, hand-written per-parameter
  updates) or torch.optim's foreach default (adamw_torch, torch.optim.AdamW or Adam named non-fused).
- Megatron-style bf16 and fp8 keep fp32 gradients; NeMo's and Megatron-Bridge's performance
  recipes, and notes that say so (grad_sync_dtype, grad_reduce_in_fp32), reduce them in bf16.
- labels are read generously (layout.normalize_sharding_label, memory.precision_from_label):
  'fp16 mixed' -> half weights + fp32 master (Megatron, DeepSpeed); 'amp' / HF 'mixed adamw' ->
  torch.autocast; 'bf16' (torchtitan FSDP2 mixed precision) -> autocast-like; 'fp8' -> fp8
  GEMMs; 'fsdp(dp)', 'fully sharded', 'zero-3' -> fsdp; 'hsdp' -> fsdp within a node.
- totals (gpu_hours, time_to_train, energy) need the row's training ``tokens`` and include the
  goodput of the row's devices (calibration.goodput) unless the notes say the time adds up training
  steps only; a blank dp is n_gpus / (tp x pp x cp); context parallelism is read from 'cp=N' in
  flops_convention, as DeepSpeed-Ulysses where the notes name it (without a degree and a dp: the
  fastest degree that fits).
- units: GB = 1e9 bytes (papers' arithmetic); MB = MiB, 2^20 bytes (what nvidia-smi, PyTorch
  and accelerate print under that name); GiB = 2^30; % for MFU; GPU-hours, s/min/h/days, kWh/MWh.
- a blank recompute in a stated layout: the fastest that fits (none, selective, full; NeMo's and
  Megatron-Bridge's recipes: full recomputation of the fewest blocks that fit).
- a blank micro_batch is 1 (in a stated layout the fastest that fits; torchtitan pipelines: its
  default of one micro-batch a stage); 'interleaved pipeline (N chunks)', 'virtual pipeline N',
  'VP N' or virtual_pipeline_model_parallel_size N in flops_convention selects the interleaved schedule; a
  pipelined row without a global batch has no bubble to predict (speed metrics: not modelled;
  memory: the smallest batch that fills the pipeline).

A row the planner cannot model (an unknown label, accelerator or metric, no accelerator named, a
malformed number, a size that is zero or negative, a missing column, a layout that cannot run) is
reported with its reason and predicted as n/a; the other rows are predicted all the same. Only a file that is not a published-runs CSV at all
(missing, unreadable, not CSV text, no header or no rows) stops the command.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from tensorpilot.errors import ConfigError, PathError
from tensorpilot.files import existing_path, os_reason
from tensorpilot.layout import SHARDINGS
from tensorpilot.plan import calibration as cal
from tensorpilot.plan import memory as mem
from tensorpilot.plan.models import ModelSpec

__all__ = ["RowResult", "anchored", "by_split", "counts", "load_rows", "predict_row", "summarize", "validate_rows", "validate_file"]

# metric -> kind reported in the summary
METRIC_KINDS = {
    "achieved_tflops_per_gpu": "throughput", "tokens_per_s_per_gpu": "throughput", "mfu": "throughput",
    "iteration_time": "step_time", "model_state_memory_per_gpu": "memory",
    "activation_memory_per_gpu": "memory", "nvidia_smi_memory": "memory", "weights_memory": "memory",
    "peak_memory_per_gpu": "memory", "gpu_hours": "totals", "time_to_train": "totals", "energy": "totals",
}
# metrics that need the row's token budget (column ``tokens``)
TOTALS = ("gpu_hours", "time_to_train", "energy")
UNITS = {"GB": 1e9, "MB": 2**20, "MiB": 2**20, "GiB": 2**30, "TB": 1e12, "s": 1.0, "min": 60.0, "h": 3600.0,
         "days": 86400.0, "TFLOP/s/GPU": 1e12, "TFLOP/s": 1e12, "TFLOPS": 1e12, "tokens/s/GPU": 1.0, "%": 0.01,
         "GPU-hours": 1.0, "kWh": 1.0, "MWh": 1000.0}
# what each unit measures, and what each metric is measured in: a row pairing them otherwise (an
# iteration time in GB) is reported, not scaled into a wrong number. A bare "TFLOP/s" on the
# per-GPU metric is the per-GPU rate the metric's name says.
_UNIT_QUANTITY = {"GB": "bytes", "MB": "bytes", "MiB": "bytes", "GiB": "bytes", "TB": "bytes", "s": "time",
                  "min": "time", "h": "time", "days": "time", "TFLOP/s/GPU": "flops", "TFLOP/s": "flops",
                  "TFLOPS": "flops", "tokens/s/GPU": "tokens", "%": "share", "GPU-hours": "device time",
                  "kWh": "energy", "MWh": "energy"}
_METRIC_QUANTITY = {"achieved_tflops_per_gpu": "flops", "tokens_per_s_per_gpu": "tokens", "mfu": "share",
                    "iteration_time": "time", "time_to_train": "time", "gpu_hours": "device time", "energy": "energy"}
# GPU names papers use without the board form -> catalog keys (training clusters are SXM boards:
# DGX/HGX systems); anything else goes to the catalog's own lookup (keys, aliases, driver names)
GPU_NAMES = {"a100-80gb": "a100-sxm4-80gb", "a100 80gb": "a100-sxm4-80gb", "a100": "a100-sxm4-80gb",
             "h100-80gb": "h100-sxm", "h100 80gb": "h100-sxm", "h100": "h100-sxm",
             "a100-40gb": "a100-sxm4-40gb", "a100 40gb": "a100-sxm4-40gb", "h200": "h200-sxm",
             # the 16 GB V100 is not in the catalog; its rates equal the 32 GB part's, and the rows
             # that use it are memory measurements, which do not depend on capacity
             "v100-16gb": "v100-sxm2-32gb", "v100-32gb": "v100-sxm2-32gb", "v100": "v100-sxm2-32gb"}
# software whose attention is a fused (flash) kernel: llm-foundry, torchtitan, NeMo / Megatron-Core
# (Transformer Engine's fused attention), the Llama 3 stack; the Megatron-LM papers of 2019-22,
# Megatron-DeepSpeed (BLOOM, MT-NLG), metaseq (OPT) and the HF BERT guide materialise the scores
_FLASH_SOURCES = ("llm-foundry", "torchtitan", "nemo", "megatron-bridge", "megatron-core", "llama 3 herd")
# model names whose families use a gated MLP (SwiGLU / GeGLU: gate, up and down matrices)
_GATED_FAMILIES = ("llama", "mistral", "qwen", "gemma", "olmo", "phi-3", "phi-4", "smollm", "internlm", "baichuan")
# frameworks whose published recipes shard optimizer state over dp (Megatron's distributed
# optimizer, use_distributed_optimizer=True) and turn on sequence parallelism with tp > 1
_MEGATRON_RECIPE_SOURCES = ("nemo", "megatron-bridge")
# publishers of a tuned recipe's performance tables (calibration.TYPICAL_STACK_EFFICIENCY): NVIDIA's
# NeMo / Megatron-Bridge tables and DGX Cloud benchmarking recipes, Megatron-LM's papers (its
# authors: Shoeybi, Narayanan, Korthikanti), MLPerf submissions, MosaicML's llm-foundry, PyTorch's
# torchtitan and Google's MaxText docs -- not a pull request, issue or discussion in their trackers,
# which measure work in progress or a user's setup
_RECIPE_SOURCES = ("nemo", "megatron-bridge", "dgxc-benchmarking", "mlcommons", "mlperf", "llm-foundry", "mosaicml",
                   "shoeybi", "narayanan", "korthikanti", "pytorch/torchtitan", "maxtext")
_TRACKER = re.compile(r"\bissues?\b|\bdiscussions?\b|\bpull request|\bpr #?\d")
# software that pads the output layer's vocabulary whatever the model's config says
# (TrainSetup.vocab_multiple): Megatron-LM and what runs it (NeMo, Megatron-Bridge, Megatron-DeepSpeed,
# GPT-NeoX: --make-vocab-size-divisible-by, 128 a tensor-parallel rank), llm.c (padded_vocab_size:
# 50,304 for GPT-2), nanoGPT and its descendants trained from scratch (50,304), MosaicML's
# llm-foundry (50,368), fairseq (its dictionary pads to a multiple of 8), XLA under JAX and
# TensorFlow (its GPU compiler pads a 16-bit GEMM's dimensions to multiples of 8:
# cublas_pad_for_gemms) and NVIDIA's BERT (DeepLearningExamples: 30,528)
_PADS_VOCAB = re.compile(r"megatron|\bnemo\b|neox|llm\.c\b|nanogpt|llm-foundry|mosaicml/examples|fairseq|\bjax\b|"
                         r"maxtext|t5x|paxml|praxis|levanter|tensorflow|\bxla\b|deeplearningexamples")
# PyTorch-native frameworks whose published runs execute the model eagerly unless their notes
# say torch.compile (TrainSetup.kernels): each elementwise op its own kernel. Megatron, NeMo,
# DeepSpeed-Megatron, JAX/XLA and hand-fused CUDA code (llm.c, flash-attention's training
# scripts, NVIDIA's BERT) fuse theirs.
# (Hugging Face by its libraries' and blog's names: a model card hosted there says nothing of
# how the model was trained)
_EAGER_SOURCES = ("llm-foundry", "mosaicml", "torchtitan", "torchtune", "olmo-core", "fms-fsdp",
                  "foundation-model-stack", "huggingface/transformers", "hf transformers", "huggingface/accelerate",
                  "huggingface/blog", "colossalai", "hpcaitech")
# the notes name Hugging Face's model code or trainer (transformers' modeling_*.py modules, its
# Trainer, Accelerate): eager PyTorch modules, whatever repository published the run
_HF_MODEL_CODE = re.compile(r"\bhf (trainer|transformers|accelerate|model|[\w.-]+ model)\b|"
                            r"hugging ?face (trainer|transformers|accelerate|model)|\btransformers (trainer|library|"
                            r"model|v?\d)|modeling_\w+|automodelfor|\w+forcausallm|\w+forsequenceclassification")
# switches the notes name, read word by word with their negations (_switch): collectives hidden
# behind compute (Layout.overlap_comm: Megatron's flags, torchtitan's async TP), Megatron's
# distributed optimizer
_ASYNC_TP = r"async ?tp|async tensor parallel"
_OVERLAP_SWITCH = rf"tp comm overlap|overlap param gather|{_ASYNC_TP}"
_DISTRIBUTED_OPTIMIZER = r"distributed optimi[sz]er"
# optimizer column (blank: Adam) -> planner optimizer
_OPTIMIZERS = {"": "adam", "adam": "adam", "adamw": "adamw", "sgd": "sgd", "sgd momentum": "sgd",
               "sgd plain": "sgd-plain", "sgd-plain": "sgd-plain", "plain sgd": "sgd-plain",
               "adafactor": "adafactor", "adamw8bit": "adamw8bit", "8-bit adamw": "adamw8bit", "adam8bit": "adamw8bit",
               "8-bit adam": "adamw8bit", "adamw 8bit": "adamw8bit", "bnb adamw8bit": "adamw8bit",
               "adamw-bf16": "adamw-bf16", "adamw bf16": "adamw-bf16", "muon": "muon", "none": "none",
               "no optimizer": "none", "lamb": "lamb", "fused lamb": "lamb", "fusedlamb": "lamb", "lion": "lion",
               "adam-mini": "adam-mini", "adam mini": "adam-mini", "adammini": "adam-mini",
               # bitsandbytes' paged optimizers keep AdamW's states (32- or 8-bit) on the device and
               # page them to the host only when the device runs out
               "paged adamw": "adamw", "paged adamw 32bit": "adamw", "paged adamw 8bit": "adamw8bit"}
# notes that say no optimizer step runs or holds state: a forward + backward benchmark (the
# optimizer column then blank or a placeholder)
_NO_OPTIMIZER = re.compile(r"\bno optimi[sz]er (step|state)|\bwithout an? optimi[sz]er\b|forward ?\+ ?backward only|"
                           r"optimi[sz]er step (is )?not (run|taken)")
# no count in a published run (devices, sequences, tokens per sequence, widths) comes near this;
# the planner's own limits (limits.py) then check each column more tightly
_MAX_INT = 10**9
# columns without which a file is not a published-runs CSV at all; any other may be blank per row
REQUIRED_COLUMNS = ("id", "metric", "value", "unit", "params_b", "n_gpus")
# counts that are at least 1 in any run (kv_heads too: a blank one means one per head); a blank
# column takes its default, a zero or negative one makes the row not modelled
POSITIVE_COLUMNS = ("hidden", "layers", "heads", "vocab", "ffn_hidden", "kv_heads", "n_gpus", "tp", "pp", "dp",
                    "seq_len", "global_batch", "micro_batch", "attention_window", "windowed_layers", "head_dim")


@dataclass(slots=True)
class RowResult:
    id: str
    metric: str
    kind: str
    published: float | None          # None when the row's value is not a positive number
    predicted: float | None          # None when the row is not modelled (``note`` says why)
    unit: str
    note: str = ""
    split: str = ""                  # the row's ``split`` column: reference / tuning / holdout
    bound: str = ""                  # the factor a measurement of the row's step informs (anchor.anchor_part)

    @property
    def error(self) -> float | None:
        """Signed relative error, (predicted - published) / published."""
        if self.predicted is None or self.published is None:
            return None
        return (self.predicted - self.published) / self.published

    def to_dict(self) -> dict:
        return {"id": self.id, "metric": self.metric, "kind": self.kind, "split": self.split, "published": self.published,
                "predicted": self.predicted, "unit": self.unit, "error_pct":
                None if self.error is None else 100 * self.error, "note": self.note}


def load_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of a published-runs CSV, or one sentence on why the file is not one."""
    p = existing_path(path, "validation file", kind="file")
    where = f"validation file {str(path)!r}"
    try:
        if not p.is_file():                  # a FIFO or a device would block or never end
            raise PathError(f"{where} is not a regular file.")
        with p.open(newline="", encoding="utf-8-sig") as fh:   # -sig: spreadsheets write a BOM
            # spreadsheets in comma-decimal locales save with ';', others export tabs: a header with
            # no comma but one of those names its delimiter
            header = fh.readline()
            fh.seek(0)
            delimiter = next((d for d in (";", "\t") if "," not in header and d in header), ",")
            reader = csv.DictReader(fh, delimiter=delimiter)
            try:
                # 'N_GPUs', ' Metric ', 'seq len': the column names are read as the file spells them
                # up to case, blanks and spaces
                columns = [re.sub(r"\s+", "_", c.strip().lower()) for c in reader.fieldnames or []]
                reader.fieldnames = columns
                rows = list(reader)
                if delimiter == ";":     # and write decimal commas: '1,7' is 1.7
                    rows = [{k: re.sub(r"^\s*(-?\d+),(\d+)\s*$", r"\1.\2", v) if isinstance(v, str) else v
                             for k, v in r.items()} for r in rows]
            except csv.Error as exc:
                raise ConfigError(f"{where} is not a readable CSV file (line {reader.line_num}: {exc}).") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text; a published-runs CSV is.") from None
    except OSError as exc:
        raise PathError(f"{where} cannot be read: {os_reason(exc)}.") from None
    if not columns:
        raise ConfigError(f"{where} is empty; a published-runs CSV starts with a header naming the columns "
                          f"{', '.join(REQUIRED_COLUMNS)}, ...")
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise ConfigError(f"{where} is not a published-runs CSV: its header lacks {', '.join(missing)}.")
    if not rows:
        raise ConfigError(f"{where} has a header but no rows.")
    return rows


# ------------------------------------------------------------------------------ one row's columns

def _text(row, key) -> str:
    # a short row leaves its last columns None; a long one puts the surplus under the key None
    value = row.get(key)
    return value.strip() if isinstance(value, str) else ""


def _number(row, key) -> float | None:
    """The column as a finite float; None when blank."""
    text = _text(row, key)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"column {key!r} is {text[:40]!r}, not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"column {key!r} is {text[:40]!r}, not a finite number")
    return value


def _int(row, key, default=0):
    text = _text(row, key)
    if not text:
        return default
    try:
        value = int(text)              # exact, unlike a detour through float
    except ValueError:
        number = _number(row, key)     # '4096.0', '1e3'
        if not number.is_integer():
            raise ConfigError(f"column {key!r} is {text[:40]!r}, not a whole number") from None
        value = int(number)
    if abs(value) > _MAX_INT:
        raise ConfigError(f"column {key!r} is {text[:40]!r}, beyond any real run")
    return value


def _check_shape(row) -> None:
    """csv.DictReader fills the columns a short row lacks with None and puts a long row's surplus
    values under the key None: either way the values may sit under the wrong columns."""
    if None in row:
        raise ConfigError(f"the row has {len(row) - 1 + len(row[None])} values for {len(row) - 1} columns")
    absent = [k for k, v in row.items() if v is None]
    if absent:
        more = f" and {len(absent) - 3} more" if len(absent) > 3 else ""
        raise ConfigError(f"the row lacks the columns {', '.join(absent[:3])}{more}")


def _check_sizes(row) -> None:
    """Every size the row gives is positive, whether or not its metric uses it: a row that says
    params_b = -5 or tp = 0 is a typo or a different file, not a run to predict."""
    params_b = _number(row, "params_b")
    if params_b is not None and params_b <= 0:
        raise ConfigError(f"column 'params_b' is {_text(row, 'params_b')[:40]!r}, not a positive number")
    for key in POSITIVE_COLUMNS:
        value = _int(row, key, None)
        if value is not None and value < 1:
            raise ConfigError(f"column {key!r} is {_text(row, key)[:40]!r}, not a positive whole number")


def _spec(row) -> ModelSpec | None:
    if not _text(row, "hidden"):
        return None
    name = _text(row, "model")
    family = name.lower()
    h, f = _int(row, "hidden"), _int(row, "ffn_hidden")
    # optional column head_dim: one head's width where it is not hidden / heads (Qwen3's 128 at
    # hidden 2560 or 5120, Gemma's 256), as --hf-config reads it from a config.json
    shape = dict(name=name, hidden=h, layers=_int(row, "layers"), heads=_int(row, "heads"),
                 vocab=_int(row, "vocab"), ffn_hidden=f or 4 * h, kv_heads=_int(row, "kv_heads"),
                 attn_head_dim=_int(row, "head_dim", 0), **_window(row))
    if any(k in family for k in _GATED_FAMILIES):
        return ModelSpec(**shape, mlp="swiglu")
    if "mpt" in family:
        return ModelSpec(**shape, tied_embeddings=True)
    if "bert" in family:
        return ModelSpec(**shape, tied_embeddings=True, learned_positions=514, bias=True, dropout=True,
                         causal=False, lm_head=False, extra_params=h * h + h)
    gpt = ModelSpec(**shape, learned_positions=_int(row, "seq_len", 2048), bias=True, dropout=True)
    gated = ModelSpec(**shape, mlp="swiglu")
    # a name the families above do not know (GLM's GeGLU, Phi-3): the row's own parameter count
    # says whether its MLP has two matrices or three
    stated = _number(row, "params_b")
    if stated and abs(gated.n_params / 1e9 - stated) < abs(gpt.n_params / 1e9 - stated):
        return gated
    return gpt


def _window(row) -> dict[str, int]:
    """Sliding-window attention from the optional columns ``attention_window`` (keys a query sees)
    and ``windowed_layers`` (blocks that attend within it; blank: every block). Mistral, Gemma 2/3,
    OLMo 3 and the speedrun GPTs window some or all blocks; their Hugging Face configs say so
    (models.from_hf_config), a published row says it here."""
    window = _int(row, "attention_window", 0)     # _check_sizes: a given one is positive
    if not window:
        if _text(row, "windowed_layers"):
            raise ConfigError("column 'windowed_layers' is given without an 'attention_window'")
        return {}
    layers = _int(row, "windowed_layers", _int(row, "layers"))
    if layers > _int(row, "layers"):
        raise ConfigError(f"column 'windowed_layers' is {layers}, more than the row's {_int(row, 'layers')} layers")
    return {"attention_window": window, "windowed_layers": layers}


def _precision(text: str) -> str:
    return mem.precision_from_label(text or "bf16")


def _sharding(row) -> tuple[str, bool]:
    from tensorpilot.layout import normalize_sharding_label

    text = _text(row, "sharding")
    # "... (degrees not stated)": the row does not say; see _layout_stated
    return ("none", False) if "not stated" in text.lower() else normalize_sharding_label(text)


# notes that name Muon as the run's optimizer where the column is blank (Muon on the block matrices,
# AdamW on the rest: a blank column, AdamW, was the nearest the column offered): "optimizer: Muon",
# "Muon for matrices", "Muon (Newton-Schulz orthogonalised momentum)"
_MUON = re.compile(r"optimi[sz]er:?\s+(hybrid\s+)?muon\b|\bmuon\s+(optimi[sz]er|on|for)\b|"
                   r"\bmuon\b[^.;]{0,20}\b(momentum|newton)")


# SGD without momentum, as the notes say it: no optimizer state (the column's "sgd" is SGD with
# momentum, one fp32 buffer)
_PLAIN_SGD = re.compile(r"stateless|\bno momentum|without momentum|momentum\s*[=:]?\s*0(\.0+)?(?![.\d])|"
                        r"\b(plain|vanilla) sgd|momentum[- ]free")


def _optimizer(row) -> str:
    label = " ".join(_text(row, "optimizer").lower().replace("_", " ").split())
    notes = _text(row, "flops_convention").lower()
    if _NO_OPTIMIZER.search(notes):
        return "none"
    if not label and _MUON.search(notes):
        return "muon"
    if label == "sgd" and _PLAIN_SGD.search(notes):
        return "sgd-plain"
    if label not in _OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {label!r}; known: {', '.join(sorted(set(_OPTIMIZERS.values())))}")
    return _OPTIMIZERS[label]


# the notes say the weights themselves are half, with no fp32 copy: "pure fp16", "no fp32 master",
# Lightning's precision flag "bf16-true" / "16-true" (hyphenated: "--bf16 True" is HF Trainer's mixed
# precision), a model cast with .half() / .to(torch.float16) or loaded with torch_dtype=float16 and
# trained so
_PURE_HALF = re.compile(r"\bpure (fp16|bf16|half|bfloat16|float16)\b|\bno (fp32 )?master|\b(bf)?16-true\b|"
                        r"without (an? )?(fp32 )?master|model\.half\(\)|model\.to\(torch\.(float16|bfloat16)\)|"
                        r"cast (wholly |entirely )?to (fp16|bf16)")
# ... unless they name an fp32 master after all (apex's model.half() + an fp32-master optimizer;
# Paddle's "pure fp16" is AMP O2, whose optimizer keeps fp32 master weights: multi_precision)
_FP32_MASTER = re.compile(r"(?<!no )(?<!without )(?<!without an )(fp32|float32) master|multi_precision|amp o2|"
                          r"use_pure_fp16|master weights? (in|kept in) fp32")
# the notes name DeepSpeed-Ulysses as the run's context parallelism (Layout.cp_mode): its ranks
# swap tokens for heads with all-to-alls; Ulysses-Offload (FPDT) chunks and offloads besides
_ULYSSES = re.compile(r"\bulysses\b(?![- ]offload)")
# model chunks a pipeline stage holds, as the notes write them: "interleaved pipeline (4 chunks)",
# "virtual pipeline 20", NeMo's and Megatron-Bridge's tables' "VP 10" / "VP=5", the config key
# virtual_pipeline_model_parallel_size; "VP n/a" names none
_VIRTUAL_STAGES = re.compile(r"interleaved pipeline \((\d{1,6}) chunks\)|virtual pipeline (?:stages? |size )?[=:]?\s*"
                             r"(\d{1,6})|\bvp(?:[ _-]?size)?\s*[=:]?\s*(\d{1,6})\b|"
                             r"virtual[_ ]pipeline[_ ]model[_ ]parallel[_ ]size\s*[=:]?\s*(\d{1,6})")


def _layout_setup(row, spec: ModelSpec, part_year: int | None = None):
    from tensorpilot.plan.predict import Layout, TrainSetup

    rec = _text(row, "recompute").lower() or "none"
    sp = "sequence-parallel" in rec or _sequence_parallel(row) is True
    rec = rec.split("+")[0]
    if rec.strip() == "selective" and _source_names(row, ("torchtitan",)):
        # torchtitan's selective checkpointing is op-level (selective_ac_option = "op" in its
        # Llama configs), not Megatron's attention-only recomputation
        rec = "op"
    conv = _text(row, "flops_convention").lower()
    m = _VIRTUAL_STAGES.search(conv)
    chunks = int(next(g for g in m.groups() if g)) if m else 1
    # an interleaved schedule whose chunk count the source leaves out: 2 here, _completed_plan
    # tries the others
    interleaved = chunks > 1 or _unstated_chunks(row) and _int(row, "pp", 1) > 1
    if not _text(row, "seq_len") and METRIC_KINDS.get(_text(row, "metric")) != "memory" or \
            not _text(row, "seq_len") and _text(row, "metric") in ("peak_memory_per_gpu", "activation_memory_per_gpu",
                                                                   "nvidia_smi_memory"):
        raise ConfigError("the row gives no sequence length (seq_len), which its metric depends on")
    m_cp = re.search(r"\bcp\s*=\s*(\d{1,6})\b", conv)
    cp = max(1, int(m_cp.group(1))) if m_cp else 1
    cp_mode = "ulysses" if _ULYSSES.search(conv) else "ring"
    tp, pp = _int(row, "tp", 1), _int(row, "pp", 1)
    n_gpus = _int(row, "n_gpus", 0)
    # a blank dp is what the devices leave: n_gpus / (tp x pp x cp)
    dp = _int(row, "dp", 0) or (n_gpus // (tp * pp * cp) if n_gpus and n_gpus % (tp * pp * cp) == 0 else 1)
    sharding, hybrid = _sharding(row)
    distributed_optimizer = _switch(row, _DISTRIBUTED_OPTIMIZER)
    param_gather = _switch(row, r"overlap param gather")
    if sharding == "none" and not _text(row, "sharding") and (distributed_optimizer or param_gather):
        # Megatron's --overlap-param-gather exists only with --use-distributed-optimizer (ZeRO-1)
        sharding = "zero1"
    if _source_names(row, _MEGATRON_RECIPE_SOURCES):
        # NeMo / Megatron-Bridge recipes: Megatron's DDP with the distributed optimizer and
        # sequence parallelism whenever tp > 1 (their llama/gpt recipe defaults), unless the
        # notes switch either off (NeMo's 2022 launcher configs: fused_adam, sequence_parallel False)
        sharding = "zero1" if sharding == "none" and distributed_optimizer is not False else sharding
        sp = _switch(row, r"sequence parallel") is not False
    layout = Layout(tp=tp, pp=pp, dp=dp, sharding=sharding, sequence_parallel=sp and tp > 1,
                    micro_batch=_int(row, "micro_batch", 1), schedule="interleaved" if interleaved else "1f1b",
                    virtual_stages=max(chunks, 2) if interleaved else 1, recompute=rec,
                    shard_group=max(1, cal.GPUS_PER_NODE // tp) if hybrid else 0, cp=cp,
                    cp_mode=cp_mode, overlap_comm=bool(_switch(row, _OVERLAP_SWITCH)),
                    overlap_grad_reduce=_grad_reduce_overlapped(row, sharding),
                    grad_bucket_copies=_grad_bucket_copies(row, sharding))
    tokens = _number(row, "tokens") if "tokens" in row else None
    # a published global batch that dp x micro-batch does not divide (OPT: 1024 sequences on 124
    # replicas) ran with uneven or dropped micro-batches: the nearest multiple is predicted
    per = dp * layout.micro_batch
    batch = _int(row, "global_batch", 0)
    if not batch and pp > 1:
        # a pipeline's bubble is (pp - 1) / (micro-batches + pp - 1): without the global batch there
        # is no speed to predict; memory peaks once pp micro-batches are in flight (1F1B), so the
        # smallest batch that fills the pipeline stands in for it
        if METRIC_KINDS.get(_text(row, "metric")) != "memory":
            raise ConfigError("the row gives no global batch, which a pipeline's bubble depends on")
        batch = per * pp
    batch = max(per, round(batch / per) * per)
    precision = _precision(_text(row, "precision"))
    if precision == "bf16-amp" and _source_names(row, _MEGATRON_RECIPE_SOURCES):
        # Megatron's --bf16 keeps bf16 weights with an fp32 master in the optimizer, not
        # autocast's fp32 weights (a bare "bf16" elsewhere is torchtitan's FSDP2 mixed precision)
        precision = "bf16"
    if precision in ("fp16", "bf16", "fp16-amp", "bf16-amp") and _PURE_HALF.search(conv) and \
            not _FP32_MASTER.search(conv):
        # the notes say the model itself is half: no fp32 master, half states (memory.precision)
        precision = f"{precision[:4]}-pure"
    # an unpadded run is planned as dense sequences of its mean length, its tokens as real ones
    fraction = _token_fraction(row, spec)
    tokens = tokens * fraction if tokens else tokens
    setup = TrainSetup(seq_len=round(_int(row, "seq_len", spec.max_seq_len if spec else 2048) * fraction),
                       global_batch=batch, precision=precision, kernels=_kernels(row), fp8_recipe=_fp8_recipe(row),
                       grad_dtype=_grad_dtype(row, precision),
                       optimizer=_optimizer(row), optimizer_impl=_optimizer_impl(row),
                       attention=_attention(row, part_year),
                       tokens=tokens if tokens and tokens > 0 else None, goodput=_goodput(row),
                       offload=_offload(row, sharding), loss_kernel=_loss_kernel(row),
                       stack_efficiency=cal.stack_efficiency(row_stack(row)),
                       vocab_multiple=_vocab_multiple(row))
    return layout, setup


# notes that say the run did not use a fused attention kernel ("no flash attention", "flash
# attention not used", "no --use-flash-attn", "materialised attention", MaxText's
# attention=dot_product: XLA's reference attention over the whole score matrix; Hugging Face's
# eager attention, attn_implementation="eager", "attention kernel: eager": the model's own matmul
# and softmax -- named so even where the notes also name SDPA, as the benchmark that compares them)
_NO_FLASH = re.compile(r"\b(no|not|without|w/o)\b[^;,.]{0,12}(flash|fa\b)|flash[- ]?attn?\w*[^;,.]{0,25}"
                       r"\b(not used|not enabled|disabled|unused|off|false)\b|materiali[sz]ed attention|"
                       r"scores materiali[sz]ed|materiali[sz]ed scores|attention disabled|attention\s*[=:]\s*dot_product\b|"
                       r"\beager attention\b|\battention(?: kernel)?\s*[:=]\s*eager\b|attn_implementation\W{0,4}eager|"
                       r"materiali[sz]es? the [^;,.]{0,12}scores")
# a fused attention kernel named in the notes (FlexAttention: PyTorch's compiled one, ~90% of
# FlashAttention-2 forward and ~85% backward per its release post, pytorch.org/blog/flexattention,
# 2024), or software that runs one by default (NeMo and Megatron-Core build attention from
# Transformer Engine's fused kernel); read with _switch, so "fused attention disabled" is not one.
# Transformer Engine alone is not: it may run only the linear layers (Pax's ENABLE_TE without
# NVTE_FUSED_ATTN)
_FUSED_ATTENTION = (r"flash|fmha|fused (multi head )?attention|\bsdpa\b|scaled dot product attention|"
                    r"\bte (fused )?attention|\bnemo\b|megatron core|\bmcore\b|flex ?attention")


# a FlashAttention-2-or-later kernel named ("FlashAttention 2", "flash_attn 2.3.4", "FA2", "FA3",
# HF's attn_implementation "flash_attention_2"), by its generation: it wins over an older one named
# beside it; FlashAttention-2 itself (timing.ATTENTION's flash2) unless a later one is named too
_FLASH_GENERATION = re.compile(r"flash[-_ ]?att(?:ention|n)[- _=v]*(?:version )?([234])\b|\bfa-?([234])\b|"
                               r"flash_attention_([23])")
# a first-generation fused kernel (timing.ATTENTION's flash1): FlashAttention 1.x ("FlashAttention
# v1.0.4", "flash-attn==1.0.4", "FA1"), its 2022 Triton port (llm-foundry's attn_impl triton,
# Megatron-DeepSpeed's --use-flash-attn-triton), xformers' memory-efficient attention, or PyTorch
# 2.0-2.1's SDPA on CUDA, which shipped FlashAttention 1 (PyTorch 2.2 moved it to FlashAttention-2)
_FLASH_1 = re.compile(r"flash[- ]?att(ention|n)[- _=v]*(version )?1(\.\d+)*\b|\bfa-?1\b|attn[- _]impl\W{0,3}triton|"
                      r"flash[- ]?attn[- ]triton|xformers\W{0,3}(memory[- ]efficient |causal )?attention|"
                      r"(memory[- ]efficient|causal) attention\W{0,3}\(?xformers|-x \(xformers")
_TORCH_2_0 = re.compile(r"\b(py)?torch\s*(==|v)?\s*2\.[01]\b")
_SDPA = re.compile(r"\bsdpa\b|scaled[ _]dot[ _]product[ _]attention")


def _attention(row, part_year: int | None = None) -> str:
    """flash where the notes name a fused kernel (flash, FMHA, SDPA, Transformer Engine's fused
    attention) or software that runs one (NeMo, Megatron-Core), or the source is such software
    (_FLASH_SOURCES); flash2 where FlashAttention-2 itself is named and no later kernel; flash1
    where that kernel is a first-generation one (_FLASH_1, or SDPA under PyTorch 2.0-2.1) and no
    later one is named; materialized where the notes say no flash kernel
    ran -- that wins over the software's default (NeMo's 2022 launcher predates its flash
    attention). Where the notes say nothing of it, flash on a part first shipped (``part_year``,
    the catalog's year of the row's accelerator) in FUSED_ATTENTION_ERA or later, materialized on an
    older or unknown one."""
    notes = _text(row, "flops_convention").lower()
    if _NO_FLASH.search(notes):
        return "materialized"
    generations = {int(g) for m in _FLASH_GENERATION.finditer(notes) for g in m.groups() if g}
    if generations:
        return "flash" if max(generations) > 2 else "flash2"
    cuda_sdpa = _SDPA.search(notes) and not re.search(r"gaudi|hpu|tpu|\bmi\d{3}", _text(row, "gpu").lower())
    if _FLASH_1.search(notes) or (cuda_sdpa and _TORCH_2_0.search(notes)):
        return "flash1"
    named = _switch(row, _FUSED_ATTENTION)
    if named or _source_names(row, _FLASH_SOURCES):
        return "flash"
    # the notes neither name a fused kernel nor turn one off: the default of the part's era, or of
    # the run's sequence length
    fused_era = (part_year or 0) >= FUSED_ATTENTION_ERA or _int(row, "seq_len", 0) >= FUSED_ATTENTION_SEQ_LEN
    return "flash" if named is None and fused_era else "materialized"


# the year from which a part's published runs ran a fused attention kernel unless they say not:
# every mainstream stack did by default in 2023 (PyTorch 2.0's SDPA, March 2023; FlashAttention-2,
# July 2023; Megatron-Core and NeMo through Transformer Engine's fused attention; Hugging Face
# transformers' SDPA default from v4.36, December 2023; JAX's Pallas flash / splash kernels in
# MaxText). Parts first shipped before then (A100, H100, A800, Gaudi2, Trainium1) carry runs of both
# eras, so there the default stays the materialised scores.
FUSED_ATTENTION_ERA = 2023
# ... and the sequence length from which a run on any part did: training on sequences of 4,096
# tokens or more came with FlashAttention (Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient
# Exact Attention with IO-Awareness", section 4.2: GPT-2 at 4K tokens trains faster with it than
# Megatron-LM's materialised attention at 1K).
# The materialised scores of one such sequence hold heads x s^2 values a layer (32 x 4096^2 x 2
# bytes = 1 GiB in half precision, kept for backward); the pre-flash models trained at 2,048 or
# less (GPT-3, OPT, BLOOM, PaLM, Megatron-Turing, the Megatron-LM scaling runs).
FUSED_ATTENTION_SEQ_LEN = 4096


# the devices a node holds, as notes write it: "4 GPUs per node", "8 x H100 per node", "4-GPU nodes",
# "nodes of 4 GPUs"
_NODE_GPUS = re.compile(r"\b(\d{1,2}) ?x? ?(?:[a-z][\w-]* )?(?:gpus?|gcds?|accelerators?|devices?) (?:per|a|each) node\b|"
                        r"\b(\d{1,2})[- ](?:gpu|gcd)s? nodes?\b|\bnodes? (?:of|with) (\d{1,2}) (?:gpus?|gcds?)\b")


def _node_gpus(row) -> int | None:
    """The node size the notes state: on a part whose link joins a board (no link domain in the
    catalog), that many devices share it (catalog.variant's gpus_per_node)."""
    m = _NODE_GPUS.search(_text(row, "flops_convention").lower())
    return int(next(g for g in m.groups() if g)) if m else None


# notes saying a peak is the allocator's allocated bytes (torch.cuda.max_memory_allocated)
_ALLOCATED = re.compile(r"max_memory_allocated|memory_allocated\(|\bpeak (memory )?allocated\b|\ballocated (peak|memory)\b")


def _allocated_peak(row) -> bool:
    """Whether a peak-memory row is the allocator's allocated bytes: its notes name them and not
    its reserved ones (a note naming both leaves which one the figure is open: reserved, as
    unstated peaks are read)."""
    notes = _text(row, "flops_convention").lower()
    return bool(_ALLOCATED.search(notes)) and "reserved" not in notes


# a total whose notes say it adds up training steps only ("sum of per-step durations", "iteration
# time x iterations x GPUs", "excludes eval/startup"): no restarts or stalls in it
_STEPS_ONLY = re.compile(r"sum of (the )?(per[- ])?step|excl\w* (eval|start|restart|failure|checkpoint)|"
                         r"iteration time x (the )?(number of )?iterations|step time x (the )?(number of )?steps")


_UNPADDED = re.compile(r"\bunpad|unpadded|padding (removed|skipped)|(removes?|skips?) (the )?padding")


def _token_fraction(row, spec: ModelSpec) -> float:
    """The share of the row's sequence positions the run computed on: calibration.BERT_WIKIPEDIA_
    TOKEN_FRACTION for a BERT encoder pretraining at 512 whose notes say its kernels skip padding
    (and not that sequences were packed, which the row counts as full rows); 1 otherwise. Memory
    rows keep every position: the longest sequences of a batch still fill it."""
    notes = _text(row, "flops_convention").lower()
    if spec.causal or _int(row, "seq_len", 0) != 512 or METRIC_KINDS.get(_text(row, "metric")) == "memory":
        return 1.0
    if _UNPADDED.search(notes) and not re.search(r"\bpack(ed|ing)\b", notes):
        return cal.BERT_WIKIPEDIA_TOKEN_FRACTION
    return 1.0


def _grad_reduce_overlapped(row, sharding: str) -> bool:
    """False for DeepSpeed's engine below ZeRO-3 (its own runs and Megatron-DeepSpeed's): its
    overlap_comm defaults to false there, so gradients are reduced after backward (DeepSpeed's
    config docs; ZeRO-3 defaults it to true), unless the notes turn overlap_comm on."""
    notes = _text(row, "flops_convention").lower()
    # DeepSpeed named by the source, or by notes that do not name NVIDIA's own stack (an NVIDIA
    # NeMo run's notes may cite a Megatron-DeepSpeed script for the model's shape)
    deepspeed = _source_names(row, ("deepspeed",)) or ("deepspeed" in notes and not re.search(
        r"\bnemo\b|megatron[- ]core|\bmcore\b", notes))
    if not deepspeed or SHARDINGS.get(sharding, 0) == 3:
        return True
    return bool(_switch(row, r"overlap comm"))


def _grad_bucket_copies(row, sharding: str) -> bool:
    """Layout.grad_bucket_copies: an unsharded data-parallel run whose stack copies gradients into
    its all-reduce buckets -- PyTorch's DDP (labelled ddp), apex's, Horovod's, DeepSpeed's ZeRO-0
    (flattened buckets) -- unless Megatron's own DDP (a contiguous grad buffer) or an XLA
    program (TPU, JAX, TensorFlow without Horovod) reduces them in place."""
    if SHARDINGS.get(sharding, 0) != 0:
        return False
    notes = _text(row, "flops_convention").lower()
    text = f"{notes} {_text(row, 'source').lower()} {_text(row, 'gpu').lower()}"
    if re.search(r"megatron|\bnemo\b", text) and "deepspeed" not in text:
        return False
    if re.search(r"\btpu|\bjax\b|\bxla\b|tensorflow|\bpaxml?\b|maxtext", text) and "horovod" not in text:
        return False
    return bool(re.search(r"\bddp\b", _text(row, "sharding").lower())
                or _switch(row, r"distributeddataparallel|horovod|apex|deepspeed"))


# host offload named in the notes (TrainSetup.offload), read with _switch so "offload_optim_frac=0.0"
# or "no offload" is none: the weights (ZeRO-Infinity's offload_param, ZeRO-3 Offload, ColossalAI
# Gemini's "cpu" placement, FSDP's CPUOffload(offload_params=True)) or the optimizer's part alone
# (ZeRO-Offload, offload_optimizer, Megatron's --optimizer-cpu-offload, "CPU optimizer offloading")
_OFFLOAD_PARAMS = r"offload param\w*( frac)?|zero infinity|zero 3 offload|placement policy\W{0,4}cpu|" \
                  r"offload params\W{0,3}true"
_OFFLOAD_OPTIMIZER = r"offload optim\w*( frac)?|optimi[sz]er cpu offload\w*|cpu optimi[sz]er offload\w*|" \
                     r"optimi[sz]er (states? )?offload\w*|zero offload|cpu adam"


def _offload(row, sharding: str) -> str:
    """TrainSetup.offload from the notes: params where they offload the weights of a sharded
    (ZeRO-3) run, optimizer where they offload the optimizer's part (or the weights of an unsharded
    run, which no framework offloads alone), none otherwise."""
    # DeepSpeed's config names the device: "offload_optimizer/offload_param device none" is off
    notes = re.sub(r"offload[_ ]\w+(?:/offload[_ ]\w+)*\W{0,4}device\W{0,4}none", "", _text(row, "flops_convention"),
                   flags=re.IGNORECASE)
    row = {**row, "flops_convention": notes}
    params = _switch(row, _OFFLOAD_PARAMS)
    if params and SHARDINGS.get(sharding, 0) == 3:
        return "params"
    return "optimizer" if params or _switch(row, _OFFLOAD_OPTIMIZER) else "none"


def _goodput(row) -> float | None:
    """The share of wall-clock that trained, for totals: 1 where the published time adds up
    training steps only (_STEPS_ONLY), None otherwise: what interruptions leave on the row's
    devices (calibration.goodput)."""
    return 1.0 if _STEPS_ONLY.search(_text(row, "flops_convention").lower()) else None


# software whose name in the notes says it ran the row (no other project shares the name, and notes
# name it only as what ran), as if the source column named it
_RAN_WHEN_NAMED = ("torchtitan",)


def _source_names(row, names) -> bool:
    """Whether the row's source column names one of ``names`` (lower-case fragments), or its notes
    name one that is in _RAN_WHEN_NAMED."""
    source = _text(row, "source").lower()
    notes = _text(row, "flops_convention").lower()
    return any(k in source or (k in _RAN_WHEN_NAMED and re.search(rf"\b{k}\b", notes)) for k in names)


def row_stack(row) -> str:
    """The kind of stack that ran the row (calibration.STACKS): "recipe" where its source is a
    tuned recipe's performance table as its team published it (_RECIPE_SOURCES, not a tracker
    thread), "typical" otherwise."""
    recipe = _source_names(row, _RECIPE_SOURCES) and not _TRACKER.search(_text(row, "source").lower())
    return "recipe" if recipe else "typical"


def _vocab_multiple(row) -> int:
    """The multiple the row's stack pads the output layer's vocabulary to (TrainSetup.vocab_multiple):
    Megatron's 128 where its source or notes name a padding stack (_PADS_VOCAB), else 1."""
    return 128 if _PADS_VOCAB.search(f"{_text(row, 'source')} {_text(row, 'flops_convention')}".lower()) else 1


def _switch(row, pattern: str) -> bool | None:
    """Whether the notes turn a named switch on (a bare or positive mention: "--tp-comm-overlap",
    "use_distributed_optimizer=True"), off ("no distributed optimizer", "ub_tp_comm_overlap
    false", "sequence_parallel False", "not used") or do not name it (None). Underscores and
    hyphens read as spaces; an "on" anywhere wins over an "off" elsewhere."""
    notes = re.sub(r"[_-]", " ", _text(row, "flops_convention").lower())
    seen = None
    for m in re.finditer(pattern, notes):
        before, after = notes[max(0, m.start() - 14):m.start()], notes[m.end():m.end() + 20]
        off = re.search(r"\b(no|not|without|w/o|disables?|disabled)\s*$", before) or \
            re.match(r"\s*(flag\s*)?[=:]?\s*(false|off|disabled|none|0)\b|\s*(is\s+)?(not used|not enabled)", after)
        if not off:
            return True
        seen = False
    return seen


def _flags(row) -> str:
    """The notes with spaces dropped and underscores read as hyphens: Megatron's flags and
    framework switches however they are spelled."""
    return _text(row, "flops_convention").lower().replace("_", "-").replace(" ", "")


# Megatron's kernel fusions switched off (--no-bias-gelu-fusion, --no-bias-dropout-fusion,
# --no-masked-softmax-fusion, ...): its elementwise ops run as PyTorch ops, one kernel each
_NO_FUSIONS = re.compile(r"fusions? (are |were )?(disabled|off)|--no-(bias-(gelu|swiglu|dropout)|masked-softmax)-fusion|"
                         r"no kernel fusion")


def _compile_named(row) -> bool | None:
    """True where the notes say the step ran under torch.compile (or imply it: PyTorch's async TP is
    an Inductor pass, micro-pipeline TP), False where they say it ran eagerly ("eager", "no
    compile", Megatron's fusions switched off), None where they do not say."""
    notes = _text(row, "flops_convention").lower()
    if re.search(r"(?<!not )(?<!non-)(?<!non )\beager\b|\bno (torch\.)?compile|without (torch\.)?compile", notes) \
            or _NO_FUSIONS.search(notes):
        return False
    # "torch.compile not used" / "compile disabled" say nothing of the kernels: hand-fused CUDA
    # (apex, flash-attn's fused ops) may still run, so the framework decides, as when unstated
    # ("compile = false", "compile.enable: False", "torch_compile=no" too)
    notes = re.sub(r"(torch\.)?compile[ds]?([._]enabled?)?\s*(is\s+|[=:]\s*)?(not used|not enabled|disabled|off|false|no)\b",
                   "", notes)
    if "compile" in notes or _switch(row, _ASYNC_TP):
        return True
    return None


# Triton kernels patched into an eager model in place of its norms, rotary embedding and gated MLP
# (Liger-Kernel's model patches: LigerRMSNorm, liger_rotary_pos_emb, LigerSwiGLUMLP; fms-acceleration's
# fused-ops-and-kernels plugin, "foak"): the memory-bound ops of a block run fused. Liger's plain
# cross-entropy alone (_LOGITS_LOSS) patches nothing else.
_PATCHED_KERNELS = r"liger|fused[- ]ops[- ]and[- ]kernels|\bfoak\b"


def _kernels(row) -> str:
    """Eager where the notes say so or a PyTorch-native framework ran without torch.compile (named
    by the source, or Hugging Face's model code named in the notes) and patched no fused kernels in
    (_PATCHED_KERNELS); fused otherwise."""
    compiled = _compile_named(row)
    patched = _switch(row, _PATCHED_KERNELS) and not _liger_loss_only(row)
    if compiled or patched:
        return "fused"
    if compiled is not None:
        return "eager"
    eager = _source_names(row, _EAGER_SOURCES) or _HF_MODEL_CODE.search(_text(row, "flops_convention").lower())
    return "eager" if eager else "fused"


# the optimizer step as the notes describe it (predict.OPTIMIZER_IMPLS): a per-tensor loop (torch's
# foreach=False, Hugging Face's own adamw_hf, hand-written per-parameter updates); torch.optim's
# multi-tensor default (foreach, "adamw_torch", torch.optim.AdamW or an Adam named non-fused, with
# no fused flag); anything else, the fused kernels Megatron-LM, NeMo, DeepSpeed and Apex run
_LOOP_OPTIMIZER = re.compile(r"foreach\s*=\s*false|\bfor[- ]loop\b|per[- ]param(eter)?\s+(python\s+)?loop|"
                             r"\bpython loop\b|adamw[_ ]hf\b|single[_ -]tensor (adam|optimi[sz]er)")
_FOREACH_OPTIMIZER = re.compile(r"\bforeach\b|adamw[_ ]torch\b(?![_ ]fused)|torch\.optim\.adamw?\b|"
                                r"(adam\w*|optimi[sz]er)[^;.]{0,60}\b(non-fused|unfused|not fused)\b|"
                                r"\b(non-fused|unfused|not fused)\s+(adam|optimi[sz]er)")
_FUSED_OPTIMIZER = re.compile(r"fused\s*=\s*true|adamw[_ ]torch[_ ]fused|fused[ _-]?adam|"
                              r"adam\w*\s*\(?(fused|apex)\b|(?<!non-)(?<!un)fused (adam|optimi[sz]er)")


# The defaults of the software the notes name, where they name no implementation: Hugging Face's
# Trainer stepped its own AdamW (transformers.AdamW, a per-parameter Python loop; `--optim adamw_hf`
# from v4.16) until v4.32 made adamw_torch its default (huggingface/transformers pull request #25109,
# merged 2023-07-26), and adamw_torch_fused only under PyTorch 2.8 or later (pull request #37358,
# 2025-07); torch.optim's optimizers looped over the tensors until PyTorch 2.0 made the foreach
# implementation, not the fused one, their CUDA default (pytorch/pytorch pull request #95415).
_HF_TRAINER = re.compile(r"\b(hf|hugging ?face|transformers'?s?) trainer\b|"
                         r"\brun_(clm|mlm|glue|qa|swag|ner|summarization|translation)\.py\b")
_TRANSFORMERS_4 = re.compile(r"\btransformers\W{0,4}(?:v|version\s*)?\s*4\.(\d+)")
_TORCH_RELEASE = re.compile(r"\b(?:py)?torch\W{0,4}(?:v|version\s*)?\s*([12])\.(\d+)")
HF_TRAINER_FUSED_TORCH = 8          # the PyTorch 2.x release from which the Trainer's default is fused
HF_TRAINER_TORCH_ADAMW = 32         # the transformers 4.x release whose Trainer defaults to torch's AdamW


def _optimizer_impl(row) -> str:
    """loop, foreach or fused, as the notes describe the optimizer step (a fused flag wins); where
    they name none, the default of the software and version they name (Hugging Face's Trainer: its
    own AdamW loop before transformers 4.32 or under PyTorch 1.x, torch's foreach AdamW after, the
    fused one from PyTorch 2.8), else fused."""
    notes = _text(row, "flops_convention").lower()
    if _FUSED_OPTIMIZER.search(notes):
        return "fused"
    if _LOOP_OPTIMIZER.search(notes):
        return "loop"
    releases = [(int(a), int(b)) for a, b in _TORCH_RELEASE.findall(notes)]     # (major, minor) named
    torch_1 = any(major == 1 for major, _ in releases)
    if _FOREACH_OPTIMIZER.search(notes):
        return "loop" if torch_1 else "foreach"
    # optimum-habana's GaudiTrainer steps Habana's fused AdamW (its Gaudi configs' use_fused_adam)
    gaudi = "gaudi" in _text(row, "gpu").lower() or "habana" in notes
    if not _HF_TRAINER.search(notes) or gaudi or _optimizer(row) not in ("adamw", "adam"):
        return "fused"
    version = _TRANSFORMERS_4.search(notes)
    if (version and int(version.group(1)) < HF_TRAINER_TORCH_ADAMW) or torch_1:
        return "loop"
    torch_2 = next((minor for major, minor in releases if major == 2), None)
    return "fused" if torch_2 is not None and torch_2 >= HF_TRAINER_FUSED_TORCH else "foreach"


# loss kernels the notes name (memory.LOSS_KERNELS): Liger-Kernel (its models' patch replaces the
# loss with the fused linear cross-entropy), Cut Cross-Entropy; torchtune's chunked output loss.
# Liger's plain LigerCrossEntropyLoss runs over logits the output layer has already materialised:
# whole, unless the fused linear one is named too
_FUSED_LOSS = r"liger|fused linear cross ?entropy|cut cross ?entropy"
_LOGITS_LOSS = re.compile(r"liger ?cross ?entropy ?loss|ligercrossentropy")
_FUSED_LINEAR = re.compile(r"fused ?linear")
_CHUNKED_LOSS = r"chunked (output )?(cross ?entropy|ce|loss)|cewithchunkedoutputloss"


def _liger_loss_only(row) -> bool:
    """The notes name Liger's plain LigerCrossEntropyLoss and not its fused linear one: a loss kernel
    over materialised logits, nothing patched into the model."""
    notes = _text(row, "flops_convention").lower()
    return bool(_LOGITS_LOSS.search(notes)) and not _FUSED_LINEAR.search(notes)


def _loss_kernel(row) -> str:
    """fused or chunked where the notes turn such a loss on (_switch: "no liger" is off); compiled
    where the step ran under torch.compile (nanoGPT-style scripts, torchtitan and torchtune compile
    the loss with the model, Hugging Face models compute theirs inside forward); else whole."""
    if _switch(row, _FUSED_LOSS):
        return "whole" if _liger_loss_only(row) else "fused"
    if _switch(row, _CHUNKED_LOSS):
        return "chunked"
    return "compiled" if _compile_named(row) else "whole"


def _grad_dtype(row, precision: str) -> str | None:
    """The dtype the run reduced its gradients in, where the row says or its framework's published
    recipes fix it: notes naming grad_sync_dtype / grad_reduce_in_fp32 / --grad-reduce-in-bf16;
    NVIDIA's NeMo and Megatron-Bridge performance recipes reduce bf16 and fp8 runs' gradients in
    bf16 (NeMo scripts/performance/helpers.py, set_precision_configs: grad_reduce_in_fp32 = False).
    None: the precision recipe's own (Megatron-LM's fp32 for bf16 and fp8)."""
    flags = _flags(row)
    if re.search(r"grad-sync-dtype(=|:)?bf16|grad-reduce-in-fp32(=|:)?false|grad-reduce-in-bf16", flags):
        return "bf16"
    if re.search(r"grad-sync-dtype(=|:)?fp32|grad-reduce-in-fp32(=|:)?true|accumulate-allreduce-grads-in-fp32", flags):
        return "fp32"
    if precision in ("bf16", "fp8", "fp4") and _source_names(row, _MEGATRON_RECIPE_SOURCES):
        return "bf16"
    return None


def _fp8_recipe(row) -> str:
    """torchao's float8 training (its "float8" naming, or torchtitan / OLMo-core, which train fp8
    only through it) or Transformer Engine (every other fp8 row: NeMo, Megatron, llm-foundry, JAX)."""
    text = " ".join(_text(row, k) for k in ("precision", "flops_convention", "source")).lower()
    return "torchao" if any(k in text for k in ("float8", "torchao", "torchtitan", "olmo-core")) else "te"


# How a published TFLOP/s or MFU figure counts FLOPs, read from the row's notes. Sources differ:
# Megatron's formula counts every s x s score ("full"); MaxText since 2025, XTuner and others halve
# it for causal masking; PaLM-style "6N" MFU (MaxText's older count, the Nemotron-4 reports) counts
# no attention at all; a hardware count (Megatron's 96 B s L h^2 form) adds the recomputed forward,
# a model count does not. A prediction in another convention than the figure's would compare
# different numerators, not different speeds.
_FULL_ATTENTION = re.compile(r"non[- ]causal|not causal|causal[^;,]{0,25}not halved|not (causal[- ])?halved|"
                             r"s\^?2 term full|full (non[- ]causal )?attention|"
                             # PaLM's 6 N + 12 L H Q T counts every score unless halved after it
                             r"12\s*[*x]?\s*l\s*[*x]?\s*h\s*[*x]?\s*q\s*[*x]?\s*t\b(?![^;]{0,25}(/\s*2|halved))")
_CAUSAL_ATTENTION = re.compile(r"halved for causal|causal[- ]halved|causal attention|s\^?2\s*h?\s*/\s*2|/\s*2 causal")
# "6 N", "6ND", "6 x params", "6 * 1.3e9": a multiplier must separate 6 from a number, so a model
# size that starts with 6 ("6.7B", "64B") is not read as one
_SIX_N = re.compile(r"\b6\s*(?:x|\*|×)?\s*(?:n\b|nd\b|num_model_param\w*|params?\b|parameters?\b)|"
                    r"\b6\s*(?:x|\*|×)\s*[\d.]+\s*(?:e\d+|b)\b")
_ATTENTION_TERM = re.compile(r"\+\s*(?:12|(?:(?:non[- ])?causal |full )?attention)|(?<!no )attention term")
_RECOMPUTE_COUNTED = re.compile(r"incl\w*\.? (activation )?recompute|counts? the recompute|(?<!no )recompute counted|"
                                r"hardware (t)?flops|x \(3 \+ 1|4\s*\*\s*2 coefficient|includ\w* the recomputed|"
                                r"96\s*\*?\s*b\s*\*?\s*s")
_RECOMPUTE_NOT_COUNTED = re.compile(r"no recompute|without (the |a )?recompute|model[- ]flops|model tflop|"
                                    r"excl\w*\.? (activation )?recompute|not count\w* (the )?recompute|\b3 x \(")


def flop_convention(row) -> tuple[str, bool]:
    """(attention, recompute counted) of the row's TFLOP/s or MFU figure: attention "full" (every
    score, Megatron's and PaLM's formula; the default), "causal" (the half a causal kernel
    computes) or "none" (6 N per token); recomputation counted by default in achieved TFLOP/s
    (a hardware count, as Megatron-LM prints it) unless it is a 6 N count, not in MFU (a model
    count); the notes' own statement wins."""
    notes = _text(row, "flops_convention").lower()
    attention = "causal" if _CAUSAL_ATTENTION.search(notes) and not _FULL_ATTENTION.search(notes) else "full"
    six_n = _SIX_N.search(notes)
    if six_n and not _ATTENTION_TERM.search(notes, six_n.start(), six_n.start() + 120):
        attention = "none"
    # a 6 N count is forward + backward by its own statement; a hardware count would say 8 N
    counted = _text(row, "metric") == "achieved_tflops_per_gpu" and attention != "none"
    if _RECOMPUTE_COUNTED.search(notes):
        counted = True
    elif _RECOMPUTE_NOT_COUNTED.search(notes):
        counted = False
    return attention, counted


# an MFU figure of an fp8 / fp4 run taken over the bf16 peak: the notes say so ("2,250 BF16 dense
# peak", "989 TFLOPS bf16 used even for float8 runs"), or torchtitan logged it (its get_peak_flops
# knows only bf16 peaks)
# ... unless they name the fp8 / fp4 peak as well ("989 TFLOPS for BF16 and 1979 for FP8")
_LOW_PRECISION_PEAK = re.compile(r"\bfp[48]\b[^;.]{0,12}(dense )?peak|peak[^;.]{0,40}\bfor fp[48]\b|tflops for fp[48]\b")
_BF16_PEAK = re.compile(r"bf16 (dense )?peak|peak[^;.]{0,30}\bbf16\b|\bbf16\b[^;.]{0,12}(dense )?peak|torchtitan")


def _bf16_mfu_peak(row, setup) -> bool:
    """Whether the row's MFU divides a low-precision run's FLOPs by the bf16 peak, not its own."""
    notes = _text(row, "flops_convention").lower()
    return setup.precision in mem.LOW_PRECISION_GEMMS and bool(_BF16_PEAK.search(notes)) \
        and not _LOW_PRECISION_PEAK.search(notes)


def _counted_flops(row, spec: ModelSpec, params_b: float | None, plan, setup) -> float:
    """The step's FLOPs as the row's figure counts them (flop_convention)."""
    from tensorpilot.plan.flops import recompute_flops, train_flops
    from tensorpilot.plan.predict import recompute_share

    attention, counted = flop_convention(row)
    batch, seq = setup.global_batch, setup.seq_len
    recompute = plan.layout_detail.recompute if counted else "none"
    share = recompute_share(spec, plan.layout_detail)
    if attention == "none":          # 6 N per token (+ 2 N for a recomputed forward)
        n = params_b * 1e9 if params_b else spec.n_params
        return (6 + 2 * share * (recompute == "full")) * n * batch * seq
    return train_flops(spec, batch, seq, attention) + recompute_flops(spec, batch, seq, recompute, attention, share)


# ------------------------------------------------------------------------------ predictions

def _new_result(row, index: int) -> RowResult:
    """The row's identity and published value, readable even when the rest of it is not."""
    metric, unit = _text(row, "metric"), _text(row, "unit")
    try:
        published = _number(row, "value")
    except ConfigError:
        published = None
    return RowResult(_text(row, "id") or f"row {index}", metric, METRIC_KINDS.get(metric, "other"),
                     published if published and published > 0 else None, None, unit, split=_text(row, "split"))


def predict_row(row: dict[str, str], index: int = 1, stack: dict[str, float] | None = None) -> RowResult:
    """The prediction of one row (``index``: its 1-based position, the id when the row has none);
    a row that cannot be modelled comes back with ``predicted`` None and the reason in ``note``.
    ``stack``: the row's stack's measured factors (anchored: TrainSetup's stack_efficiency /
    host_efficiency)."""
    result = _new_result(row, index)
    try:
        result.predicted = _predict(row, result, stack or {})
    except ConfigError as exc:       # our own sentences: labels, numbers, shapes, layouts, accelerators
        result.note = f"not modelled: {str(exc).rstrip('.')}"
    return result


def _sequence_parallel(row) -> bool | None:
    """Whether the notes say the run split sequences across its TP group (Megatron's
    --sequence-parallel, NeMo's sequence_parallel true, nanotron's reduce_scatter TP mode): True,
    False ("no sequence parallel", "sequence_parallel false", or not named), or None where they
    say it is not stated (then the fastest that fits, as for other blanks)."""
    notes = re.sub(r"[_-]", " ", _text(row, "flops_convention").lower())
    if re.search(r"sequence parallel[a-z]*[^;]{0,40}\bnot stated", notes):
        return None
    return bool(_switch(row, r"sequence parallel"))


def _layout_stated(row) -> bool:
    """Whether the row says how its devices were split (any of tp, pp, dp, micro-batch, sharding)."""
    sharding = _text(row, "sharding").lower()
    return any(_text(row, k) for k in ("tp", "pp", "dp", "micro_batch")) or bool(sharding) and "not stated" not in sharding


# an interleaved schedule whose chunk count the notes leave out, as they write it: "interleaved
# (virtual stages not stated)", "interleaved 1F1B (virtual stages per rank not stated)",
# "interleaved 1f1b (virtual pipeline; chunk count not stated)"
_UNSTATED_CHUNKS = re.compile(r"virtual stages not stated|interleaved[^.;]{0,40}\((?:virtual stages?|virtual pipeline|"
                              r"chunks?)[^)]{0,30}not stated")


def _unstated_chunks(row) -> bool:
    """The row's notes name an interleaved schedule and say its chunk count is not stated."""
    return bool(_UNSTATED_CHUNKS.search(_text(row, "flops_convention").lower()))


def _completed_plan(row, spec: ModelSpec, acc, layout, setup):
    """A stated layout whose micro-batch, recomputation or sequence parallelism the row leaves
    blank: the fastest completion that fits (runs were tuned). Micro-batches are the divisors of
    the per-replica batch (no accumulation, when it fits, is what frameworks do by default; a
    pipeline wants many small ones; a torchtitan pipeline takes torchtitan's defaults);
    recomputation none, selective or full -- for NeMo's and Megatron-Bridge's performance recipes
    full of the fewest blocks a chunk that fit (predict.least_recompute), as their recommended configs set it (NeMo scripts/performance/
    recommended_model_configs: recompute_layers, activation_offload_layers; 0 for most layouts);
    sequence parallelism off or on where the notes say it is not stated. None fits: the first,
    which the row then reports as not fitting."""
    from dataclasses import replace

    from tensorpilot.plan.predict import least_recompute, predict

    cases = [(layout, setup)]
    if layout.cp_mode == "ulysses" and layout.cp == 1 and not _text(row, "dp"):
        # Ulysses named without its degree: any cp that divides the devices left by tp x pp, a tp
        # rank's heads and the sequence, and leaves a dp that divides the published global batch
        rest = layout.n_devices // (layout.tp * layout.pp)
        stated = _int(row, "global_batch", 0)
        batched = replace(setup, global_batch=stated) if stated else setup
        cases = [(replace(layout, cp=c, dp=rest // c), batched) for c in range(1, rest + 1)
                 if rest % c == 0 and (spec.heads // layout.tp) % c == 0 and setup.seq_len % c == 0
                 and batched.global_batch % (rest // c * layout.micro_batch) == 0] or cases

    # torchtitan's pipeline defaults where a row leaves them out (its job config,
    # experimental.pipeline_parallel_microbatches: "The default value will be the number of
    # pipeline stages, if unspecified"; a looped schedule such as interleaved 1F1B without split
    # points builds 2 stages a rank). Its 2025 releases count micro-batches from a micro-batch size
    # instead (default 1): a row of those releases that leaves it out is not told apart.
    titan = layout.pp > 1 and _source_names(row, ("torchtitan",))

    def micro_batches(lo, s) -> list[int]:
        per_replica = s.global_batch // lo.dp
        if _text(row, "micro_batch"):
            return [lo.micro_batch]
        if titan and per_replica % lo.pp == 0:
            return [per_replica // lo.pp]           # torchtitan's default: as many micro-batches as stages
        return [mb for mb in range(1, per_replica + 1) if per_replica % mb == 0]

    recs = [layout.recompute] if _text(row, "recompute") else ["none", "selective", "full"]
    sps = [False, True] if layout.tp > 1 and _sequence_parallel(row) is None else [layout.sequence_parallel]
    # an interleaved schedule without its chunk count: 2 chunks a rank up to one layer a chunk
    chunks = [layout.virtual_stages]
    if layout.schedule == "interleaved" and _unstated_chunks(row):
        chunks = [2] if titan else list(range(2, spec.layers // layout.pp + 1)) or [1]
    # the run happened, so it fitted the device: the planner's safety margin (kept free for what
    # no model predicts) is advice for new plans, not a bound on a published one
    def fits(p) -> bool:
        return p.memory_bytes["total"] <= p.device_memory_bytes

    partial = not _text(row, "recompute") and _source_names(row, _MEGATRON_RECIPE_SOURCES)

    def plan_of(base, s, mb, rec, v, sp):
        lo = replace(base, micro_batch=mb, recompute=rec, virtual_stages=v, sequence_parallel=sp,
                     schedule=base.schedule if v > 1 else "1f1b")
        if rec == "full" and partial:
            return least_recompute(spec, acc, lo, s, fits)
        return predict(spec, acc, lo, s)

    plans = [plan_of(lo, s, mb, rec, v, sp) for lo, s in cases for mb in micro_batches(lo, s) for rec in recs
             for v in chunks for sp in sps]
    fitting = [p for p in plans if fits(p)]
    return min(fitting, key=lambda p: p.step_time_s) if fitting else plans[0]


def _best_layout_plan(row, spec: ModelSpec, acc, setup):
    """A row that does not say how its devices were split (model cards, papers' totals) is
    predicted at the planner's best layout (``plan --search``): published runs were tuned, and a
    wrong guess such as plain DDP of a 65B model would say more about the guess than the planner.
    Without a device count, the smallest power of two on which the model fits with the row's
    global batch (GPU-hours barely depend on the count while scaling stays near-linear)."""
    from tensorpilot.plan.search import search

    rec = _text(row, "recompute").lower().split("+")[0].split(" ")[0]
    modes = (rec,) if rec in ("none", "selective", "full") else ("none", "selective", "full")
    n = _int(row, "n_gpus", 0)
    counts = [n] if n else [1 << i for i in range(15)]
    for count in counts:
        if setup.global_batch % min(count, setup.global_batch):
            continue
        found = search(spec, acc, count, setup, top=1, recompute_modes=modes).ranked
        if found:
            return found[0]
    raise ConfigError(f"no layout of {spec.name} fits {acc.key} with a global batch of {setup.global_batch}"
                      + (f" on {n:,} devices" if n else ""))


def _predict(row, result: RowResult, stack: dict[str, float]) -> float | None:
    from dataclasses import replace

    from tensorpilot.hardware import catalog
    from tensorpilot.plan.anchor import anchor_part
    from tensorpilot.plan.predict import predict

    _check_shape(row)
    _check_sizes(row)
    if result.metric not in METRIC_KINDS or result.unit not in UNITS:
        raise ConfigError(f"metric {result.metric!r} / unit {result.unit!r} is not one the planner predicts")
    quantity = _METRIC_QUANTITY.get(result.metric, "bytes")
    if _UNIT_QUANTITY[result.unit] != quantity:
        units = ", ".join(u for u, q in _UNIT_QUANTITY.items() if q == quantity)
        raise ConfigError(f"unit {result.unit!r} does not measure {result.metric!r} (it takes {units})")
    if result.published is None:
        raise ConfigError(f"column 'value' is {_text(row, 'value')[:40]!r}, not a positive number")
    scale = UNITS[result.unit]
    spec = _spec(row)
    params_b = _number(row, "params_b")
    prec_name = _precision(_text(row, "precision"))
    if spec is None and params_b is None:
        raise ConfigError("the row has neither a model shape nor params_b")
    if result.metric == "weights_memory":
        dtype = mem.precision(prec_name).compute
        n = spec.n_params if spec else params_b * 1e9
        return mem.weights_bytes(n, "fp32" if dtype == "tf32" else dtype) / scale
    if result.metric == "model_state_memory_per_gpu" and spec is None:
        states = mem.model_state_bytes(params_b * 1e9, mem.precision(prec_name, _optimizer(row)),
                                       zero_stage=SHARDINGS[_sharding(row)[0]], dp=_int(row, "dp", 1))
        return sum(states.values()) / scale
    if spec is None:
        raise ConfigError("the row has no model shape (hidden, layers, heads, vocab)")
    if result.metric in TOTALS and not (_number(row, "tokens") if "tokens" in row else None):
        raise ConfigError(f"metric {result.metric!r} needs the row's training tokens (column 'tokens')")
    # a speed or a memory depends on the device: a row that names none is not guessed at
    gpu = _required(_text(row, "gpu") or None, "the row names no accelerator (column 'gpu')")
    acc = catalog.get(GPU_NAMES.get(gpu.lower(), gpu))
    layout, setup = _layout_setup(row, spec, acc.year)
    setup = replace(setup, **stack)     # a measured factor (anchored) for the one its kind of stack set
    node = _node_gpus(row)
    if node and acc.link_domain_gpus is None and node != cal.GPUS_PER_NODE:
        acc = catalog.variant(acc, gpus_per_node=node)
    if _layout_stated(row):
        plan = _completed_plan(row, spec, acc, layout, setup)
    else:
        plan = _best_layout_plan(row, spec, acc, setup)
        result.note = f"layout not stated: the planner's best on {plan.n_devices:,} devices ({plan.layout_detail.describe()})"
    result.bound = anchor_part(plan.time_breakdown_s)
    # the batch the plan ran (a Ulysses degree chosen above may leave the published one)
    setup = replace(setup, global_batch=plan.tokens_per_step // setup.seq_len)
    if layout.n_devices != _int(row, "n_gpus", layout.n_devices) and _layout_stated(row):
        result.note = f"tp x pp x dp x cp = {layout.n_devices} != n_gpus"
    if setup.global_batch != _int(row, "global_batch", 1):
        result.note = f"global batch {_int(row, 'global_batch', 1)} predicted as {setup.global_batch} (dp x micro-batch)"
    if "uncertain" in _text(row, "flops_convention"):
        result.note = "published value marked uncertain"
    states = ("params", "grads", "master_params", "optimizer")
    return {"achieved_tflops_per_gpu": lambda: _counted_flops(row, spec, params_b, plan, setup) / plan.step_time_s
            / plan.n_devices,
            "tokens_per_s_per_gpu": lambda: plan.tokens_per_s_per_device / _token_fraction(row, spec),
            "iteration_time": lambda: plan.step_time_s,
            "model_state_memory_per_gpu": lambda: sum(plan.memory_bytes[k] for k in states),
            "activation_memory_per_gpu": lambda: plan.memory_bytes["activations"],
            "nvidia_smi_memory": lambda: plan.memory_bytes["total"],
            # what the framework's allocator reports (torch.cuda.max_memory_reserved): no CUDA context;
            # its allocated figure (max_memory_allocated) holds no cached, fragmented blocks either
            "peak_memory_per_gpu": lambda: plan.memory_bytes["total"] - plan.memory_bytes["cuda_context"]
            - (plan.memory_bytes["allocator_overhead"] if _allocated_peak(row) else 0.0),
            "mfu": lambda: _counted_flops(row, spec, params_b, plan, setup) / plan.step_time_s / plan.n_devices
            / (acc.peak_flops_per_s("bf16") if _bf16_mfu_peak(row, setup) else plan.peak_flops_per_s),
            "gpu_hours": lambda: plan.gpu_hours,
            "time_to_train": lambda: plan.time_to_train_s,
            "energy": lambda: _required(plan.energy_kwh, f"{acc.key} has no board power in the catalog"),
            }[result.metric]() / scale


def _required(value, why: str):
    if value is None:
        raise ConfigError(why)
    return value


def validate_rows(rows: list[dict[str, str]]) -> list[RowResult]:
    return [predict_row(r, n) for n, r in enumerate(rows, 1)]


# metrics that grow as the run slows (the rest -- throughput, TFLOP/s, MFU -- shrink)
SLOW_METRICS = ("iteration_time", "time_to_train", "gpu_hours", "energy")


def _speed(metric: str, value: float) -> float:
    return 1.0 / value if metric in SLOW_METRICS else value


# what a row says about the run rather than about the number published (anchored: a row that
# differs from its anchor only here is the anchor's run again -- its tokens/s beside its TFLOP/s)
_NOT_THE_RUN = ("id", "metric", "value", "unit", "flops_convention", "source", "split", "tokens")


def _run_key(row) -> tuple:
    return tuple(sorted((k, _text(row, k).lower()) for k in row if k and k not in _NOT_THE_RUN))


ANCHORS = ("first", "nearest")


def _run_distance(a, b) -> int:
    """How many of the run's columns two rows of one source differ in."""
    ka, kb = dict(_run_key(a)), dict(_run_key(b))
    return sum(ka.get(k) != kb.get(k) for k in set(ka) | set(kb))


def anchored(rows: list[dict[str, str]], results: list[RowResult],
             anchor: str = "first") -> list[tuple[int, RowResult]]:
    """A source's speed rows predicted at the factor one other run of the source measures
    (plan.anchor: the kernels' or, for a host-bound step, the host's): what the planner says once
    the user has measured one run of their stack. A source is the row's ``source`` text -- one
    document, taken as one stack -- and, where the file has a ``stack`` column (a document that
    compares two stacks: YaFSDP against FSDP, ZeRO-3 against Megatron), the stack it names: rows
    anchor only on their own stack's runs. ``anchor``: "first", the source's first speed row
    anchors all its other runs; "nearest", each row is anchored on the source's run that differs
    from it in the fewest columns (a user measuring a run like the one planned; ties: the
    earlier). Rows of the anchor's own run (the same configuration published as another metric,
    or again) are never anchored on it: they would match by construction. Each row comes with
    its 0-based position in ``rows``, in file order, its ``note`` naming its anchor."""
    from tensorpilot.plan.anchor import solve_part

    if anchor not in ANCHORS:
        raise ConfigError(f"anchor must be one of {', '.join(ANCHORS)}, not {anchor!r}")
    groups: dict[tuple[str, str], list[tuple[int, dict[str, str], RowResult]]] = {}
    for n, (row, r) in enumerate(zip(rows, results), 1):
        if r.predicted is not None and r.kind != "memory" and _text(row, "source"):
            groups.setdefault((_text(row, "source"), _text(row, "stack")), []).append((n, row, r))
    solved: dict[int, object] = {}

    def factor(n0: int, row0, r0):
        """The anchor row's solved factor (None: its plan has no speed to scale), once each."""
        if n0 not in solved:
            def speed_at(part: str, e: float) -> float:
                # at the row's own unmeasured factor, its prediction already made
                unmeasured = {"stack_efficiency": cal.stack_efficiency(row_stack(row0)), "host_efficiency": 1.0}
                predicted = r0.predicted if e == unmeasured[part] else predict_row(row0, n0, {part: e}).predicted
                return _speed(r0.metric, predicted) if predicted else 0.0

            try:
                solved[n0] = solve_part(speed_at, r0.bound, _speed(r0.metric, r0.published))
            except ValueError:
                solved[n0] = None
        return solved[n0]

    out: list[tuple[int, RowResult]] = []
    for members in groups.values():
        for n, row, _ in members[1:] if anchor == "first" else members:
            others = [m for m in (members[:1] if anchor == "first" else members) if _run_key(m[1]) != _run_key(row)]
            if not others:
                continue
            n0, row0, r0 = min(others, key=lambda m: (_run_distance(m[1], row), m[0]))
            found = factor(n0, row0, r0)
            if found is None:
                continue
            a = predict_row(row, n, {found.part: found.efficiency})
            a.note = f"anchored on {r0.id}: {found.part.replace('_', ' ')} {found.efficiency:.3g}" + \
                ("" if found.reached else " (clamped: no share reproduces it)")
            out.append((n - 1, a))
    return sorted(out, key=lambda t: t[0])


def summarize(results: list[RowResult]) -> dict[str, dict[str, float]]:
    """Median and max absolute relative error (fractions) and row count, per metric kind, over
    the rows with a prediction; "all" over every kind."""
    kinds: dict[str, list[float]] = {}
    for r in results:
        if r.error is not None:
            kinds.setdefault("all", []).append(abs(r.error))
        if r.error is not None:
            kinds.setdefault(r.kind, []).append(abs(r.error))
    return {k: {"median_abs_error": statistics.median(v), "max_abs_error": max(v), "rows": len(v)}
            for k, v in sorted(kinds.items())}


def by_split(results: list[RowResult]) -> dict[str, dict]:
    """Per ``split`` column value (reference / tuning / holdout): the summary and the counts."""
    names = sorted({r.split for r in results if r.split})
    return {n: {"summary": summarize([r for r in results if r.split == n]),
                "counts": counts([r for r in results if r.split == n])} for n in names}


def counts(results: list[RowResult]) -> dict[str, int]:
    """Rows in the file, rows predicted, rows not modelled (each with its reason in ``note``)."""
    predicted = sum(r.predicted is not None for r in results)
    return {"rows": len(results), "predicted": predicted, "not_modelled": len(results) - predicted}


def validate_file(path: str | Path) -> tuple[list[RowResult], dict[str, dict[str, float]]]:
    results = validate_rows(load_rows(path))
    return results, summarize(results)
