"""The measurement behind `tensorpilot profile`: the run `train` would do, built by the trainer's
own ``setup`` (same workload, execution plan, precision, loaders, techniques), then

    warm-up steps (first-call costs: allocator, attention timing, compilation) ->
    N steps timed without the profiler (the step time the findings are about) ->
    N steps under torch.profiler (CPU and CUDA activities, shapes, memory), each in a
    ``tensorpilot.step#i`` range, with a ``tensorpilot.module:NAME`` range per module call ->
    analysis: breakdown per step (breakdown.py), the traced step's FLOPs and bytes and the
    planner's prediction per op class (roofline.py), findings (findings.py).

The profiler's overhead is the ratio of the two step times, and its cost is taken off the
categories where its events were recorded (breakdown.without_profiler). Several processes (`--nproc 2`): every rank runs the same
steps (collectives), rank 0 analyses and writes; the launcher starts them through torchrun, as
`train --nproc` does, and re-launches for --apply.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorpilot.config import RunConfig, apply_mapping, overrides_to_mapping
from tensorpilot.errors import TensorpilotError

DEFAULT_STEPS = 5
DEFAULT_WARMUP = 3
# seconds the planner may spend timing not-yet-measured op shapes for its prediction (cached per
# machine; what is left over is costed from the measured bandwidth and FLOP/s, modelplan/costs.py)
PREDICT_BUDGET_S = 10.0


@dataclass(kw_only=True, slots=True)
class ProfileOptions:
    """What `tensorpilot profile` adds to train's settings."""

    steps: int = DEFAULT_STEPS          # measured steps: this many unprofiled, then this many profiled
    warmup: int = DEFAULT_WARMUP        # steps run first and not measured
    out: str = "profile"                # directory of profile.json, trace.json.gz, profile.png
    top_k: int = 10                     # modules listed
    apply: bool = False                 # re-measure with the top finding's flag


def run_config(cfg: RunConfig, opts: ProfileOptions, out: Path) -> RunConfig:
    """The trainer's configuration for a profile: a copy of ``cfg`` with its run directory under
    ``out`` (unless one was given), no checkpoints, no TensorBoard, no progress bar, no
    trainer-side prediction (the profile traces the step itself), and a schedule as long as the
    steps it will run."""
    run = copy.deepcopy(cfg)
    apply_mapping(run, overrides_to_mapping({
        "checkpoint.enabled": False, "logging.tensorboard": False, "logging.progress": "off",
        "train.predict": False, "train.steps": opts.warmup + 2 * opts.steps + 1}))
    if run.run_dir is None:
        run.run_dir = str(out / "run")
    return run.validate()


def with_setting(cfg: RunConfig, setting: dict[str, Any]) -> RunConfig:
    """``cfg`` with a finding's dotted settings applied (for --apply)."""
    changed = copy.deepcopy(cfg)
    apply_mapping(changed, overrides_to_mapping(setting))
    return changed.validate()


@contextlib.contextmanager
def module_markers(model):
    """A profiler range ``tensorpilot.module:NAME`` around every call of ``model``'s submodules
    (global forward hooks; the root is left out: everything is inside it). Two record_function
    calls per module call, ~2-6 us each on a CPU, inside the profiled steps only."""
    import torch
    from torch.nn.modules import module as nn_module

    from tensorpilot.profiling.events import MODULE_PREFIX

    names = {id(m): name for name, m in model.named_modules() if name}
    stack: list[tuple[int, Any]] = []

    def enter(mod, args):
        name = names.get(id(mod))
        if name is not None:
            rf = torch.autograd.profiler.record_function(MODULE_PREFIX + name)
            rf.__enter__()
            stack.append((id(mod), rf))

    def leave(mod, args, out):
        if stack and stack[-1][0] == id(mod):
            stack.pop()[1].__exit__(None, None, None)
    # always_call: a forward that raises (checkpointing stops a recomputation early that way) still
    # closes its range
    pre = nn_module.register_module_forward_pre_hook(enter)
    post = nn_module.register_module_forward_hook(leave, always_call=True)
    try:
        yield
    finally:
        pre.remove()
        post.remove()
        while stack:
            stack.pop()[1].__exit__(None, None, None)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def _thread_clock() -> tuple[int, int]:
    """(ns this thread ran on a CPU, ns it waited in a run queue for one): Linux schedstat
    (proc(5): /proc/[pid]/task/[tid]/schedstat), else the thread CPU time and no queue time."""
    try:
        run, wait = _SCHEDSTAT.read_text().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return time.thread_time_ns(), 0


def _timed_step(trainer) -> tuple[float, float]:
    """(seconds, seconds the training thread slept) of one step without the profiler."""
    _sync(trainer.device)
    (run0, queue0), t0 = _thread_clock(), time.perf_counter()
    trainer.train_step()
    _sync(trainer.device)
    (run1, queue1), wall = _thread_clock(), time.perf_counter() - t0
    return wall, max(wall - (run1 - run0) / 1e9 - (queue1 - queue0) / 1e9, 0.0)


def _profiled_steps(trainer, n: int, markers: bool):
    """Run ``n`` steps under torch.profiler; returns (profiler, [(ns the training thread slept,
    ns it waited for a CPU) per step]): wall = running + sleeping (data, peers, I/O) + queued
    behind other processes."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from tensorpilot.observe.memory import _native_stderr_quiet
    from tensorpilot.profiling.events import STEP_PREFIX

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    blocked = []
    marks = module_markers(trainer.model) if markers else contextlib.nullcontext()
    with _native_stderr_quiet(), profile(activities=acts, record_shapes=True, profile_memory=True) as prof, marks:
        trainer.train_step()                    # unmarked: the profiler's own first-step costs
        for i in range(n):
            _sync(trainer.device)
            (run0, queue0), wall0 = _thread_clock(), time.perf_counter_ns()
            with record_function(f"{STEP_PREFIX}{i}"):
                trainer.train_step()
                _sync(trainer.device)
            (run1, queue1), wall = _thread_clock(), time.perf_counter_ns() - wall0
            blocked.append((max(wall - (run1 - run0) - (queue1 - queue0), 0), queue1 - queue0))
    return prof, blocked


def dispatch_floor_ns(device) -> int:
    """Self time of the smallest op under the profiler as the steps are profiled: the median
    over 200 adds of two 16-element tensors (dispatch + output allocation + the profiler's own
    recording; the arithmetic itself is a few nanoseconds). See breakdown.cpu_step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tensorpilot.observe.memory import _native_stderr_quiet
    from tensorpilot.profiling.events import host_events

    a = torch.ones(16, device=device)
    with _native_stderr_quiet(), profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                                         profile_memory=True) as prof:
        for _ in range(200):
            torch.add(a, a)
    stack, times = host_events(prof), []
    while stack:
        e = stack.pop()
        times += [e.dur_ns] if e.name == "aten::add" else []
        stack.extend(e.children)
    return int(statistics.median(times)) if times else 0


def measure(cfg: RunConfig, workload=None, opts: ProfileOptions | None = None, console=None,
            out: Path | None = None) -> dict[str, Any] | None:
    """Profile the run ``cfg`` (and ``workload``, a Python API model) in this process; returns the
    result (profile.json's content) on rank 0, None on other ranks. Writes the Chrome trace."""
    from tensorpilot.training.trainer import Trainer

    opts = opts or ProfileOptions()
    out = Path(out or opts.out)
    trainer = Trainer(run_config(cfg, opts, out), workload, console=console)
    clean = False
    try:
        result = _measure(trainer, cfg, opts, out)
        clean = True
        return result
    except Exception as exc:                   # noqa: BLE001 - out of memory, lost peers, the user's model
        raise trainer._explain(exc) from None   # failing on its data: one sentence, as train says it
    finally:
        trainer.close(clean)


def _measure(trainer, cfg: RunConfig, opts: ProfileOptions, out: Path) -> dict[str, Any] | None:
    trainer.setup()
    for _ in range(opts.warmup):
        trainer.train_step()
    trainer.par.barrier()
    timed = [_timed_step(trainer) for _ in range(opts.steps)]
    unprofiled, slept = [t for t, _ in timed], statistics.median(s for _, s in timed)
    trainer.par.barrier()
    prof, blocked = _profiled_steps(trainer, opts.steps, markers=not trainer.plan.compiled)
    trainer.par.barrier()
    if not trainer.par.is_main:
        return None
    floor = dispatch_floor_ns(trainer.device) if trainer.device.type == "cpu" else 0
    result = _analyse(trainer, cfg, opts, prof, blocked, unprofiled, slept, floor)
    result["files"] = {"trace": str(_write_trace(prof, out))}
    return result


def _write_trace(prof, out: Path) -> Path:
    """The Chrome/Perfetto trace, gzip-compressed (torch writes gzip for a .gz name)."""
    path = out / "trace.json.gz"
    prof.export_chrome_trace(str(path))
    return path


def _compute_dtype(trainer) -> str:
    auto = trainer.choice.autocast
    if auto == "bfloat16":
        return "bf16"
    if auto == "float16":
        return "fp16"
    return "tf32" if trainer.plan.precision == "tf32" else "fp32"


def _peak_memory(trainer, prof) -> tuple[int | None, str]:
    """The allocator's peak during the profiled steps: CUDA's own counter, else the tensors
    live at the start (parameters, gradients, optimizer state) plus the largest running sum of
    the profiler's allocation events (as observe/memory.py measures a step)."""
    import torch

    from tensorpilot.observe.memory import storage_bytes
    from tensorpilot.profiling.events import allocations

    if trainer.device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(trainer.device)), "torch.cuda.max_memory_allocated"
    state = [t for st in trainer.opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    live = storage_bytes(list(trainer.model.parameters()) + list(trainer.model.buffers()) + state)
    running = peak = 0
    for _, size in allocations(prof):
        running += size
        peak = max(peak, running)
    return live + peak, "allocator events (torch.profiler profile_memory) above the model and optimizer state"


def _trace(trainer) -> tuple[list, str | None]:
    """The traced step's ops (observe/trace.py, fake tensors: no memory, no compute), or why not."""
    from tensorpilot.errors import first_line
    from tensorpilot.observe.trace import TraceError
    from tensorpilot.training import loader
    from tensorpilot.training.predicted import trace_run_step

    if trainer.par.active and (trainer.plan.layout.tp > 1 or trainer.plan.layout.pp > 1):
        return [], "tensor- and pipeline-parallel steps are not traced"
    wl, plan = trainer.workload, trainer.plan
    # one micro-batch as the run sees it, first sample on (its shapes and dtypes only are used)
    batch = next(iter(loader.make_loader(wl.train_data, plan.micro_batch, 0, 0, False, trainer.cfg.train.seed)))
    try:
        trace = trace_run_step(trainer.model, batch, wl.loss, optimizer=trainer.optim_cfg.name,
                               device=trainer.device.type, autocast=trainer.choice.autocast,
                               clip_grad_norm=bool(trainer.cfg.optim.grad_clip))
    except TraceError as exc:
        return [], f"the step could not be traced ({first_line(exc, 160)})"
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        return [], f"the step could not be traced ({type(exc).__name__}: {first_line(exc, 160)})"
    return trace.ops, None


def _predicted(trainer, ops, wanted: bool) -> tuple[dict[str, float] | None, str | None]:
    """The planner's seconds per op class for the traced ops on this device, or why not
    (``wanted``: the run's train.predict; the trainer's own copy has it off)."""
    from tensorpilot.errors import first_line
    from tensorpilot.modelplan import calibration
    from tensorpilot.modelplan.costs import local_costs
    from tensorpilot.profiling.roofline import predicted_times

    if not ops or not wanted:
        return None, (None if ops else "no traced step")
    try:
        costs = local_costs(trainer.caps, ops, budget_s=PREDICT_BUDGET_S)
    except (RuntimeError, ValueError, TypeError, OSError) as exc:
        return None, f"no prediction ({first_line(exc, 160)})"
    return predicted_times(ops, costs, calibration.factors(str(trainer.device)), trainer.plan.grad_accum), None


def _facts(trainer, peak_bytes):
    import torch

    from tensorpilot.hardware.peak import device_peak
    from tensorpilot.profiling.findings import RunFacts

    caps, plan = trainer.caps, trainer.plan
    ratio = None
    if caps.supports_bf16_fast and plan.precision in ("fp32", "tf32"):
        ceil = trainer.ceilings or {d: device_peak(str(trainer.device), d).measured_flops_per_s
                                    for d in ("bf16", "fp32")}
        if ceil.get("bf16") and ceil.get("fp32"):
            ratio = ceil["bf16"] / ceil["fp32"]
    can_compile = caps.kind == "cuda" or (caps.kind == "cpu" and bool(
        shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")))
    return RunFacts(
        device_kind=caps.kind, precision=plan.precision, bf16_fast=caps.supports_bf16_fast, bf16_over_fp32=ratio,
        compiled=plan.compiled, can_compile=can_compile, attention_mode=plan.attention,
        num_workers=plan.num_workers, user_loader=isinstance(trainer.workload.train_data, torch.utils.data.DataLoader),
        micro_batch=plan.micro_batch, grad_accum=plan.grad_accum, world_size=plan.layout.world,
        checkpointing=plan.checkpointing, optimizer_name=trainer.optim_cfg.name, optimizer_impl=plan.optimizer,
        cpu_count=os.cpu_count() or 1, peak_memory_bytes=peak_bytes, device_memory_bytes=caps.memory_bytes)


def _analyse(trainer, cfg, opts, prof, blocked, unprofiled, slept: float, floor_ns: int) -> dict[str, Any]:
    from tensorpilot.profiling import breakdown as bd
    from tensorpilot.profiling import events, findings, roofline
    from tensorpilot.version import __version__

    roots = events.host_events(prof)
    marks = events.steps(roots)
    main = marks[0].tid if marks else None
    comm = [r for r in roots if r.tid != main and bd.is_comm_kernel(r.name)]
    kernels = events.device_kernels(prof)
    per_step = [bd.gpu_step(s, kernels) if kernels else bd.cpu_step(s, comm, b[0], floor_ns)
                for s, b in zip(marks, blocked)]
    queued = statistics.median(q for _, q in blocked) / 1e9 if blocked else 0.0
    profiled = bd.typical(per_step)
    plain_s = statistics.median(unprofiled)        # medians throughout: see breakdown.typical
    step = bd.without_profiler(profiled, plain_s, slept)
    notes = []
    ops, why_not = _trace(trainer)
    if why_not:
        notes.append(f"roofline without FLOPs and bytes: {why_not}")
    predicted, why_not = _predicted(trainer, ops, cfg.train.predict)
    if why_not and cfg.train.predict:
        notes.append(f"no planner prediction: {why_not}")
    ceil = roofline.ceilings(str(trainer.device), _compute_dtype(trainer))
    rows = roofline.rows(step.seconds, roofline.class_work(ops, trainer.plan.grad_accum), ceil, predicted)
    peak, peak_how = _peak_memory(trainer, prof)
    facts = _facts(trainer, peak)
    found = findings.find(step, facts, rows)
    plan = trainer.plan
    if cfg.engine.optimize == "auto":
        notes.append("--optimize auto is not run by profile: the configuration is profiled as given")
    if plan.compile == "pending":
        notes.append("compile=auto decides after timing eager steps in train; profile measured eager steps "
                     "(--compile on to profile compiled ones)")
    if queued > 0.1 * profiled.wall_s:
        notes.append(f"the machine is busy: the training thread waited {queued * 1e3:,.1f} ms of each profiled "
                     "step for a CPU (other processes); every category is inflated where that happened")
    if kernels:
        notes.append("accelerator run: categories are device time (GPU breakdown not yet verified on hardware "
                     "by the test suite)")
    total = sum(step.seconds.values()) or 1.0
    samples = plan.samples_per_step
    return {
        "tensorpilot": __version__, "model": cfg.model.name, "device": str(trainer.device),
        "device_name": trainer.caps.name, "execution_plan": plan.to_dict(), "world_size": plan.layout.world,
        "steps": {"warmup": opts.warmup, "measured": opts.steps},
        "step_time_s": {"unprofiled": plain_s, "unprofiled_mean": statistics.fmean(unprofiled),
                        "profiled": profiled.wall_s, "unprofiled_samples": unprofiled,
                        "profiled_samples": [s.wall_s for s in per_step]},
        "profiler_overhead": profiled.wall_s / plain_s - 1 if plain_s > 0 else None,
        "dispatch_floor_s": floor_ns / 1e9, "cpu_queue_wait_s": queued,
        "samples_per_step": samples, "samples_per_s": samples / plain_s if plain_s > 0 else None,
        "breakdown": {c: {"seconds": s, "share": s / total} for c, s in step.seconds.items()},
        "breakdown_profiled_s": profiled.seconds,
        "communication": {"exposed_s": step.seconds["communication"], "overlapped_s": step.comm_overlapped_s,
                          "total_s": step.comm_total_s},
        "recompute_s": step.recompute_s, "optimizer_step_s": step.optimizer_step_s,
        "attention_paths": step.attention_paths,
        "modules": [{"module": m, "seconds": s, "share": s / total} for m, s in bd.top_modules(step, opts.top_k)],
        "roofline": {"ceilings": ceil, "classes": rows,
                     "predicted_host_overhead_s": (predicted or {}).get("host_overhead"),
                     "flops_source": "traced step (observe/trace.py: torch.utils.flop_counter formulas)"
                     if ops else None},
        "findings": [f.to_dict() for f in found],
        "facts": dataclasses.asdict(facts),
        "memory": {"peak_bytes": peak, "method": peak_how},
        "notes": notes,
    }


# ----------------------------------------------------------------------------- orchestration

def write_outputs(result: dict[str, Any], out: Path) -> None:
    """profile.json and profile.png in ``out`` (without matplotlib: a note instead of the PNG)."""
    from tensorpilot.files import finite, write_atomic
    from tensorpilot.profiling import plots

    png, note = plots.write_png(result, out / "profile.png")
    result.setdefault("files", {})["png"] = str(png) if png else None
    if note and note not in result["notes"]:
        result["notes"].append(note)
    result["files"]["json"] = str(out / "profile.json")
    write_atomic(out / "profile.json", json.dumps(finite(result), indent=1), "profile")




def launch(cfg: RunConfig, opts: ProfileOptions, out: Path) -> dict[str, Any]:
    """Profile on ``parallel.nproc`` processes through torchrun (as `train --nproc` does, the
    workers running `tensorpilot profile --config <out>/launch.toml`); returns rank 0's result."""
    from tensorpilot.config import to_toml
    from tensorpilot.files import write_atomic
    from tensorpilot.launch.torchrun import torchrun_args
    from tensorpilot.parallel.mesh import DistributedError

    run = dataclasses.replace(cfg, run_dir=cfg.run_dir or str(out / "run"))
    config_path = write_atomic(out / "launch.toml", to_toml(run), "launch configuration")
    args = torchrun_args(run, config_path)
    at = args.index("-m")                      # [..., "-m", "tensorpilot", "train", "--config", path]
    args = args[:at] + ["-m", "tensorpilot", "profile", "--config", str(config_path), "--steps", str(opts.steps),
                        "--warmup", str(opts.warmup), "--out", str(out), "--top-k", str(opts.top_k), "--worker"]
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(cfg.parallel.nproc, 1))))
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run as torchrun

    (out / "profile.json").unlink(missing_ok=True)
    try:
        torchrun(parse_args(args))
    except ChildFailedError as exc:
        rank, failure = min(exc.failures.items())
        raise DistributedError(f"profiling failed: worker rank {rank} exited with code {failure.exitcode} "
                               f"(its own message is above).") from None
    try:
        return json.loads((out / "profile.json").read_text())
    except (OSError, ValueError):
        raise TensorpilotError(f"the workers wrote no profile to {out / 'profile.json'}.") from None


def profile(cfg: RunConfig, workload=None, opts: ProfileOptions | None = None,
            console=None) -> dict[str, Any] | None:
    """Measure, write the outputs, and with ``opts.apply`` measure again with the top finding's
    setting; returns the result (None on ranks other than 0 of a multi-process run)."""
    from tensorpilot.files import writable_dir

    opts = opts or ProfileOptions()
    out = writable_dir(opts.out, "--out")
    result = _one(cfg, workload, opts, out, console)
    if result is None or not opts.apply:
        return result
    top = result["findings"][0] if result["findings"] else None
    if top is None:
        result["apply"] = {"applied": None, "note": "no finding: nothing to apply"}
    else:
        after = _one(with_setting(cfg, top["setting"]), workload, opts, writable_dir(out / "apply", "--out"),
                     console)
        result["apply"] = compare(result, after, top)
    write_outputs(result, out)
    return result


def _one(cfg, workload, opts, out, console):
    from tensorpilot.launch.torchrun import wants_launch

    if wants_launch(cfg):                       # --nproc N: this process starts the workers
        return launch(cfg, opts, out)
    result = measure(cfg, workload, opts, console, out)
    if result is not None:
        write_outputs(result, out)
    return result


def compare(before: dict[str, Any], after: dict[str, Any], finding: dict[str, Any]) -> dict[str, Any]:
    """Before/after of --apply: step time and time per sample (a flag may change the samples per
    step, e.g. a larger micro-batch), and the speed-up per sample."""
    b_s, a_s = before["step_time_s"]["unprofiled"], after["step_time_s"]["unprofiled"]
    b_n, a_n = before["samples_per_step"], after["samples_per_step"]
    return {"applied": finding["flag"], "kind": finding["kind"], "setting": finding["setting"],
            "before_step_s": b_s, "after_step_s": a_s, "before_samples_per_step": b_n, "after_samples_per_step": a_n,
            "before_s_per_sample": b_s / b_n, "after_s_per_sample": a_s / a_n,
            "speedup_per_sample": (b_s / b_n) / (a_s / a_n) if a_s > 0 else None,
            "after_findings": [f["kind"] for f in after["findings"]],
            "after_breakdown": {c: v["share"] for c, v in after["breakdown"].items()},
            "after_profile": after.get("files", {}).get("json")}
