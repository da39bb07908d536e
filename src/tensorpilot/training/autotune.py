"""``--optimize auto``: choose the fastest configuration that fits, by prediction, then by
measurement.

1. ``enumerate_candidates`` lists the eager configurations worth considering on this device
   (precision x micro-batch x activation checkpointing, at the requested global batch); a pure
   function of the device's capabilities, tested with fake profiles.
2. A predictor (the planner for transformer workloads, ``plan_predictor``) rules out what does
   not fit and ranks the rest by predicted step time.
3. ``Tuner`` measures the best few for a couple of steps each, within a time budget (default 10%
   of the run), then decides on compilation for the winner (and CUDA graphs through
   ``mode="reduce-overhead"`` on CUDA). Trial steps are real training steps at the same global
   batch, so tuning costs only the time slower candidates lose, never tokens.
4. The choice is cached per (model, batch, hardware, torch) and reused by the next run.

Settings decided by rule rather than by trial (each with its reason): the AdamW implementation
(fused where the device has a kernel) and DataLoader workers. For conv nets the memory format
(``channels_last`` or not) is one more trial dimension.

``find_batch_size`` is the batch-size finder: it grows the micro-batch until the device runs out
of memory (``torch.OutOfMemoryError`` on GPUs; on CPUs an ``ActivationBudget`` raises the same
error when the activations saved for backward exceed a budget), backs off, and makes all ranks
of a process group agree on the smallest result.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from tensorpilot.errors import first_line
from tensorpilot.hardware.device import DeviceCaps
from tensorpilot.training.execplan import run_label

TRIAL_STEPS = 2           # timed steps per candidate, after one untimed warm-up step ...
MIN_TRIAL = 1 + TRIAL_STEPS
MIN_TRIAL_S = 0.5         # ... and at least this long in all (a 20 ms step needs ~25 samples)
MAX_EAGER_TRIALS = 4      # measure at most this many of the ranked eager candidates
DEFAULT_BUDGET_FRACTION = 0.10
# What one compile trial costs (compilation + 2 steps): tens of seconds for a small transformer,
# on CPUs and GPUs alike (benchmarks/RESULTS.md, compile_cost).
COMPILE_TRIAL_ESTIMATE_S = 25.0
# Two timed steps on a shared machine differ by a few percent run to run (benchmarks/RESULTS.md):
# a candidate ranked lower by prediction must beat the incumbent by more than this to be chosen.
NOISE_MARGIN = 0.03
# Compilation can reorder micro-batches (a smaller micro-batch that ties eagerly can win compiled,
# benchmarks/RESULTS.md): eager runners-up within this margin of the eager winner get a compiled
# trial too, when the budget holds one more compilation.
COMPILE_REORDER_MARGIN = 0.15


# A precision whose measured matmul ceiling is below this share of the best one's is not tried:
# matmuls dominate a training step, so it cannot win, and its trial steps would cost the run.
PRECISION_TRIAL_SHARE = 0.7


# ------------------------------------------------------------------------------- candidates
@dataclass(frozen=True, slots=True)
class Candidate:
    precision: str                       # fp32 | tf32 | bf16 | fp16
    micro_batch: int
    grad_accum: int
    activation_checkpointing: bool = False
    compile: bool = False
    compile_mode: str = "default"        # "reduce-overhead": CUDA graphs (static shapes, CUDA only)
    channels_last: bool = False

    @property
    def label(self) -> str:
        return run_label(self.precision, self.micro_batch, self.grad_accum, self.activation_checkpointing,
                         self.compile, self.compile_mode, self.channels_last)


def precision_options(requested: str, caps: DeviceCaps, ceilings: dict[str, float] | None = None) -> list[str]:
    """Precisions to try, fastest-first by what the device's matrix units do (on a CPU, by the
    measured matmul ``ceilings`` when given: bf16 instructions do not make bf16 faster on every
    core); a user's explicit precision is kept as the only option."""
    if requested != "auto":
        return [requested]
    if caps.kind == "cuda":
        if caps.supports_bf16_fast:
            return ["bf16", "tf32"] if caps.supports_tf32 else ["bf16", "fp32"]
        return ["fp16", "fp32"]          # Volta/Turing: fp16 Tensor Cores with loss scaling
    if caps.kind == "mps":
        return ["fp16", "fp32"]
    if caps.supports_bf16_fast:          # CPUs with AVX512-BF16/AMX, XPU
        if caps.kind == "cpu" and ceilings and ceilings.get("bf16") and ceilings.get("fp32"):
            # fastest first; one whose matmuls are clearly slower is not worth a trial step
            best = max(ceilings["bf16"], ceilings["fp32"])
            return [p for p in sorted(["bf16", "fp32"], key=lambda p: -ceilings[p])
                    if ceilings[p] >= PRECISION_TRIAL_SHARE * best]
        return ["bf16", "fp32"]
    return ["fp32"]                      # bf16 would be emulated: never faster


def micro_batch_options(global_batch: int, limit: int | None = None, max_accum: int = 8) -> list[int]:
    """Micro-batches that divide the global batch, largest first, at most ``max_accum`` steps of
    accumulation and at most ``limit`` (the batch-size finder's result) samples."""
    opts = [m for m in range(global_batch, 0, -1)
            if global_batch % m == 0 and global_batch // m <= max_accum and (limit is None or m <= limit)]
    # powers-of-two-friendly divisors and the whole batch: the shapes kernels are tuned for
    keep = [m for m in opts if m == global_batch or (m & (m - 1)) == 0]
    return keep or opts[-1:]


def enumerate_candidates(caps: DeviceCaps, *, global_batch: int, requested_precision: str = "auto",
                         activation_checkpointing: bool | None = None, micro_limit: int | None = None,
                         convolutional: bool = False, ceilings: dict[str, float] | None = None) -> list[Candidate]:
    """Eager candidates. ``activation_checkpointing`` None lets the tuner consider both; it is
    only chosen when the run does not fit without it (prediction) or is faster with it."""
    # models with 2-D convolutions (``convolutional``: any nn.Conv2d, the built-in cnn or a
    # user's): NHWC (channels_last) is what Tensor Cores and oneDNN's fastest conv kernels want,
    # but on small CPU convs the layout conversions can cost more: a trial decides
    layouts = [False, True] if convolutional else [False]
    acs = [False, True] if activation_checkpointing is None else [activation_checkpointing]
    return [Candidate(p, m, global_batch // m, ac, channels_last=cl)
            for p in precision_options(requested_precision, caps, ceilings)
            for m in micro_batch_options(global_batch, micro_limit)
            for ac in acs for cl in layouts]


@dataclass(frozen=True, slots=True)
class RuleChoice:
    optimizer_impl: str
    num_workers: int
    reason: str


def rule_choices(caps: DeviceCaps, *, data_in_memory: bool, cpu_count: int | None = None,
                 local_devices: int = 1) -> RuleChoice:
    """What is decided without trials. DataLoader workers: the built-in datasets index tensors
    already in memory (a batch costs microseconds), and on a CPU-only machine every worker takes
    a core from the matmuls; on GPUs, workers hide host-side decoding behind device compute."""
    cpus = cpu_count or os.cpu_count() or 1
    impl = "fused" if caps.kind in ("cuda", "cpu", "mps", "xpu") else "foreach"
    if caps.kind == "cpu":
        workers, why = 0, "0 workers: the CPU computes the step, workers would take its cores"
    elif data_in_memory:
        workers, why = 1, "1 worker: the data is in memory, one worker hides the host->device copy"
    else:
        workers = max(1, min(8, cpus // max(1, local_devices) - 1))
        why = f"{workers} workers: {cpus} CPUs shared by {local_devices} device(s), one kept for the main process"
    opt_why = "fused AdamW: the device has a fused kernel" if impl == "fused" else f"AdamW {impl}"
    return RuleChoice(impl, workers, f"{opt_why}; {why}")


# ------------------------------------------------------------------------------- prediction
@dataclass(frozen=True, slots=True)
class Prediction:
    fits: bool
    step_s: float | None
    memory_bytes: float | None = None
    note: str = ""


Predictor = Callable[[Candidate], Prediction]


def no_predictor(c: Candidate) -> Prediction:
    """Workloads the planner has no model for: keep everything, order by rule (bigger
    micro-batches and faster precisions first, no recomputation)."""
    return Prediction(True, None, None, "no planner model for this workload: ordered by rule")


def rank(candidates: list[Candidate], predict: Predictor) -> tuple[list[tuple[Candidate, Prediction]],
                                                                    list[tuple[Candidate, Prediction]]]:
    """(fitting candidates best-first, ruled out). Candidates keep their enumeration order
    (the rule order) where predictions tie or are missing."""
    scored = [(c, predict(c)) for c in candidates]
    fits = [(c, p) for c, p in scored if p.fits]
    out = [(c, p) for c, p in scored if not p.fits]
    order = {c: i for i, c in enumerate(candidates)}
    fits.sort(key=lambda cp: (cp[1].step_s if cp[1].step_s is not None else 0.0, order[cp[0]]))
    # recomputation only when it is needed: drop ckpt twins of a fitting non-ckpt candidate
    plain = {replace(c, activation_checkpointing=False) for c, _ in fits if not c.activation_checkpointing}
    fits = [(c, p) for c, p in fits if not (c.activation_checkpointing
                                            and replace(c, activation_checkpointing=False) in plain)]
    return fits, out


def plan_predictor(planned: tuple[Any, int] | None, caps: DeviceCaps, *, global_batch: int) -> Predictor | None:
    """The planner's prediction (memory and step time) on this device of the model its
    workload spec describes (``planned``: (ModelSpec, tokens per sample)); None when the planner
    has no model of the workload."""
    if planned is None:
        return None
    from tensorpilot.layout import Layout
    from tensorpilot.plan.local import local_accelerator, local_plan

    acc = local_accelerator(caps)

    def predict_one(c: Candidate) -> Prediction:
        try:
            layout = Layout(micro_batch=c.micro_batch, recompute="full" if c.activation_checkpointing else "none")
            p = local_plan(*planned, acc, layout=layout, global_batch=global_batch, precision=c.precision,
                           compiled=c.compile)
        except Exception as exc:  # noqa: BLE001 - a precision the device lacks, etc.: no prediction
            return Prediction(True, None, None, f"no prediction ({exc})")
        return Prediction(p.fits, p.step_time_s, p.memory_bytes["total"],
                          f"predicted {p.memory_bytes['total'] / 2**30:.2f} GiB of "
                          f"{p.memory_limit_bytes / 2**30:.1f} GiB usable")
    return predict_one


def traced_predictor(trainer) -> Predictor:
    """Predictions for any model from its traced step (training/predicted.py): one trace per
    (precision, micro-batch) -- the global batch fixes the accumulation -- costed on this device
    with its calibration; a candidate predicted not to fit the free memory is ruled out.
    Activation checkpointing adds one more forward of every block to the step (recomputation);
    its memory saving is not modelled, so it is never ruled out."""
    from tensorpilot.training import fits, predicted

    free, _ = fits.free_bytes(trainer.device)
    cache: dict[tuple[str, int], Any] = {}
    autocasts = {"bf16": "bfloat16", "fp16": "float16"}

    def predict_one(c: Candidate) -> Prediction:
        key = (c.precision, c.micro_batch)
        if key not in cache:
            batch = fits.meta_batch(trainer.workload.train_data, c.micro_batch, trainer.cfg.train.seed)
            cache[key] = predicted.predict_run(
                trainer.model, batch, trainer.workload.loss, name=trainer.cfg.model.name,
                optimizer=trainer.optim_cfg.name, device=trainer.device, autocast=autocasts.get(c.precision),
                micro_batch=c.micro_batch, grad_accum=c.grad_accum, n_devices=1, sharding="none",
                tokens_per_sample=None, clip_grad_norm=bool(trainer.cfg.optim.grad_clip))
        run = cache[key]
        if run.plan is None:
            return Prediction(True, None, None, run.why_not or "no prediction")
        p = run.plan
        step, memory = p.step_time_s, p.memory_bytes["total"]
        if c.activation_checkpointing:
            # recomputing the forward costs about a third of a step's compute (backward ~ 2x forward)
            forward = p.time_breakdown_s["compute"] / 3
            return Prediction(True, step + forward, None,
                              f"traced: {step * 1e3:.1f} ms + ~{forward * 1e3:.1f} ms recomputation")
        ok = free is None or memory <= free
        return Prediction(ok, step, memory, f"traced: {memory / 2**20:,.0f} MiB"
                          + ("" if ok else f" > {free / 2**20:,.0f} MiB free"))
    return predict_one


def predicted_micro_limit(trainer, global_batch: int) -> int | None:
    """The largest micro-batch the traced plan says fits the device's free memory: memory is
    states + micro-batch x per-sample activations, read off traces at 1 and 2 samples. The
    batch-size finder starts its trials there (trials confirm; the plan only saves them)."""
    from tensorpilot.training import fits, predicted

    free, _ = fits.free_bytes(trainer.device)
    if not free:
        return None
    totals = []
    for n in (1, 2):
        batch = fits.meta_batch(trainer.workload.train_data, n, trainer.cfg.train.seed)
        run = predicted.predict_run(trainer.model, batch, trainer.workload.loss, name=trainer.cfg.model.name,
                                    optimizer=trainer.optim_cfg.name, device=trainer.device,
                                    autocast=trainer.choice.autocast, micro_batch=n, grad_accum=1, n_devices=1,
                                    sharding="none", tokens_per_sample=None)
        if run.plan is None:
            return None
        totals.append(run.plan.memory_bytes["total"])
    per_sample = totals[1] - totals[0]
    if per_sample <= 0:
        return global_batch
    return int(max(1, min(global_batch, (free - (totals[0] - per_sample)) // per_sample)))


# ------------------------------------------------------------------------ batch-size finder
class ActivationBudget:
    """Raise ``torch.OutOfMemoryError`` when the tensors autograd saves for backward exceed
    ``budget_bytes`` — a real measurement of activation memory, usable on CPUs (where the
    allocator has no limit to hit) and in tests. Storages are counted once; the storages of
    ``params`` (saved by reference for the input gradients) are not activations."""

    def __init__(self, budget_bytes: int, params=()):
        self.budget_bytes, self.saved_bytes = budget_bytes, 0
        self._params = {p.untyped_storage().data_ptr() for p in params}
        self._seen: set[int] = set(self._params)

    def _pack(self, t: torch.Tensor):
        try:
            key = t.untyped_storage().data_ptr()
            size = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):
            key, size = id(t), t.numel() * t.element_size()
        if key not in self._seen:
            self._seen.add(key)
            self.saved_bytes += size
            if self.saved_bytes > self.budget_bytes:
                raise torch.OutOfMemoryError(
                    f"activations {self.saved_bytes / 2**20:.1f} MiB exceed the budget "
                    f"{self.budget_bytes / 2**20:.1f} MiB")
        return t

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._seen = set(self._params)


def min_over_ranks(n: int) -> int:
    """All ranks of the default process group agree on the smallest value (one all-reduce)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return n
    t = torch.tensor([n], dtype=torch.int64,
                     device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def find_batch_size(try_batch: Callable[[int], None], *, start: int = 1, limit: int = 4096,
                    agree: Callable[[int], int] = min_over_ranks) -> int:
    """Largest micro-batch in [start, limit] for which ``try_batch(n)`` (a forward + backward)
    does not run out of memory: double until it fails, then bisect between the last success and
    the failure. Every rank then takes the smallest rank's answer (ranks may differ: other
    processes on a GPU, uneven pipeline stages). Returns 0 when even ``start`` does not fit."""
    def fits(n: int) -> bool:
        try:
            try_batch(n)
            return True
        except torch.OutOfMemoryError:
            return False
        finally:
            _free_memory()

    good, bad = 0, None
    n = max(1, start)
    while n <= limit:                     # exponential growth
        if not fits(n):
            bad = n
            break
        good, n = n, n * 2
    if bad is None:
        good = max(good, 0)
        if good < limit and good > 0 and fits(limit):
            good = limit
    else:
        lo, hi = good, bad                # good fits (or is 0), bad does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        good = lo
    return agree(good)


# ------------------------------------------------------------------------------------ trials
@dataclass(slots=True)
class Trial:
    candidate: Candidate
    predicted: Prediction
    measured_step_s: float | None = None
    warmup_s: float | None = None
    steps: int = 0
    note: str = ""
    times: list[float] = field(default_factory=list)     # the timed steps (seconds)


@dataclass(slots=True)
class TuneResult:
    chosen: Candidate
    reason: str
    trials: list[Trial]
    ruled_out: list[tuple[Candidate, Prediction]]
    rules: RuleChoice
    budget_s: float
    tuning_s: float
    cached: bool = False
    cache_file: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def trial(t: Trial) -> dict[str, Any]:
            return {"candidate": t.candidate.label, **asdict(t.candidate),
                    "predicted_step_s": t.predicted.step_s, "predicted_memory_bytes": t.predicted.memory_bytes,
                    "measured_step_s": t.measured_step_s, "warmup_s": t.warmup_s, "steps": t.steps,
                    "note": t.note or t.predicted.note}
        return {"chosen": {"label": self.chosen.label, **asdict(self.chosen)}, "reason": self.reason,
                "trials": [trial(t) for t in self.trials],
                "ruled_out": [{"candidate": c.label, "predicted_memory_bytes": p.memory_bytes, "note": p.note}
                              for c, p in self.ruled_out],
                "rules": asdict(self.rules), "budget_s": self.budget_s, "tuning_s": self.tuning_s,
                "cached": self.cached, "cache_file": self.cache_file, **self.extra}


def cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_path(key: str) -> Path:
    from tensorpilot.hardware.probe import cache_dir

    return cache_dir() / f"autotune-{key}.json"


def load_cached(key: str) -> Candidate | None:
    path = cache_path(key)
    try:
        data = json.loads(path.read_text())
        return Candidate(**data["chosen"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None                       # absent or unreadable cache: tune again


def save_cached(key: str, chosen: Candidate, context: dict[str, Any]) -> Path | None:
    from tensorpilot.errors import TensorpilotError
    from tensorpilot.files import write_atomic

    path = cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, json.dumps({"chosen": asdict(chosen), "context": context}, indent=1),
                            "autotune cache")
    except (OSError, TensorpilotError):
        return None


class Tuner:
    """Runs the trials on a set-up Trainer. ``step()`` must run one real training step with the
    trainer's current configuration and account for it (step counter, metrics)."""

    def __init__(self, trainer, step: Callable[[], None], *, budget_s: float | None,
                 predictor: Predictor | None, compile_requested: str, remaining_steps: int,
                 apply: Callable[[Any, Candidate], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.t, self.step = trainer, step
        self.budget_s, self.predict = budget_s, predictor or no_predictor
        self.compile_requested, self.remaining = compile_requested, remaining_steps
        self.apply, self.clock = apply or apply_candidate, clock

    def _steps_left(self, trials: list[Trial]) -> int:
        """Steps a new trial may take: the run's remaining steps minus those trials used, keeping
        one minimal trial's worth for the run itself."""
        return self.remaining - sum(t.steps for t in trials) - MIN_TRIAL

    def _measure(self, cand: Candidate, trial: Trial, max_steps: int) -> None:
        """One warm-up step, then at least TRIAL_STEPS timed steps and at least MIN_TRIAL_S of
        them (short steps are noisy), never more than ``max_steps`` steps in all."""
        self.apply(self.t, cand)
        t0 = self.clock()
        self.step()                                      # warm-up: first use of the shapes / compile
        trial.warmup_s = self.clock() - t0
        times: list[float] = []
        while len(times) < TRIAL_STEPS or (sum(times) < MIN_TRIAL_S and len(times) + 1 < max_steps):
            t0 = self.clock()
            self.step()
            times.append(self.clock() - t0)
        trial.steps = 1 + len(times)
        trial.times = times
        trial.measured_step_s = sorted(times)[len(times) // 2]

    def _remeasure(self, trial: Trial, trials: list[Trial]) -> None:
        """Time ``trial``'s candidate again and judge it on all its timed steps."""
        again = Trial(trial.candidate, trial.predicted)
        self._measure(trial.candidate, again, max(MIN_TRIAL, self._steps_left(trials)))
        trial.steps += again.steps
        trial.times = trial.times + again.times
        trial.measured_step_s = sorted(trial.times)[len(trial.times) // 2]

    def run(self, candidates: list[Candidate], rules: RuleChoice) -> TuneResult:
        t_start = self.clock()
        ranked, ruled_out = rank(candidates, self.predict)
        if not ranked:
            from tensorpilot.errors import ConfigError

            smallest = min(ruled_out, key=lambda cp: cp[1].memory_bytes or 0)
            raise ConfigError(f"no configuration fits this device: even {smallest[0].label} needs "
                              f"~{(smallest[1].memory_bytes or 0) / 2**30:.1f} GiB "
                              f"({smallest[1].note}); use a smaller model or batch.")
        trials: list[Trial] = []
        budget = self.budget_s
        if self._steps_left([]) < MIN_TRIAL:              # too short a run to measure anything
            chosen = ranked[0][0]
            self.apply(self.t, chosen)
            return TuneResult(chosen, f"{chosen.label}: first by {'prediction' if ranked[0][1].step_s else 'rule'} "
                              f"(the run's {self.remaining} steps are too few for trials)", [], ruled_out,
                              rules, budget or 0.0, self.clock() - t_start)
        for cand, pred in ranked[:MAX_EAGER_TRIALS]:
            if self._steps_left(trials) < MIN_TRIAL:
                break
            if trials and budget is not None:
                best = min(t.measured_step_s for t in trials if t.measured_step_s)
                expected = (pred.step_s or best) * MIN_TRIAL
                if self.clock() - t_start + expected > budget:
                    break
            trial = Trial(cand, pred)
            self._measure(cand, trial, self._steps_left(trials))
            trials.append(trial)
            if budget is None:            # default budget: a fraction of the run at the first speed
                budget = DEFAULT_BUDGET_FRACTION * self.remaining * trial.measured_step_s
        # a later (predicted-slower) candidate must win by more than two steps' timing noise, and
        # win again when both are timed once more, the incumbent first: a shared machine drifts
        # between trials, and a challenger timed in a quiet moment would otherwise win by luck
        best = trials[0]
        for t in trials[1:]:
            if t.measured_step_s < best.measured_step_s * (1 - NOISE_MARGIN):
                if self._steps_left(trials) >= 2 * MIN_TRIAL:
                    self._remeasure(best, trials)
                    self._remeasure(t, trials)
                if t.measured_step_s < best.measured_step_s * (1 - NOISE_MARGIN):
                    best = t
        eager_best = best.candidate
        reason = (f"{eager_best.label} measured fastest of {len(trials)} eager candidate(s) (a later "
                  f"candidate must be {NOISE_MARGIN:.0%} faster to displace an earlier one)"
                  if len(trials) > 1 else f"{eager_best.label}: the predicted best (budget allowed one trial)")
        chosen, extra = eager_best, {}

        # compilation: worth it only when the rest of the run repays the compile time
        from tensorpilot.training import engine

        done = sum(t.steps for t in trials)
        model = getattr(self.t, "model", None)
        signature = engine.block_signature(model, micro_batch=eager_best.micro_batch, precision=eager_best.precision,
                                           device_name=self.t.caps.name) if model is not None else None
        decision, why = engine.compile_decision(self.compile_requested, self.t.caps, self.remaining - done,
                                                best.measured_step_s,
                                                engine.load_compile_record(signature) if signature else None)
        extra["compile_decision"] = why
        left_s = (budget or 0.0) - (self.clock() - t_start)
        if decision and (left_s < COMPILE_TRIAL_ESTIMATE_S or self._steps_left(trials) < 0):
            # no budget left to measure it: compile by the rule alone (the loop falls back to
            # eager if compilation fails), as compile=auto does without --optimize
            chosen = replace(eager_best, compile=True)
            reason += f"; compiled without a trial (budget left {max(left_s, 0):.0f} s): {why}"
            self.apply(self.t, chosen)
            return TuneResult(chosen, reason, trials, ruled_out, rules, budget or 0.0,
                              self.clock() - t_start, extra=extra)
        if decision:
            modes = ["default"] + (["reduce-overhead"] if self.t.caps.kind == "cuda" else [])
            variants = [(replace(eager_best, compile=True, compile_mode=m), "compiled variant of the eager winner")
                        for m in modes]
            variants += [(replace(t.candidate, compile=True), "compiled eager runner-up") for t in sorted(
                trials, key=lambda t: t.measured_step_s) if t.candidate != eager_best
                and t.measured_step_s <= best.measured_step_s * (1 + COMPILE_REORDER_MARGIN)]
            for i, (cand, why_tried) in enumerate(variants):
                if i and (budget or 0.0) - (self.clock() - t_start) < COMPILE_TRIAL_ESTIMATE_S:
                    extra["compile_trials_skipped"] = [c.label for c, _ in variants[i:]]
                    break                                # the first was admitted above
                if self._steps_left(trials) < MIN_TRIAL:
                    break
                trial = Trial(cand, Prediction(True, None, None, why_tried))
                try:
                    self._measure(cand, trial, self._steps_left(trials))
                except engine.compiler_errors() as exc:       # the compiler failed: stay eager
                    trial.note = f"failed: {type(exc).__name__}: {first_line(exc, 150)}"
                    self.t.opt.zero_grad(set_to_none=True)
                    trials.append(trial)
                    continue
                trials.append(trial)
                if i == 0 and signature and trial.warmup_s and trial.measured_step_s:   # for the next run
                    engine.save_compile_record(signature, trial.warmup_s - best.measured_step_s,
                                               best.measured_step_s, trial.measured_step_s)
                current = next(t for t in trials if t.candidate == chosen)
                if trial.measured_step_s < current.measured_step_s:
                    saving = 1 - trial.measured_step_s / best.measured_step_s
                    n_eager = sum(not t.candidate.compile for t in trials)
                    chosen, reason = cand, (f"{cand.label}: {saving:.0%} faster per step than eager "
                                            f"{eager_best.label}, the best of {n_eager} eager candidate(s)"
                                            + (f", and the fastest of {len(trials) - n_eager} compiled" if
                                               len(trials) - n_eager > 1 else "") + f"; {why}")
        if chosen != trials[-1].candidate:
            self.apply(self.t, chosen)
        return TuneResult(chosen, reason, trials, ruled_out, rules, budget or 0.0,
                          self.clock() - t_start, extra=extra)


# ------------------------------------------------------------------ applying a configuration
def candidate_plan(base, cand: Candidate):
    """``base`` (an ExecutionPlan) with ``cand``'s precision, micro-batch x accumulation (same
    global batch), activation checkpointing, compilation and memory format."""
    return base.replace(precision=cand.precision, micro_batch=cand.micro_batch, grad_accum=cand.grad_accum,
                        activation_checkpointing="blocks" if cand.activation_checkpointing else "none",
                        compile="on" if cand.compile else "off", compile_mode=cand.compile_mode,
                        memory_format="channels_last" if cand.channels_last else "contiguous",
                        why={"precision": f"autotune: {cand.precision}"})


def apply_candidate(trainer, cand: Candidate) -> None:
    """Run a set-up Trainer as ``cand`` from now on, through its one door (``Trainer.apply``):
    model parameters and optimizer state are untouched, trials continue the same training."""
    trainer.apply(candidate_plan(trainer.plan, cand))


# ----------------------------------------------------------------------- the trainer's entry
def tune(trainer, step: Callable[[], None]) -> TuneResult:
    """Choose and apply the configuration for a set-up Trainer (one process); prints the table
    of candidates and the reason. ``step`` runs and accounts one real training step."""
    cfg, caps, wl = trainer.cfg, trainer.caps, trainer.workload
    global_batch = trainer.plan.micro_batch * trainer.plan.grad_accum
    in_memory = not isinstance(wl.train_data, torch.utils.data.DataLoader)
    rules = rule_choices(caps, data_in_memory=in_memory)
    if in_memory and trainer.plan.num_workers != rules.num_workers:
        trainer.apply(trainer.plan.replace(num_workers=rules.num_workers, why={"num_workers": rules.reason}))
    micro_limit = None
    if caps.kind == "cuda":               # the finder bounds the micro-batch by real memory,
        start = (predicted_micro_limit(trainer, global_batch) if cfg.train.predict else None) or 1
        micro_limit = find_batch_size(lambda n: trial_forward_backward(trainer, n),   # from the plan's guess
                                      start=start, limit=global_batch)
    candidates = enumerate_candidates(
        caps, global_batch=global_batch, requested_precision=cfg.engine.precision,
        activation_checkpointing=True if cfg.engine.activation_checkpointing else None,
        micro_limit=micro_limit or None,
        convolutional=any(isinstance(m, torch.nn.Conv2d) for m in trainer.model.modules()),
        ceilings=trainer.ceilings)
    key = cache_key({"meta": wl.meta, "kind": wl.kind, "params": trainer.n_params, "global_batch": global_batch,
                     "precision": cfg.engine.precision, "compile": cfg.engine.compile,
                     "device": caps.name, "flags": sorted(caps.cpu_flags), "torch": torch.__version__,
                     "threads": torch.get_num_threads()})
    if cfg.engine.tune_cache and (cached := load_cached(key)) is not None and cached in candidates + [
            replace(c, compile=True, compile_mode=m) for c in candidates for m in ("default", "reduce-overhead")]:
        apply_candidate(trainer, cached)
        result = TuneResult(cached, f"{cached.label}: reused the choice cached for this model, batch and "
                            "machine (--no-engine.tune_cache to try again)", [], [], rules, 0.0, 0.0,
                            cached=True, cache_file=str(cache_path(key)))
    else:
        # the traced plan of this very model (any model); the formula planner where tracing is off
        predictor = traced_predictor(trainer) if cfg.train.predict else \
            plan_predictor(trainer.spec.plan_model(wl.meta), caps, global_batch=global_batch)
        tuner = Tuner(trainer, step, budget_s=cfg.engine.tune_budget or None, predictor=predictor,
                      compile_requested=cfg.engine.compile, remaining_steps=cfg.train.steps - trainer.step)
        result = tuner.run(candidates, rules)
        saved = save_cached(key, result.chosen, {"workload": wl.kind, "device": caps.name,
                                                 "torch": torch.__version__})
        result.cache_file = str(saved) if saved else None
    if micro_limit is not None:
        result.extra["batch_size_finder_limit"] = micro_limit
    print_result(trainer.console, result)
    return result


def trial_forward_backward(trainer, n: int) -> None:
    """One forward + backward at micro-batch ``n`` (the finder's probe); gradients discarded."""
    from tensorpilot.training import loader

    x, y = next(iter(loader.make_loader(trainer.workload.train_data, n, 0, 0, False, trainer.cfg.train.seed)))
    x, y = x.to(trainer.device), y.to(trainer.device)
    with trainer.autocast():
        loss = trainer.workload.loss(trainer.model(x), y)
    loss.backward()
    trainer.opt.zero_grad(set_to_none=True)


def print_result(console, r: TuneResult) -> None:
    from rich.markup import escape
    from rich.table import Table

    if r.trials:
        table = Table(title="autotune: candidates tried (each a real training step)", title_justify="left")
        for col in ("candidate", "predicted step", "measured step", "first step", "note"):
            table.add_column(col)
        for t in r.trials:
            table.add_row(escape(t.candidate.label),
                          f"{t.predicted.step_s * 1e3:.0f} ms" if t.predicted.step_s else "-",
                          f"{t.measured_step_s * 1e3:.0f} ms" if t.measured_step_s else "-",
                          f"{t.warmup_s:.1f} s" if t.warmup_s else "-", escape(t.note or t.predicted.note))
        console.print(table)
    for c, p in r.ruled_out:
        console.print(f"  ruled out {escape(c.label)}: {escape(p.note)}")
    console.print(f"  autotune:  {escape(r.reason)} ({r.tuning_s:.1f} s of trials, budget {r.budget_s:.0f} s)")
    console.print(f"  rules:     {escape(r.rules.reason)}")
