"""The suites of `tensorpilot bench`. Each measures through the project's own code paths -- the
probe's matmul (hardware.probe), the real Trainer and its step (training), the trainer's
profiled-step memory (observe.memory), the planner's activation memory (plan.memory via
training.fits), the energy meters (observe.energy), `tensorpilot train --nproc` (bench.scaling)
-- and returns rows plus a verdict on each seed claim (bench.figures).

A suite is ``fn(ctx) -> SuiteResult``, registered once in :data:`SUITES` with its claims. Errors a
user can cause (an unsupported precision asked for) raise a TensorpilotError: one sentence, and
the command goes on with the other suites.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tensorpilot.bench import figures as fg
from tensorpilot.errors import ConfigError

__all__ = ["Sizes", "Context", "SuiteResult", "SUITES", "CLAIMS", "unsupported_precision", "precision_ladder"]

LADDER = ("fp32", "tf32", "bf16", "fp16", "fp8")
LOW = ("tf32", "bf16", "fp16", "fp8")          # "low precision" of the seed claim (tf32: matmuls only)
HALF = ("bf16", "fp16", "fp8")                  # what halves the bytes of activations


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much each suite measures: --quick (about two minutes on a 2-core CPU) or full."""

    model_size: str = "small"                   # gpt preset of precision, compile, checkpointing, energy
    batch: int = 16                             # gpt micro-batch of those suites
    steps: int = 10                             # timed steps per configuration
    loss_steps: int = 30                        # precision: steps from the same start before the loss is read
    matmul_sizes: tuple[int, ...] = (512, 1024, 2048)
    inference_batches: tuple[int, ...] = (1, 8, 32, 64)
    sweep_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    scaling_steps: int = 40
    scaling_batch: int = 16
    max_procs: int = 4
    compile_rounds: int = 5


QUICK = Sizes(model_size="tiny", batch=8, steps=5, loss_steps=8, matmul_sizes=(256, 512), inference_batches=(1, 8, 32),
              sweep_batches=(1, 2, 4, 8, 16), scaling_steps=12, scaling_batch=16, max_procs=2, compile_rounds=2)
FULL = Sizes()

# every trainer the suites build: a small slice of the corpus, no evaluation or tracing
TRAINER_SETTINGS = {"data.max_bytes": 400_000, "train.predict": False, "engine.attention": "auto"}


@dataclass(slots=True)
class Context:
    device: str                                 # resolved: cpu, cuda:0, ...
    sizes: Sizes
    work: Path                                  # scratch directory for the trainers' run directories
    precisions: list[str] | None = None         # --precisions, None: every one the device supports
    log: Callable[[str], None] = print
    _n: int = 0

    def trainer(self, *, model: str = "gpt", size: str | None = None, batch: int | None = None,
                precision: str = "fp32", compile: str = "off", ac: bool = False, device: str | None = None):
        from tensorpilot.bench.measure import quiet_trainer

        self._n += 1
        return quiet_trainer(str(self.work / f"run{self._n}"), model=model, size=size or self.sizes.model_size,
                             batch=batch or self.sizes.batch, precision=precision, compile=compile, ac=ac,
                             overrides={**TRAINER_SETTINGS, "train.device": device or self.device})


@dataclass(slots=True)
class SuiteResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    claims: list[fg.Claim] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)   # processes the suite started, exactly


# ------------------------------------------------------------------------------ helpers
def _closing(trainer):
    return contextlib.closing(trainer)


def _caps(device: str):
    from tensorpilot.hardware.device import detect

    return detect(device)


def _cpu_fp16_autocast() -> bool:
    """Whether this torch build runs fp16 autocast on CPUs (it does from 2.4 on)."""
    import torch

    try:
        with torch.autocast("cpu", dtype=torch.float16):
            return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    except (RuntimeError, ValueError):
        return False


def unsupported_precision(name: str, caps, cpu_fp16: bool = True) -> str | None:
    """Why ``name`` cannot be measured on a device with capabilities ``caps`` (a DeviceCaps), or
    None when it can. Pure: tested with fake profiles."""
    where = caps.name if caps.kind != "cpu" else "this CPU"
    if name == "fp32":
        return None
    if name == "tf32":
        return None if caps.supports_tf32 else f"tf32 needs an NVIDIA GPU of compute capability 8.0 or newer; {where} is not one"
    if name == "bf16":
        if caps.kind in ("cpu", "xpu") or (caps.kind == "cuda" and caps.supports_bf16_fast):
            return None
        return f"bf16 needs a GPU of compute capability 8.0 or newer; {where} has none"
    if name == "fp16":
        if caps.kind in ("cuda", "mps", "xpu") or (caps.kind == "cpu" and cpu_fp16):
            return None
        return "this torch build has no fp16 autocast on CPUs"
    if name == "fp8":
        if caps.kind == "cuda" and (caps.cuda_capability or (0, 0)) >= (8, 9):
            return (f"{where} has fp8 matrix units, but tensorpilot's trainer has no fp8 training recipe yet "
                    "(fp32, tf32, bf16 and fp16 are measured)")
        return f"fp8 needs a GPU with fp8 matrix units (compute capability 8.9 or newer); {where} has none"
    return f"unknown precision {name!r}: use {', '.join(LADDER)}"


def precision_ladder(ctx: Context) -> tuple[list[str], list[str]]:
    """(precisions to measure, notes). Asked-for precisions the device cannot run are an error
    (one sentence); by default the unsupported rungs of the ladder are skipped with a note."""
    caps = _caps(ctx.device)
    fp16 = _cpu_fp16_autocast() if caps.kind == "cpu" else True
    if ctx.precisions:
        bad = [(p, why) for p in ctx.precisions if (why := unsupported_precision(p, caps, fp16))]
        if bad:
            p, why = bad[0]
            raise ConfigError(f"precision {p} cannot be measured on {ctx.device}: {why}.")
        return list(dict.fromkeys(ctx.precisions)), []
    keep = [p for p in LADDER if not unsupported_precision(p, caps, fp16)]
    notes = [f"{p} skipped: {unsupported_precision(p, caps, fp16)}" for p in LADDER if p not in keep]
    return keep, notes


def _matrix_units(caps) -> str | None:
    """What the claim's "matrix units" are on this device, None when it has none."""
    if caps.kind == "cuda" and (caps.cuda_capability or (0, 0)) >= (7, 0):
        return "Tensor Cores"
    if caps.kind == "cpu" and "amx_bf16" in caps.cpu_flags:
        return "AMX tiles"
    return None


def _inference_times(trainer, batches: tuple[int, ...], repeats: int) -> dict[int, float]:
    """Median seconds of one forward pass (eval mode, inference_mode, the trainer's autocast) per
    batch size, on micro-batches of the trainer's own training data."""
    import torch

    from tensorpilot.bench.measure import LoadMeter, sync
    from tensorpilot.training import loader

    wl, model = trainer.workload, trainer.model
    x, _ = next(iter(loader.make_loader(wl.train_data, max(batches), 0, 0, False, trainer.cfg.train.seed)))
    x = x.to(trainer.device)
    model.eval()
    out = {}
    try:
        with torch.inference_mode(), trainer.autocast():
            for b in batches:
                model(x[:b])                                    # warm-up (allocator, kernel choice)
                times = []
                for _ in range(repeats):
                    sync(trainer.device)
                    with LoadMeter() as m:
                        model(x[:b])
                        sync(trainer.device)
                    times.append(m.result.seconds)
                out[b] = statistics.median(times)
    finally:
        model.train()
    return out


def _quiet_compiler():
    """torch._dynamo warns once per recompiled block (the per-block graphs hit its cache limit by
    design): the bench's tables are the output, so those lines are held back while it compiles."""
    log = logging.getLogger("torch._dynamo")
    old = log.level

    @contextlib.contextmanager
    def quiet():
        log.setLevel(logging.ERROR)
        try:
            yield
        finally:
            log.setLevel(old)
    return quiet()


# ------------------------------------------------------------------------------ devices
def devices(ctx: Context) -> SuiteResult:
    """Every local device on the same workloads: matmul sweep per dtype, a gpt and a cnn training
    step (fp32, the same batch everywhere), a gpt inference batch sweep."""
    from tensorpilot.bench.measure import timed_steps
    from tensorpilot.hardware.device import detect
    from tensorpilot.hardware.peak import device_peak
    from tensorpilot.hardware.probe import matmul_dtypes, matmul_flops
    from tensorpilot.hardware.report import local_devices

    res, s = SuiteResult(), ctx.sizes
    for dev in local_devices():
        name = detect(dev).name
        ctx.log(f"  devices: {dev} ({name})")
        peaks = {}
        for dtype in matmul_dtypes(dev):
            pk = device_peak(dev, dtype, measure=False)
            peaks[dtype] = (pk.datasheet_flops_per_s or pk.cpu_estimate_flops_per_s,
                            pk.datasheet_source or pk.cpu_estimate_source)
            for n in s.matmul_sizes:
                flops = matmul_flops(dev, dtype, n, repeats=3, min_time_s=0.02)
                res.rows.append(_device_row(dev, name, f"matmul {n}x{n} {dtype}", flops, "FLOP/s", flops, peaks[dtype]))
        for model, batch in (("gpt", s.batch), ("cnn", 4 * s.batch)):
            with _closing(ctx.trainer(model=model, size="tiny", batch=batch, device=dev)) as t:
                st = timed_steps(t, s.steps, warmup=2)
                flops = t.flops_per_step / st.median_s
                res.rows.append(_device_row(dev, name, f"{model} tiny training step (batch {batch}, fp32)",
                                            batch / st.median_s, "samples/s", flops, peaks["fp32"]))
                if model == "gpt":
                    for b, sec in _inference_times(t, s.inference_batches, s.steps).items():
                        res.rows.append(_device_row(dev, name, f"gpt tiny inference batch {b} (fp32)", b / sec,
                                                    "samples/s", None, peaks["fp32"]))
    cpu = {r["workload"]: r["throughput"] for r in res.rows if r["device"] == "cpu"}
    for r in res.rows:
        r["speedup_vs_cpu"] = fg.ratio(r["throughput"], cpu.get(r["workload"]))
    accel = [r for r in res.rows if r["device"] != "cpu" and r["workload"].startswith("gpt tiny training")]
    claim = "accelerators are 10-100x faster than CPUs"
    if not accel:
        res.claims.append(fg.unmeasurable(claim, "this machine has no accelerator: only the CPU was measured "
                                                 "(its speed-up vs itself is 1.0)"))
    else:
        best = max(accel, key=lambda r: r["speedup_vs_cpu"] or 0)
        res.claims.append(fg.verdict(claim, f"{best['device']} trains the tiny gpt {best['speedup_vs_cpu']:.1f}x "
                                            "as fast as the CPU (fp32, same batch)", best["speedup_vs_cpu"], 10, 100))
    res.notes.append("% of peak: against the datasheet peak for a catalogued accelerator, against the CPU "
                     "estimate (cores x clock x FLOP/cycle, a guess) for the CPU")
    over = [r for r in res.rows if r["device"] == "cpu" and (r["pct_of_peak"] or 0) > 100]
    if over:
        # /proc/cpuinfo's clock is the nominal one where cpufreq is hidden (virtual machines): a
        # boosting core does more per second than the estimate allows
        res.notes.append(f"{len(over)} CPU figure(s) above 100% of the estimate: the estimate's clock is nominal "
                         f"({over[0]['peak_source']}); the core runs faster than that, so read the CPU's % of "
                         "peak as relative, not absolute")
    return res


def _device_row(dev, name, workload, throughput, unit, flops, peak) -> dict[str, Any]:
    peak_flops, source = peak
    return {"device": dev, "device_name": name, "workload": workload, "throughput": throughput, "unit": unit,
            "flops_per_s": flops, "pct_of_peak": fg.ratio(flops, peak_flops) * 100 if flops and peak_flops else None,
            "peak_flops_per_s": peak_flops, "peak_source": source}


# ---------------------------------------------------------------------------- precision
def precision(ctx: Context) -> SuiteResult:
    """The precision ladder on the gpt: step time, allocator peak, loss after equal steps from
    the same initialisation and data."""
    from tensorpilot.bench.measure import timed_steps

    ladder, notes = precision_ladder(ctx)
    res, s = SuiteResult(notes=notes), ctx.sizes
    for p in ladder:
        ctx.log(f"  precision: {p}")
        with _closing(ctx.trainer(precision=p)) as t:
            # the first step is untimed warm-up but counts towards the equal steps
            st = timed_steps(t, s.loss_steps - 1, warmup=1)
            peak, how = t.step_peak()
            res.rows.append({"precision": p, "step_s": st.median_s, "samples_per_s": t.plan.samples_per_step / st.median_s,
                             "peak_bytes": peak, "peak_method": how, "loss": st.losses[-1], "loss_after_steps": s.loss_steps,
                             "max_foreign_load": st.max_foreign})
    base = next((r for r in res.rows if r["precision"] == "fp32"), None)
    for r in res.rows:
        r["speedup_vs_fp32"] = fg.speedup(base["step_s"], r["step_s"]) if base else None
        r["memory_vs_fp32"] = fg.ratio(r["peak_bytes"], base["peak_bytes"]) if base else None
    res.claims += _precision_claims(res.rows, _caps(ctx.device))
    return res


def _precision_claims(rows, caps) -> list[fg.Claim]:
    speed_claim, mem_claim = "low precision on matrix units is 2-8x faster", "low precision halves memory"
    low = [r for r in rows if r["precision"] in LOW and r["speedup_vs_fp32"]]
    half = [r for r in rows if r["precision"] in HALF and r["memory_vs_fp32"]]
    if not low:
        return [fg.unmeasurable(speed_claim, "fp32 and a lower precision were not both measured"),
                fg.unmeasurable(mem_claim, "fp32 and a 16-bit precision were not both measured")]
    units = _matrix_units(caps)
    why = "" if units else (f"this device has no matrix units for low precision ({caps.name}: no AMX tiles / "
                            "Tensor Cores), so the claim's condition is not met here")
    fast = max(low, key=lambda r: r["speedup_vs_fp32"])
    out = [fg.verdict(speed_claim, f"{fast['precision']} steps at {fast['speedup_vs_fp32']:.2f}x fp32's speed"
                      + (f" on {units}" if units else ""), fast["speedup_vs_fp32"], 2, 8, why)]
    if half:
        small = min(half, key=lambda r: r["memory_vs_fp32"])
        # "halves": the step's peak at most 0.6 of fp32's (autocast keeps fp32 weights, gradients
        # and optimizer state: only activations and the matmul copies shrink)
        out.append(fg.verdict(mem_claim, f"{small['precision']} peak memory is {small['memory_vs_fp32']:.2f}x fp32's",
                              1 / small["memory_vs_fp32"], 1 / 0.6,
                              why="" if small["memory_vs_fp32"] <= 0.6 else "above 0.6x: autocast keeps fp32 weights, "
                              "gradients and optimizer state, only activations shrink"))
    else:
        out.append(fg.unmeasurable(mem_claim, "no 16-bit precision was measured"))
    return out


# ------------------------------------------------------------------------------ compile
def compile(ctx: Context) -> SuiteResult:  # noqa: A001 - the suite's name
    """Eager vs torch.compile (per block, as the trainer compiles) on the same gpt step, steps run
    alternately; CUDA graphs (compile mode reduce-overhead) as a third configuration on GPUs."""
    from tensorpilot.bench.measure import LoadMeter, sync, timed_steps

    res, s = SuiteResult(), ctx.sizes
    configs = [("eager", "default"), ("compiled", "default")]
    if ctx.device.startswith("cuda"):
        configs.append(("compiled + CUDA graphs", "reduce-overhead"))
    with contextlib.ExitStack() as stack:
        eager = stack.enter_context(_closing(ctx.trainer(precision="auto")))
        timed_steps(eager, 0, warmup=2)
        trainers, first = {"eager": eager}, {}
        for label, mode in configs[1:]:
            ctx.log(f"  compile: {label} (the first steps compile)")
            t = stack.enter_context(_closing(ctx.trainer(precision="auto")))
            t.apply(t.plan.replace(compile="on", compile_mode=mode, why={"compile": f"bench: {label}"}))
            with _quiet_compiler():
                warm = timed_steps(t, 2, warmup=0)          # compilation (and one recompilation) land here
            if not t.plan.compiled:
                res.notes.append(f"{label}: compilation failed and the trainer fell back to eager")
                continue
            trainers[label], first[label] = t, warm.seconds
        times: dict[str, list[float]] = {k: [] for k in trainers}
        for r in range(s.compile_rounds * 2):             # alternate, in both orders: drift cancels
            for label in (list(trainers) if r % 2 == 0 else list(reversed(trainers))):
                sync(trainers[label].device)
                with LoadMeter() as m:
                    trainers[label].train_step()
                    sync(trainers[label].device)
                times[label].append(m.result.seconds)
        prec = eager.plan.precision
    eager_s = statistics.median(times["eager"])
    for label in trainers:
        step_s = statistics.median(times[label])
        compile_s = sum(first[label]) - len(first[label]) * step_s if label in first else None
        res.rows.append({"config": label, "precision": prec, "step_s": step_s, "speedup_vs_eager": eager_s / step_s,
                         "first_steps_s": first.get(label), "compile_s": compile_s,
                         "break_even_steps": fg.break_even_steps(compile_s, eager_s, step_s) if compile_s is not None else None})
    claim = "kernel fusion and compilation help"
    comp = [r for r in res.rows if r["config"] != "eager"]
    if not comp:
        res.claims.append(fg.unmeasurable(claim, "torch.compile did not compile here (no C++ compiler or a failure)"))
    else:
        best = max(comp, key=lambda r: r["speedup_vs_eager"])
        be = best["break_even_steps"]
        fig = (f"{best['config']} steps at {best['speedup_vs_eager']:.2f}x eager's speed; compiling took "
               f"{best['compile_s']:.1f} s, repaid after " + (f"{be:,.0f} steps" if be else "never (no saving)"))
        # a step 5% faster is beyond the noise of alternating steps on a shared machine
        res.claims.append(fg.verdict(claim, fig, best["speedup_vs_eager"], 1.05, None,
                                     "" if best["speedup_vs_eager"] >= 1.05 else "the compiled step is not 5% faster"))
    res.notes.append("compile_s = the first two compiled steps minus two typical compiled steps (compilation, "
                     "one recompilation); break-even = compile_s / (eager step - compiled step)")
    return res


# ------------------------------------------------------------------------ checkpointing
def checkpointing(ctx: Context) -> SuiteResult:
    """Activation checkpointing policies the trainer has (none, full: every repeated block),
    measured: step time and the step's allocator peak; the planner's activation memory per
    policy beside it (selective: the planner's figure alone, the trainer has no such policy)."""
    from tensorpilot.bench.measure import timed_steps
    from tensorpilot.training.fits import estimate_planned

    res, s = SuiteResult(), ctx.sizes
    planned = {}
    for policy in ("none", "full"):
        ctx.log(f"  checkpointing: {policy}")
        with _closing(ctx.trainer(ac=policy == "full")) as t:
            st = timed_steps(t, s.steps, warmup=1)
            peak, how = t.step_peak()
            model = t.spec.plan_model(t.workload.meta)
            if model is not None and not planned:
                spec, tokens = model
                for p in ("none", "selective", "full"):
                    est = estimate_planned(spec, tokens, t.plan.micro_batch, False,
                                           materialized_attention=t.device.type == "cpu", recompute=p)
                    planned[p] = est
            res.rows.append({"policy": policy, "blocks": t.ac_blocks, "step_s": st.median_s, "peak_bytes": peak,
                             "peak_method": how, "max_foreign_load": st.max_foreign})
    res.rows.append({"policy": "selective", "blocks": None, "step_s": None, "peak_bytes": None, "peak_method": None,
                     "max_foreign_load": None})
    base = res.rows[0]
    for r in res.rows:
        est = planned.get(r["policy"])
        r["predicted_activation_bytes"] = est.activations_bytes if est else None
        r["predicted_peak_bytes"] = est.total_bytes if est else None
        r["time_vs_none"] = fg.ratio(r["step_s"], base["step_s"])
        r["memory_saved_bytes"] = base["peak_bytes"] - r["peak_bytes"] if r["peak_bytes"] is not None else None
        if est and planned.get("none"):
            r["predicted_saved_bytes"] = planned["none"].activations_bytes - est.activations_bytes
    res.notes.append("selective: tensorpilot's trainer has no selective policy (engine.activation_checkpointing "
                     "recomputes every repeated block or none); its row is the planner's prediction alone")
    full = res.rows[1]
    claim = "gradient checkpointing trades time for memory"
    saved = fg.ratio(base["peak_bytes"], full["peak_bytes"])
    fig = (f"full checkpointing: peak {full['peak_bytes'] / 2**20:,.1f} MiB vs {base['peak_bytes'] / 2**20:,.1f} MiB "
           f"({(1 - 1 / saved) * 100:.0f}% saved), step {full['time_vs_none']:.2f}x as long"
           + (f"; planner: {full.get('predicted_saved_bytes', 0) / 2**20:,.1f} MiB saved" if planned else ""))
    why = "" if (full["time_vs_none"] or 0) > 1 else "no time was lost here (within noise)"
    # the trade: at least 5% of the peak saved (and time lost, said in ``why`` when not)
    res.claims.append(fg.verdict(claim, fig, saved, 1.05, None, why))
    return res


# -------------------------------------------------------------------------------- batch
def batch(ctx: Context) -> SuiteResult:
    """Training and inference throughput and latency vs batch size on one tiny-gpt trainer (the
    micro-batch changed through Trainer.apply), and where each saturates."""
    from tensorpilot.bench.measure import timed_steps

    res, s = SuiteResult(), ctx.sizes
    with _closing(ctx.trainer(size="tiny", batch=s.sweep_batches[0], precision="auto")) as t:
        for b in s.sweep_batches:
            ctx.log(f"  batch: {b}")
            t.apply(t.plan.replace(micro_batch=b, why={"micro_batch": "bench: batch sweep"}))
            st = timed_steps(t, s.steps, warmup=1)
            res.rows.append({"batch": b, "train_step_s": st.median_s, "train_samples_per_s": b / st.median_s,
                             "max_foreign_load": st.max_foreign})
        infer = _inference_times(t, s.sweep_batches, max(s.steps, 3))
        prec = t.plan.precision
    for r in res.rows:
        r["precision"] = prec
        r["infer_latency_s"] = infer[r["batch"]]
        r["infer_samples_per_s"] = r["batch"] / infer[r["batch"]]
    for kind in ("train", "infer"):
        thr = {r["batch"]: r[f"{kind}_samples_per_s"] for r in res.rows}
        sat = fg.saturation_batch(thr)
        for r in res.rows:
            r[f"{kind}_saturated"] = r["batch"] == sat
        gain = max(thr.values()) / thr[min(thr)]
        what = "training" if kind == "train" else "inference"
        res.claims.append(fg.verdict(f"batching raises throughput ({what})",
                                     f"{gain:.1f}x the batch-{min(thr)} throughput at best; saturates at batch {sat} "
                                     f"(within {100 - fg.SATURATION_SHARE * 100:.0f}% of the best)", gain, 1.1))
    return res


# ------------------------------------------------------------------------------ scaling
def scaling(ctx: Context) -> SuiteResult:
    """1..N processes of `tensorpilot train --nproc` (gloo on CPUs, NCCL on 2+ GPUs): weak and
    strong scaling efficiency, and the all-reduce a step needs at the measured bandwidth."""
    import torch

    from tensorpilot.bench import scaling as sc

    res, s = SuiteResult(), ctx.sizes
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    on_gpu = gpus >= 2
    cores = os.cpu_count() or 1
    top = min(gpus if on_gpu else cores, s.max_procs)
    claim = "scaling to N devices is near-linear"
    if top < 2:
        res.claims.append(fg.unmeasurable(claim, "one device and one core: there is nothing to scale to"))
        return res
    ns = [n for n in (1, 2, 4, 8) if n <= top]
    device = "cuda" if on_gpu else "cpu"
    threads = max(1, cores // top)            # each process is one "device" of cores / N threads
    B = s.scaling_batch
    runs = {}
    for n in ns:
        for kind, per_proc in (("weak", B), ("strong", B // n)):
            if n == 1 and kind == "strong":
                continue
            ctx.log(f"  scaling: {n} process{'es' if n > 1 else ''} ({kind})")
            run_dir = ctx.work / f"scaling-{kind}-{n}"
            cmd = sc.train_command(n, run_dir, batch=per_proc, steps=s.scaling_steps, device=device)
            res.commands.append(" ".join(cmd))
            summary = sc.train(cmd, run_dir, threads)
            runs[(kind, n)] = summary
            res.rows.append({"processes": n, "scaling": kind, "batch_per_process": per_proc, "global_batch": per_proc * n,
                             "threads_per_process": threads, "samples_per_s": summary["samples_per_s"],
                             "step_s": (summary.get("parallel") or {}).get("step_s") or per_proc / summary["samples_per_s"]})
    one = runs[("weak", 1)]["samples_per_s"]
    for r in res.rows:
        r["efficiency"] = fg.scaling_efficiency(one, r["samples_per_s"], r["processes"])
    bus = sc.allreduce_bandwidth(2, device)
    if bus:
        params = runs[("weak", 1)]["parameters"]
        res.notes.append(f"all-reduce bus bandwidth (2 processes, 4 MiB, {'nccl' if on_gpu else 'gloo'}): {bus / 1e9:.2f} GB/s; "
                         f"one step's fp32 gradients ({params * 4 / 2**20:.1f} MiB) need "
                         f"{sc.gradient_allreduce_s(params, 2, bus) * 1e3:.2f} ms at that rate")
    n = ns[-1]
    weak, strong = runs[("weak", n)], runs[("strong", n)]
    w_eff = fg.scaling_efficiency(one, weak["samples_per_s"], n)
    s_eff = fg.scaling_efficiency(one, strong["samples_per_s"], n)
    why = "" if on_gpu else (f"{n} processes share one CPU ({cores} cores, {threads} threads each) and its memory "
                             "bandwidth, all-reduce over loopback TCP: not N devices")
    # near-linear: at least 90% of N times one process's throughput
    res.claims.append(fg.verdict(claim, f"{n} processes: weak scaling efficiency {w_eff:.0%}, strong {s_eff:.0%}",
                                 w_eff, 0.9, None, why))
    return res


# ------------------------------------------------------------------------------- energy
def energy(ctx: Context) -> SuiteResult:
    """Energy per step, per 1k tokens and FLOP per joule along the precision ladder, with the
    meter tensorpilot's runs use (observe.energy: a counter where there is one, else a labelled
    estimate); fp32 on the CPU beside an accelerator for FLOP per watt."""
    from tensorpilot.bench.measure import sync, timed_steps
    from tensorpilot.observe import energy as en

    ladder, notes = precision_ladder(ctx)
    res, s = SuiteResult(notes=notes), ctx.sizes
    plan = [(ctx.device, p) for p in ladder] + ([("cpu", "fp32")] if ctx.device != "cpu" else [])
    for dev, p in plan:
        ctx.log(f"  energy: {dev} {p}")
        meter = en.choose(en.probe(dev))
        with _closing(ctx.trainer(precision=p, device=dev)) as t:
            timed_steps(t, 0, warmup=1)
            sync(t.device)
            meter.start()
            st = timed_steps(t, s.steps, warmup=0)
            joules = meter.read()
            meter.close()
            per_step = joules / s.steps
            tokens = t.plan.samples_per_step * (t.workload.tokens_per_sample or 1)
            unit = "tokens" if t.workload.tokens_per_sample else "samples"
            res.rows.append({"device": dev, "precision": p, "energy_per_step_j": per_step,
                             "j_per_1k": per_step / tokens * 1000, "per_1k": unit,
                             "power_w": joules / sum(st.seconds), "flop_per_j": t.flops_per_step / per_step if per_step else None,
                             "step_s": st.median_s, "energy_source": meter.source, "energy_how": meter.how})
    sources = sorted({r["energy_source"] for r in res.rows})
    if "estimate" in sources:
        res.notes.append("energy_source 'estimate': no energy counter is readable here; the figures are "
                         "estimates (see energy_how), not measurements")
    claim = "GPUs deliver more FLOP per watt"
    gpu = [r for r in res.rows if r["device"].startswith("cuda") and r["flop_per_j"]]
    cpu = [r for r in res.rows if r["device"] == "cpu" and r["flop_per_j"]]
    if not gpu:
        best = max(cpu, key=lambda r: r["flop_per_j"]) if cpu else None
        res.claims.append(fg.unmeasurable(claim, "this machine has no GPU" + (
            f"; the CPU delivers {best['flop_per_j'] / 1e9:,.2f} GFLOP per joule ({best['precision']}, "
            f"source: {best['energy_source']})" if best else "")))
    else:
        g, c = max(gpu, key=lambda r: r["flop_per_j"]), max(cpu, key=lambda r: r["flop_per_j"])
        res.claims.append(fg.verdict(claim, f"{g['device']} ({g['precision']}) {g['flop_per_j'] / 1e9:,.1f} GFLOP/J vs "
                                            f"CPU {c['flop_per_j'] / 1e9:,.2f} GFLOP/J", g["flop_per_j"] / c["flop_per_j"], 1.0,
                                     None, f"sources: {', '.join(sources)}"))
    return res


# ------------------------------------------------------------------------------ registry
SUITES: dict[str, Callable[[Context], SuiteResult]] = {
    "devices": devices, "precision": precision, "compile": compile, "checkpointing": checkpointing,
    "batch": batch, "scaling": scaling, "energy": energy,
}
# the seed claims each suite checks, as articles state them (report.md quotes them)
CLAIMS = {
    "devices": ["accelerators are 10-100x faster than CPUs"],
    "precision": ["low precision on matrix units is 2-8x faster", "low precision halves memory"],
    "compile": ["kernel fusion and compilation help"],
    "checkpointing": ["gradient checkpointing trades time for memory"],
    "batch": ["batching raises throughput (training)", "batching raises throughput (inference)"],
    "scaling": ["scaling to N devices is near-linear"],
    "energy": ["GPUs deliver more FLOP per watt"],
}
