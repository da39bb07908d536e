"""The trainer: ``setup`` builds a run from its configuration, its workload spec and an
execution plan; ``fit`` is a plain loop; ``apply(plan)`` is the one way to change how it runs.

    setup:  process group, device -> run directory -> execution plan (precision, batch) ->
            workload + spec -> FLOPs (meta copy) -> freeze -> parallelize -> optimizer/schedule ->
            resume -> apply(techniques: checkpointing, compile) -> data loaders
    fit:    while step < steps: train_step -> log -> evaluate -> checkpoint -> progress

Features decide for themselves inside the loop (``_maybe_save``); there is no callback bus.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shlex
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tensorpilot import attention, modules
from tensorpilot.config import RunConfig, to_toml
from tensorpilot.errors import (ConfigError, TensorpilotError, TrainingAborted, exit_at_once, first_line,
                                user_frame)
from tensorpilot.files import writable_dir, write_atomic
from tensorpilot.hardware.device import detect, resolve_device
from tensorpilot.hardware.peak import device_peak, mfu
from tensorpilot.observe import energy
from tensorpilot.observe import memory as mem
from tensorpilot.observe.flops import train_step_flops
from tensorpilot.observe.logger import MetricsLogger
from tensorpilot.observe.progress import TrainProgress
from tensorpilot.parallel.mesh import DistributedError, is_comm_failure
from tensorpilot.parallel.runtime import Parallel
from tensorpilot.training import checkpoint as ckpt_io
from tensorpilot.training import dcp, engine, fits, loader, optim, precision, predicted, rundir
from tensorpilot.training.execplan import ExecutionPlan
from tensorpilot.version import __version__
from tensorpilot.workloads import specs
from tensorpilot.workloads.base import Workload

LN2 = math.log(2.0)
# compile=auto: compiled steps timed (after the compiling one) before they are compared with eager
COMPILE_PROBE_STEPS = 3
COMPILE_NOISE = 0.03


def check_compatible(saved: dict[str, Any], cfg: RunConfig) -> None:
    """A checkpoint resumes only into the same model; say which setting differs."""
    current = cfg.to_dict()["model"]
    for key, old in saved.get("model", {}).items():
        if key in current and current[key] != old:
            raise ConfigError(f"cannot resume: the checkpoint's model.{key} is {old!r} but this run "
                              f"asks for {current[key]!r}; drop the override or start a new run.")


def _restarted_with_checkpoints(run_dir: str | None) -> bool:
    """True when torchrun restarted this group after a failure (--max-restarts) and ``run_dir``
    holds a checkpoint to continue from."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    return bool(restarts and run_dir and ckpt_io.list_checkpoints(Path(run_dir) / "checkpoints"))


class NullLogger:
    """Metrics of ranks other than 0: rank 0 writes the run's files."""

    def log(self, step: int, kind: str, values: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def _in_module_call(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside an ``nn.Module`` call (a model's forward)."""
    import traceback

    return any(f.name in ("_call_impl", "_wrapped_call_impl") and f.filename.endswith(("nn/modules/module.py",))
               for f in traceback.extract_tb(exc.__traceback__))


class Trainer:
    """Train ``workload`` (or the one ``cfg.model`` names) on one device.

    >>> from tensorpilot import RunConfig, Trainer                          # doctest: +SKIP
    >>> summary = Trainer(RunConfig()).fit()                                # doctest: +SKIP
    """

    def __init__(self, cfg: RunConfig, workload: Workload | None = None, console: Console | None = None):
        self.cfg = cfg.validate()
        self.console = console or Console(highlight=False)
        self._workload = workload
        self._stop_signal: int | None = None
        # what setup() builds, None until it has (fit() releases whatever exists on the way out)
        self.par: Parallel | None = None
        self.device: torch.device | None = None
        self.run_dir: Path | None = None
        self.model: torch.nn.Module | None = None
        self.plan: ExecutionPlan | None = None
        self.scaler: torch.amp.GradScaler | None = None
        self.batches = None
        self.metrics: MetricsLogger | NullLogger | None = None
        self.energy: energy.EnergyMeter | None = None
        self._lock: rundir.RunLock | None = None
        self.step, self.samples_seen = 0, 0
        self.last_checkpoint: Path | None = None
        self._saved_step: int | None = None
        self.tune_result = None
        self._started = False                           # the loop runs: a stop signal saves first
        self._attention_reported = False
        self._compile_probe: dict | None = None         # compile=auto measuring its compiled steps
        self.ceilings: dict[str, float] | None = None   # measured bf16/fp32 matmul ceilings (CPU, auto)
        self.optim_cfg, self._optim_why = self.cfg.optim, ""   # --optimize auto may pick a lighter optimizer

    # ------------------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Build everything the loop needs, in this order: process group and device -> run
        directory (resuming: the checkpoint's files checked) -> the execution plan's first
        decisions (precision, batch) -> workload and its spec -> FLOPs (meta copy) -> freeze ->
        parallelize (several processes) -> optimizer, schedule -> resume -> the techniques through
        ``apply`` (one process) -> data loaders."""
        cfg = self.cfg
        t_setup = time.perf_counter()
        # one process, or one rank of a torchrun/srun group (joins it here); see parallel/runtime.py
        self.par = Parallel.init(cfg.parallel, resolve_device(cfg.train.device).split(":")[0])
        if not self.par.is_main:                        # rank 0 alone talks and writes files
            self.console = Console(quiet=True)
        say = self.console.print
        self.device = self.par.ctx.device or torch.device(resolve_device(cfg.train.device))
        self.caps = detect(str(self.device))
        self.energy = energy.choose(energy.probe(str(self.device)))    # counter or labelled estimate

        # torchrun restarted the group after a failure: continue from this run's newest checkpoint
        resume = "latest" if _restarted_with_checkpoints(cfg.run_dir) else cfg.resume
        run_dir, resume_from = rundir.resolve(cfg.run_dir, resume, cfg.model.name, cfg.model.size)
        if resume_from is not None:
            saved = ckpt_io.read_meta(resume_from)
            check_compatible(saved.get("config", {}), cfg)
            # the optimizer whose state the checkpoint holds (--optimize auto may have chosen it)
            saved_opt = saved.get("optimizer") or (saved.get("config", {}).get("optim") or {}).get("name", "adamw")
            if saved_opt != cfg.optim.name and not (cfg.engine.optimize == "auto" and saved.get("optimizer")):
                raise ConfigError(f"cannot resume: the checkpoint's optimizer state is {saved_opt}'s but this "
                                  f"run asks for {cfg.optim.name}; resume with --optim.name {saved_opt}.")
            if saved_opt != cfg.optim.name:
                self.optim_cfg = dataclasses.replace(cfg.optim, name=saved_opt)
                self._optim_why = f"{saved_opt}, as the checkpoint's run chose"
            if isinstance(saved.get("step"), int) and saved["step"] >= cfg.train.steps:
                raise ConfigError(f"the checkpoint is already at step {saved['step']}: ask for more "
                                  f"with --steps (now {cfg.train.steps}), e.g. --steps {2 * saved['step']}.")
            # the checkpoint's files are checked before anything is built: a damaged or doctored
            # one is refused in a second, not after the model, its FLOP count and the planner's trace
            optim.prepare(self.optim_cfg, self.device.type)     # so torch.load knows its state's types
            ckpt_io.check_state(resume_from, (dcp.check if dcp.is_dcp(saved) else ckpt_io.check)(resume_from, saved))
        # a run directory named after the clock: rank 0's name everywhere; checked before any work
        self.run_dir = writable_dir(self.par.same_everywhere(str(run_dir)), "run directory")
        if self.par.is_main:                            # one run at a time writes here
            writable_dir(self.run_dir / "checkpoints", "checkpoint directory")
            self._lock = rundir.lock(self.run_dir)

        torch.manual_seed(cfg.train.seed)
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = not cfg.train.deterministic

        # the plan of the model as built: no technique applied yet (apply() adds them below)
        self.ceilings = self._ceilings()                # read once: precision and autotune use them
        choice = precision.choose(cfg.engine.precision, self.caps, self.ceilings)
        self.plan = ExecutionPlan(
            device=str(self.device), precision=choice.name, micro_batch=cfg.data.batch_size,
            grad_accum=cfg.engine.grad_accum, num_workers=cfg.data.num_workers,
            layout=self.par.layout,
            reasons=(("precision", choice.reason),))
        self._set_precision(choice)

        if self._workload is None:
            from tensorpilot.workloads import registry

            self._workload = registry.build(cfg.model, cfg.data, cfg.train.seed, self._fits)
        else:
            wl = self._workload
            self._fits(lambda: wl.model, wl.train_data, wl.meta, wl.loss_fn)
        self.workload = wl = self._workload
        self.spec = specs.get(wl.kind)
        self.model = wl.model.to(self.device)
        # every F.scaled_dot_product_attention call of the model goes through this mode while it
        # runs forward (tensorpilot.attention): the faster correct kernel per call shape
        self.attention = attention.router(cfg.engine.attention, self.device.type)
        self.plan = self.plan.replace(attention=cfg.engine.attention, why={"attention": {
            "auto": ("auto: SDPA calls timed against blocked matmuls per shape on the first step"
                     if self.attention.mode == "auto" else attention.AUTO_ON_ACCELERATORS),
            "blocked": "blocked matmuls wherever they compute the call exactly (as requested)",
            "sdpa": "sdpa: PyTorch's kernels as the model calls them (as requested)"}[cfg.engine.attention]})
        self.host_memory = (engine.retain_freed_host_memory()
                            if self.device.type == "cpu" and cfg.engine.retain_host_memory else None)
        self.n_params = sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())

        # FLOPs of one micro-batch, counted before any wrapping (model FLOPs, not recompute); the
        # global batch, and so the FLOPs of a step, stay the same whatever micro-batch is chosen
        sample = self._sample_batch()
        self.flops_per_step = train_step_flops(self.model, sample[0], sample[1], wl.loss) * cfg.engine.grad_accum

        self.frozen = optim.freeze(self.model, cfg.optim.freeze) if cfg.optim.freeze else []
        self.prediction = self._predict(sample) if cfg.train.predict and self.par.is_main else None
        self.ac_blocks, self.step_model, self._compile_unproven = 0, self.model, False
        if self.par.active:
            if resume_from is not None:                 # saved optimizer index -> parameter name
                self._opt_names = dcp.optimizer_names(self.model, optim.build_optimizer(
                    self.model, self.optim_cfg, self.device.type)[0])
            # pipeline split -> tensor parallel -> activation checkpointing -> compile (per block)
            # -> FSDP/DDP, in that fixed order (reasons in parallel/runtime.py); a parallelized
            # model keeps these techniques for the whole run
            compiled = cfg.engine.compile == "on"
            self.model, self.step_model, self.ac_blocks = self.par.parallelize(
                self.model, self.spec, activation_checkpointing=cfg.engine.activation_checkpointing,
                compile=compiled, precision_dtype=choice.name if choice.name in ("bf16", "fp16") else "fp32",
                batch_size=cfg.data.batch_size, loss_fn=wl.loss, grad_accum=cfg.engine.grad_accum,
                device=self.device)
            self.plan = self.plan.replace(
                activation_checkpointing="blocks" if self.ac_blocks else "none",
                compile="on" if compiled else "off",
                why={"compile": "compile on as requested (per block)" if compiled else
                     "not compiling a distributed run (ask with --compile on)"})
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt, opt_impl = optim.build_optimizer(self.model, self.optim_cfg, self.device.type)
        label = f"{optim.LABELS[self.optim_cfg.name]} ({opt_impl})" + (f": {self._optim_why}" if self._optim_why else "")
        self.plan = self.plan.replace(optimizer=opt_impl, why={"optimizer": label})
        self.sched = optim.build_scheduler(self.opt, cfg.optim, cfg.train.steps)

        if resume_from is not None:
            self._restore(resume_from)
            if self.step >= cfg.train.steps:
                raise ConfigError(f"the checkpoint is already at step {self.step}: ask for more "
                                  f"with --steps (now {cfg.train.steps}).")

        if not self.par.active:                         # the techniques, through the one door
            compile_on, why = engine.compile_decision(cfg.engine.compile, self.caps, cfg.train.steps - self.step)
            self.apply(self.plan.replace(
                activation_checkpointing="blocks" if cfg.engine.activation_checkpointing else "none",
                compile={True: "on", False: "off", None: "pending"}[compile_on], why={"compile": why}))
        if self.batches is None:
            self.rebuild_batches()
        skipped = len(modules.repeated_blocks(self.model)) - self.ac_blocks if self.plan.checkpointing else 0
        if skipped and not self.par.active:
            say(f"  activation checkpointing skips {skipped} blocks with BatchNorm (recomputing them "
                "would update running statistics twice)")

        # the run starts for real: what an earlier run left here that contradicts it goes aside
        moved = rundir.prepare(self.run_dir, resume_from) if self.par.is_main else None
        self.par.barrier()                              # nobody writes the run directory mid-move
        if self.par.is_main:
            write_atomic(self.run_dir / "config.toml", to_toml(cfg), "configuration")
        # a resumed run's TensorBoard hides what an abandoned run logged after the resumed step
        self.metrics = (MetricsLogger(self.run_dir, cfg.logging.tensorboard, purge_step=self.step + 1 if self.step else None)
                        if self.par.is_main else NullLogger())
        self.setup_s = time.perf_counter() - t_setup

        plan = self.plan
        say(f"[bold]tensorpilot[/] {wl.kind} ({self.n_params / 1e6:.2f}M parameters) on "
            + escape(f"{self.caps.name} [{self.device}] -> {self.run_dir}"))
        say(f"  precision: {escape(plan.reason('precision'))}")
        say(f"  compile:   {escape(plan.reason('compile'))}")
        say(f"  optimizer: {plan.reason('optimizer')}, lr {cfg.optim.lr:g}, warm-up {cfg.optim.warmup_steps}, "
            f"cosine to {cfg.optim.min_lr_ratio:g}x; batch {plan.micro_batch} x {plan.grad_accum} "
            f"micro-batches" + (f"; activation checkpointing on {self.ac_blocks} blocks" if self.ac_blocks else "")
            + (f"; {len(self.frozen)} frozen tensors" if self.frozen else ""))
        if plan.attention:
            say(f"  attention: {escape(plan.reason('attention'))}")
        say(f"  energy:    {escape(self.energy.how)}")
        if self.host_memory:
            say(f"  memory:    {escape(self.host_memory)}")
        if self.par.active:
            say(f"  parallel:  {escape(self.par.describe())}")
        if resume_from is not None:
            say(f"  resumed:   {escape(str(resume_from))} (step {self.step})")
        if moved:
            say(f"  run dir:   {escape(moved)}")

    # ------------------------------------------------------------------- the one way to change
    def apply(self, plan: ExecutionPlan) -> None:
        """Run from now on as ``plan`` says: undo and redo what differs from the current plan
        (precision and loss scaling, micro-batch x accumulation and loader workers, activation
        checkpointing, memory format, compilation). Parameters, optimizer state, the step and
        the data position are untouched: training continues where it is. The device, the layout
        and the optimizer implementation are fixed once the trainer is built."""
        old = self.plan
        if not plan.same_devices(old) or plan.optimizer != old.optimizer:
            raise ValueError(f"the device, layout and optimizer of a built trainer cannot change "
                             f"({old.device} {old.layout.name} {old.optimizer} -> "
                             f"{plan.device} {plan.layout.name} {plan.optimizer})")
        if self.par.active and any(getattr(plan, k) != getattr(old, k) for k in (
                "activation_checkpointing", "compile", "compile_mode", "memory_format", "micro_batch")):
            raise ValueError("a parallelized model keeps its techniques and micro-batch for the whole run")
        if plan.precision != old.precision:
            self._set_precision(precision.choose(plan.precision, self.caps))
        if plan.attention != old.attention:
            self.attention = attention.router(plan.attention, self.device.type)
        if plan.activation_checkpointing != old.activation_checkpointing:
            if plan.checkpointing:
                self.ac_blocks, _ = modules.apply_activation_checkpointing(self.model)
            else:
                modules.remove_activation_checkpointing(self.model)
                self.ac_blocks = 0
        if plan.memory_format != old.memory_format:     # moves 4-D weights; others are unchanged
            self.model.to(memory_format=torch.channels_last if plan.memory_format == "channels_last"
                          else torch.contiguous_format)
        recompile = (plan.compile, plan.compile_mode) != (old.compile, old.compile_mode) \
            or (plan.compiled and plan.micro_batch != old.micro_batch)
        if recompile and not self.par.active:
            eager = modules.undo_compile(self.model)
            # static shapes: one graph per micro-batch (the run keeps one micro-batch after tuning)
            self.step_model = modules.apply_compile(eager, plan.compile_mode, dynamic=False) if plan.compiled else eager
            self._compile_unproven = plan.compiled     # the first step falls back to eager if it fails
            blocks = modules.repeated_blocks(self.model)
            plan = plan.replace(compile_scope="blocks" if plan.compile_mode == "default" and blocks else "model")
        self.plan = plan
        if self.batches is not None and (plan.micro_batch, plan.grad_accum, plan.num_workers) \
                != (old.micro_batch, old.grad_accum, old.num_workers):
            self.rebuild_batches()

    def _set_precision(self, choice: precision.PrecisionChoice) -> None:
        """Autocast dtype, loss scaling (fp16 on CUDA) and TF32 for ``choice``."""
        self.choice = choice
        if choice.grad_scaler and self.scaler is None:
            self.scaler = torch.amp.GradScaler(self.device.type)
        elif not choice.grad_scaler:
            self.scaler = None
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = choice.tf32
            torch.backends.cudnn.allow_tf32 = choice.tf32

    def _ceilings(self) -> dict[str, float] | None:
        """Measured bf16 and fp32 matmul ceilings where ``precision=auto`` must choose between
        them on a CPU (cached per machine by the hardware probe; measured once, ~2 s)."""
        if self.cfg.engine.precision != "auto" or self.caps.kind != "cpu" or not self.caps.supports_bf16_fast:
            return None
        from tensorpilot.hardware.probe import quick_ceiling

        return {dt: quick_ceiling(str(self.device), dt)[0] for dt in ("bf16", "fp32")}

    def _fits(self, build, train_data, meta: dict, loss_fn=None):
        """``registry.Fits``: one sentence when the run cannot fit in this device's memory,
        before the model is allocated (built-in models) or trained (a user's model)."""
        if not self.cfg.train.memory_check:
            return build()
        lay = self.par.layout
        kw = dict(device=self.device, batch_size=self.plan.micro_batch,
                  seed=self.cfg.train.seed, half_precision=self.choice.autocast is not None,
                  grad_accum=self.plan.grad_accum, planner=self._planner_model(meta),
                  # ranks of one machine share its host memory; GPUs are one per process
                  share=int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if self.device.type == "cpu" else 1,
                  states_split=lay.tp * lay.pp * (lay.dp if lay.sharding == "fsdp" else 1), activations_split=lay.tp)
        try:
            return fits.guard(build, train_data, meta, loss_fn, optimizer=self.optim_cfg.name, **kw)
        except fits.DoesNotFit as exc:
            # --optimize auto: memory, not speed, is the limit -- take the optimizer with less state
            # that fits (nothing is trained yet, so nothing is lost by choosing it now)
            if not (self.cfg.engine.optimize == "auto" and exc.lighter):
                raise
            lighter = exc.lighter
        self.optim_cfg = dataclasses.replace(self.optim_cfg, name=lighter)
        self._optim_why = f"autotune: AdamW's state would not fit in {self.device.type} memory"
        return fits.guard(build, train_data, meta, loss_fn, optimizer=lighter, **kw)

    def rebuild_batches(self) -> None:
        """(Re)start the device-prefetched loader at ``samples_seen`` with the current micro-batch
        and workers (autotune changes them between trials; the sample order stays the same)."""
        plan, pin = self.plan, self.device.type == "cuda"
        # data-parallel rank r of dp reads its B samples of every global batch of B * dp
        self.batches = loader.DevicePrefetcher(
            loader.make_loader(self.workload.train_data, plan.micro_batch, self.samples_seen,
                               plan.num_workers, pin, self.cfg.train.seed,
                               rank=self.par.dp_rank, world=self.par.dp), self.device)

    def _tuning_step(self) -> None:
        """One real training step run by autotune, accounted like the loop's own steps."""
        loss, gnorm, applied = self.train_step(fallback=False)    # the tuner handles a failed compile
        self.step += 1
        self.samples_seen += self.plan.samples_per_step
        self.metrics.log(self.step, "train", {"loss": loss, "grad_norm": gnorm, "autotune_trial": 1})

    def _autotune(self) -> None:
        from tensorpilot.training import autotune

        if self.par.active:
            self.console.print("  autotune:  not in multi-process runs yet; using the configuration as given")
            return
        self.tune_result = autotune.tune(self, self._tuning_step)
        self.plan = self.plan.replace(why={"compile": f"autotune: {'compiled' if self.plan.compiled else 'eager'} "
                                                      f"({self.tune_result.reason})"})
        mem.reset_peak(str(self.device))                # the peak of the run, not of the trials

    def _sample_batch(self):
        """One micro-batch as training will see it (for FLOP counting on the meta copy)."""
        return next(iter(loader.make_loader(self.workload.train_data, self.plan.micro_batch, 0, 0,
                                            False, self.cfg.train.seed)))

    def autocast(self):
        if self.choice.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.choice.autocast))

    # -------------------------------------------------------------------------- the step
    def _update(self, batches) -> tuple[float, float, bool]:
        """One optimizer step over ``batches`` (micro-batches already on the device).
        Returns (mean loss, gradient norm before clipping, whether the step was applied)."""
        model, opt, scaler = self.step_model, self.opt, self.scaler
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(batches):
            # DDP/FSDP: gradients are reduced on the last micro-batch only
            with self.par.grad_sync(model, enabled=i == len(batches) - 1):
                if self.par.pipelined:                  # the schedule runs forward and backward
                    with self.autocast(), self._routing():
                        total += self.par.pipeline_step(x, y)
                    continue
                with self.autocast(), self._routing():
                    loss = self.workload.loss(model(x), y) / len(batches)
                (scaler.scale(loss) if scaler is not None else loss).backward()
            total += loss.detach().float()
        if scaler is not None:
            scaler.unscale_(opt)                        # clip true gradients, not scaled ones
        clip = self.cfg.optim.grad_clip or math.inf
        if self.par.active:                             # the norm over all ranks' shards
            norm = self.par.clip_grad_norm(self.params, clip)
            total = self.par.mean_over_dp(total)        # the global batch's loss, for logging
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.params, clip, foreach=True)
        loss_value, norm_value = torch.stack([total, norm.float()]).tolist()   # one host sync
        finite = math.isfinite(loss_value) and (scaler is not None or math.isfinite(norm_value))
        if scaler is not None:
            scaler.step(opt)                            # skips by itself when gradients overflowed
            scaler.update()
        elif finite:
            opt.step()
        opt.zero_grad(set_to_none=True)
        self.sched.step()
        return loss_value, norm_value, finite

    def _compile_signature(self) -> str:
        return engine.block_signature(self.model, micro_batch=self.plan.micro_batch,
                                      precision=self.plan.precision, device_name=self.caps.name)

    def _maybe_compile(self, step_s: float) -> None:
        """compile=auto: decide once an eager step has been timed (the first, warm-up step is
        not), from the compile time and gain measured by an earlier run of this model here (or
        the priors); then measure this run's compile time and compiled steps, record them for the
        next run, and go back to eager if the compiled steps are not faster."""
        probe = self._compile_probe
        if probe is not None:
            self._probe_compiled_step(probe, step_s)
            return
        if self.plan.compile != "pending":
            return
        record = engine.load_compile_record(self._compile_signature())
        on, why = engine.compile_decision(self.cfg.engine.compile, self.caps,
                                          self.cfg.train.steps - self.step, step_s, record)
        self.apply(self.plan.replace(compile="on" if on else "off", why={"compile": why}))
        self.console.print(f"  compile:   {escape(why)}")
        if on:
            self._compile_probe = {"eager_s": step_s, "first_s": None, "steps": []}

    def _probe_compiled_step(self, probe: dict, step_s: float) -> None:
        if not self.plan.compiled:                   # compilation failed and fell back to eager
            self._compile_probe = None
            return
        if probe["first_s"] is None:                 # the first compiled step pays the compile
            probe["first_s"] = step_s
            return
        probe["steps"].append(step_s)
        if len(probe["steps"]) < COMPILE_PROBE_STEPS:
            return
        self._compile_probe = None
        compiled = sorted(probe["steps"])[len(probe["steps"]) // 2]
        engine.save_compile_record(self._compile_signature(), probe["first_s"] - probe["eager_s"],
                                   probe["eager_s"], compiled)
        if compiled > probe["eager_s"] * (1 + COMPILE_NOISE):
            why = (f"{self.plan.reason('compile')} -> measured {compiled * 1e3:.0f} ms compiled vs "
                   f"{probe['eager_s'] * 1e3:.0f} ms eager per step: back to eager")
            self.apply(self.plan.replace(compile="off", why={"compile": why}))
            self.console.print(f"  compile:   {escape(why)}")

    def _routing(self):
        """The attention mode around a forward pass; none at all with engine.attention=sdpa (a
        mode sees every torch call the model makes: nothing to route, nothing to pay)."""
        return self.attention if self.attention.mode != "sdpa" else contextlib.nullcontext()

    def _report_attention(self) -> None:
        """After the first step: what the model's SDPA calls run on, with the times measured."""
        self._attention_reported = True
        why = f"{self.plan.attention}: {self.attention.describe()}"
        self.plan = self.plan.replace(why={"attention": why})
        self.console.print(f"  attention: {escape(why)}")

    def train_step(self, fallback: bool = True) -> tuple[float, float, bool]:
        """One optimizer step. The first step after compilation was switched on falls back to
        eager when the compiler fails (``fallback``); any other error is the caller's."""
        batches = [next(self.batches) for _ in range(self.plan.grad_accum)]
        if not (self._compile_unproven and fallback):
            result = self._update(batches)
            self._compile_unproven = False
            return result
        try:
            result = self._update(batches)
        except engine.compiler_errors() as exc:
            self.console.print(f"[yellow]torch.compile failed ({type(exc).__name__}: {first_line(exc)}); "
                               "continuing in eager mode.[/]")
            self.opt.zero_grad(set_to_none=True)
            self.apply(self.plan.replace(compile="off", why={
                "compile": self.plan.reason("compile") + " -> failed, fell back to eager"}))
            result = self._update(batches)
        self._compile_unproven = False
        return result

    # ---------------------------------------------------------------------------- the loop
    def fit(self) -> dict[str, Any]:
        """Train to ``train.steps`` and return the summary. Whatever happens -- a stop signal,
        a user error, a bug -- the signal handlers, the progress display, the metrics files and
        the process group are released on the way out."""
        previous, progress, clean = None, None, False
        try:
            previous = self._install_signal_handlers()
            if self.model is None:
                self.setup()
            self._started = True                        # from here a stop signal saves a checkpoint
            progress = TrainProgress(self.console, self.cfg.train.steps, self.step,
                                     self.cfg.logging.progress if self.par.is_main else "off",
                                     self.cfg.train.log_interval)
            summary = self._loop(progress)
            clean = True
        except Exception as exc:                         # noqa: BLE001 - _explain keeps what it cannot explain
            raise self._explain(exc) from None
        finally:
            if progress is not None:
                progress.close()
            self._restore_signal_handlers(previous)
            self.close(clean)
        self.print_summary(summary)
        return summary

    def close(self, clean: bool = True) -> None:
        """Release what ``setup`` acquired (metrics files, the run directory's lock, the process
        group, the energy meter); ``fit`` calls it on its way out, a caller that drives
        ``train_step`` itself (tensorpilot profile) when done. ``clean``: every rank got here
        without an error (the ranks then meet before leaving the process group)."""
        if self.metrics is not None:
            self.metrics.close()
        if self._lock is not None:
            self._lock.release()
        if self.energy is not None:
            self.energy.close()
        if self.par is not None:
            self.par.close(clean)

    def _explain(self, exc: BaseException) -> BaseException:
        """An error a user can cause, as one sentence; anything else unchanged (a bug): out of
        memory, lost peers, and a `--model PKG:FACTORY` model failing on its data (raised inside a
        module call of a model tensorpilot did not build: a wrong input width, token ids beyond the
        vocabulary). A Python API caller's own model keeps its exception: it is their code to debug."""
        if isinstance(exc, TensorpilotError) or not isinstance(exc, Exception):
            return exc
        name = self.cfg.model.name
        factory = ":" in name and not name.startswith("python:")
        if factory and self._workload is not None and self._workload.kind == "custom" and _in_module_call(exc):
            where = user_frame(exc) or ""
            return ConfigError(f"the model ({self.cfg.model.name}) raised {type(exc).__name__}{where} on the "
                               f"training data at step {self.step}: {first_line(exc)}; check that the data fits "
                               "the model's inputs (shapes, dtypes, token ids below the vocabulary size).")
        if self.device is None or not isinstance(exc, RuntimeError):   # setup did not get that far
            return exc
        if self.par.active and is_comm_failure(exc):
            return DistributedError(f"rank {self.par.ctx.rank} lost its peers at step {self.step} "
                                    f"({first_line(exc)}): another process crashed or the network "
                                    "failed; rerun with --max-restarts to recover from checkpoints.")
        if isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in str(exc) \
                or "not enough memory" in str(exc):
            return TrainingAborted(f"ran out of {self.device.type} memory at step {self.step} "
                                   f"({first_line(exc, 160)}); use a smaller --batch-size or model, "
                                   f"or --engine.activation_checkpointing. {self._last_good_note()}")
        return exc

    def _loop(self, progress: TrainProgress) -> dict[str, Any]:
        cfg = self.cfg
        t_fit = time.perf_counter()
        self.energy.start()                             # energy_j: the loop, setup excluded
        first_step, timed_s, timed_steps, timed_j = self.step, 0.0, 0, 0.0
        self._step_peak, self._step_ops = (None, None), []
        window: list[float] = []
        bad_streak, skipped = 0, 0
        last_loss = last_val = float("nan")
        initial_val = self.evaluate() if self.step == 0 else None
        if initial_val is not None:
            self.metrics.log(0, "val", {"loss": initial_val, **self._bpb(initial_val)})
        if cfg.engine.optimize == "auto" and self.step < cfg.train.steps:
            self._autotune()
            first_step = self.step                      # trials are steps; the loop's first is warm-up
        # the second step is profiled for its memory peak and op times when enough steps remain
        # to time others (the profiler slows it; it is not timed)
        profiled = first_step + 1 if self.prediction is not None and cfg.train.steps - first_step >= 4 else None
        while self.step < cfg.train.steps:
            j0 = self.energy.read()
            t0 = time.perf_counter()
            loss, gnorm, applied = self._profiled_step() if self.step == profiled else self.train_step()
            dt = time.perf_counter() - t0
            step_j = self.energy.read() - j0            # the step ends in a host sync (_update)
            self.step += 1
            self.samples_seen += self.plan.samples_per_step
            if self.step > first_step + 1 and self.step - 1 != profiled:   # the first pays warm-up/compile
                timed_s, timed_steps, timed_j = timed_s + dt, timed_steps + 1, timed_j + step_j
                self._maybe_compile(dt)
            if not self._attention_reported and self.attention.mode != "sdpa":
                self._report_attention()
            bad_streak = 0 if applied else bad_streak + 1
            skipped += not applied
            if bad_streak >= cfg.train.max_bad_steps:
                raise TrainingAborted(
                    f"stopped at step {self.step}: the loss or gradients were not finite for "
                    f"{bad_streak} consecutive steps (each was skipped); lower --optim.lr or use "
                    f"--precision bf16/fp32. {self._last_good_note()}")
            if applied:
                window.append(loss)
                last_loss = loss
            rate = self.plan.samples_per_step / dt
            if self.step % cfg.train.log_interval == 0 or self.step == cfg.train.steps:
                self.metrics.log(self.step, "train", {
                    "loss": sum(window) / len(window) if window else float("nan"),
                    "lr": float(self.sched.get_last_lr()[0]), "grad_norm": gnorm, "step_s": dt,
                    "samples_per_s": rate, **self._tokens(rate), "skipped_steps": skipped})
                window = []
            if self.step % cfg.train.eval_interval == 0 or self.step == cfg.train.steps:
                last_val = self.evaluate()
                self.metrics.log(self.step, "val", {"loss": last_val, **self._bpb(last_val)})
            if bad_streak == 0:                         # never checkpoint a non-finite state
                self._maybe_save()
            tok = self._tokens(rate).get("tokens_per_s")
            progress.update(self.step, f"loss {last_loss:.3f}  "
                            + (f"{tok:,.0f} tok/s" if tok else f"{rate:,.1f} samples/s"))
            stop = self._agreed_stop()
            if stop:                                    # every rank stops here, at the same step
                self._save(force=True)
                name = signal.Signals(stop).name
                summary = self._summary(t_fit, timed_s, timed_steps, last_loss, last_val, initial_val, skipped,
                                        timed_j)
                summary["interrupted"] = name
                self._write_summary(summary)
                raise TrainingAborted(
                    f"interrupted by {name} at step {self.step}; checkpoint saved, continue with "
                    f"`tensorpilot train --resume {shlex.quote(str(self.run_dir))}`.", exit_code=130)
        summary = self._summary(t_fit, timed_s, timed_steps, last_loss, last_val, initial_val, skipped,
                                timed_j)
        self._write_summary(summary)
        return summary

    def _agreed_stop(self) -> int:
        """The stop signal any rank has seen (0: none), the same on every rank: a signal that
        reaches one process stops the whole group at this step boundary, and the collective
        checkpoint save that follows finds every rank in it (one tiny all-reduce per step)."""
        return self.par.agree_max(self._stop_signal or 0)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the same ``eval_batches`` validation micro-batches every time (eager:
        evaluation would otherwise cost a second compilation for eval mode)."""
        with torch.compiler.set_stance("force_eager"):    # compiled blocks run their eager code
            return self._evaluate()

    def _evaluate(self) -> float:
        val = self.workload.val_data
        if val is None:
            return float("nan")
        model = self.model
        was_training = model.training
        model.eval()
        it = iter(val if isinstance(val, torch.utils.data.DataLoader)
                  else loader.make_loader(val, self.plan.micro_batch, 0, 0, False, self.cfg.train.seed + 1))
        total, n = torch.zeros((), device=self.device), 0
        for _ in range(self.cfg.train.eval_batches):
            if self._stop_signal is not None and not self.par.pipelined:
                break                                   # a stop signal does not wait out a long evaluation
            try:
                x, y = loader.to_device(next(it), self.device, non_blocking=False)
            except StopIteration:
                break
            with self.autocast(), self._routing():
                if self.par.pipelined:
                    total += self.par.pipeline_step(x, y, train=False) * self.plan.grad_accum
                else:
                    total += self.workload.loss(model(x), y).float()
            n += 1
        model.train(was_training)
        return total.item() / n if n else float("nan")

    # ------------------------------------------------------------------ checkpoints, signals
    def _state(self, optimizer: bool = True) -> dict[str, Any]:
        return {
            **({"optimizer": self.opt.state_dict()} if optimizer else {}),
            "scheduler": self.sched.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else {},
            "step": self.step, "samples_seen": self.samples_seen,
            "rng": {"cpu": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else []},
        }

    def _meta(self) -> dict[str, Any]:
        return {"tensorpilot": __version__, "torch": torch.__version__, "config": self.cfg.to_dict(),
                "workload": {"kind": self.workload.kind, **self.workload.meta},
                "precision": self.choice.name, "device": str(self.device), "optimizer": self.optim_cfg.name}

    def _save(self, force: bool = False) -> Path | None:
        if not (self.cfg.checkpoint.enabled or force):
            return None
        if self._saved_step == self.step:   # e.g. a stop right after an interval save
            return self.last_checkpoint
        self._saved_step = self.step
        if self.par.active:                             # every rank writes its shards
            self.last_checkpoint = dcp.save(self.run_dir / "checkpoints", self.step, self.model, self.opt,
                                            self._state(optimizer=False), self._meta(),
                                            self.cfg.checkpoint.keep, self.par.is_main)
            return self.last_checkpoint
        self.last_checkpoint = ckpt_io.save(self.run_dir / "checkpoints", self.step, self.model,
                                            self._state(), self._meta(), self.cfg.checkpoint.keep)
        return self.last_checkpoint

    def _maybe_save(self) -> None:
        if self.step % self.cfg.checkpoint.interval == 0 or self.step == self.cfg.train.steps:
            self._save()

    def _last_good_note(self) -> str:
        if self.run_dir is None:
            return "No checkpoint was written."
        ckpts = ckpt_io.list_checkpoints(self.run_dir / "checkpoints")
        return f"The last good checkpoint is {ckpts[-1]}." if ckpts else "No checkpoint was written."

    def _restore(self, path: Path) -> None:
        configured = [{k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups]
        self._restore_state(path)
        self._apply_configured(configured)

    def _apply_configured(self, configured: list[dict[str, Any]]) -> None:
        """A resumed run's configuration is the checkpoint's, overridden by the command line: the
        optimizer's hyperparameters (betas, weight decay, implementation) and the schedule's peak
        rate follow this run's configuration, not the saved state, which would silently keep
        the old ones (with nothing overridden they are the same values)."""
        for group, conf in zip(self.opt.param_groups, configured):
            group.update({k: v for k, v in conf.items() if k not in ("lr", "initial_lr")})
        self.sched.base_lrs = [conf["initial_lr"] for conf in configured]
        # the rate of the current step, as LambdaLR.get_lr computes it
        rates = [base * lam(self.sched.last_epoch) for base, lam in zip(self.sched.base_lrs, self.sched.lr_lambdas)]
        for group, rate in zip(self.opt.param_groups, rates):
            if isinstance(group["lr"], torch.Tensor):   # torchao keeps lr as a tensor (no recompiles)
                group["lr"].fill_(rate)
            else:
                group["lr"] = rate
        self.sched._last_lr = rates

    def _restore_state(self, path: Path) -> None:
        # setup() checked the files (checksums, state.pt's structure) before it built the model
        if dcp.is_dcp(ckpt_io.read_meta(path)):         # written by a distributed run
            st = dcp.load(path, self.model, self.opt)
        elif self.par.active:                           # a one-process checkpoint, resharded
            st = dcp.load_single(path, self.model, self.opt, self._opt_names)
        else:
            ckpt_io.load_weights(path, self.model)
            st = ckpt_io.load_state(path)
        try:
            if "optimizer" in st and not self.par.active:
                self.opt.load_state_dict(st["optimizer"])
            sched = st["scheduler"]
            if len(sched.get("base_lrs", [])) != len(self.opt.param_groups):
                # another layout groups parameters differently (tensor parallel splits plain and
                # DTensor ones); every group has the same schedule, so repeat the first
                n = len(self.opt.param_groups)
                sched = dict(sched, base_lrs=sched["base_lrs"][:1] * n, _last_lr=sched["_last_lr"][:1] * n)
            self.sched.load_state_dict(sched)
            if self.scaler is not None and st.get("scaler"):
                self.scaler.load_state_dict(st["scaler"])
            self.step, self.samples_seen = st["step"], st["samples_seen"]
            torch.set_rng_state(st["rng"]["cpu"])
            if self.device.type == "cuda" and st["rng"]["cuda"]:
                torch.cuda.set_rng_state_all(st["rng"]["cuda"])
        # state.pt passed its checksum and check_state but may still not fit this optimizer
        except (KeyError, ValueError, RuntimeError, TypeError, AttributeError, IndexError) as exc:
            raise ckpt_io.CheckpointError(f"checkpoint {str(path)!r} cannot restore this run's "
                                          f"training state: {first_line(exc)}.") from None
        self.last_checkpoint = path

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum, frame):
            name = signal.Signals(signum).name
            if not self._started:    # still setting up: nothing to save yet
                if signum == signal.SIGINT:             # Python's own way (a notebook survives it)
                    raise KeyboardInterrupt
                exit_at_once("train", f"interrupted by {name} before training started; no checkpoint "
                                      "was written.")
            if self._stop_signal is not None:
                if self.par.active:                 # torchrun forwards the launcher's signal too:
                    return                          # the save under way must not be cut short
                raise KeyboardInterrupt              # a second Ctrl-C stops at once
            self._stop_signal = signum
            again = "" if self.par.active else " (again to stop at once)"
            self.console.print(f"\n[yellow]{name} received: finishing this step, "
                               f"saving a checkpoint, then stopping{again}.[/]")

        # SIGHUP: the terminal went away (a closed ssh session) -- a stop, like SIGTERM; unless
        # it is ignored (nohup): then it stays ignored
        stops = (signal.SIGINT, signal.SIGTERM) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())
        previous = {s: signal.getsignal(s) for s in stops}
        for s, before in previous.items():
            if before is not signal.SIG_IGN or s != getattr(signal, "SIGHUP", None):
                signal.signal(s, handler)
        return previous

    @staticmethod
    def _restore_signal_handlers(previous) -> None:
        for s, h in (previous or {}).items():
            signal.signal(s, h)

    # ------------------------------------------------------------------------------ summary
    def _tokens(self, samples_per_s: float) -> dict[str, float]:
        tps = self.workload.tokens_per_sample
        return {"tokens_per_s": samples_per_s * tps} if tps else {}

    def _bpb(self, loss: float) -> dict[str, float]:
        # byte-level language model: nats per byte / ln 2 = bits per byte
        return {"bpb": loss / LN2} if self.spec.bits_per_byte else {}

    def _summary(self, t_fit, timed_s, timed_steps, last_loss, last_val, initial_val, skipped,
                 timed_j) -> dict[str, Any]:
        cfg, plan = self.cfg, self.plan
        steps_per_s = timed_steps / timed_s if timed_steps else None
        samples_per_s = steps_per_s * plan.samples_per_step if steps_per_s else None
        achieved = self.flops_per_step * steps_per_s if steps_per_s else None
        peak = device_peak(str(self.device), self.choice.matmul_dtype)
        basis_flops, basis_source = peak.mfu_basis
        peak_bytes, peak_method = mem.peak_memory(str(self.device))
        out = {
            "tensorpilot": __version__, "run_dir": str(self.run_dir),
            "model": cfg.model.name, "size": cfg.model.size, "parameters": self.n_params,
            "device": str(self.device), "device_name": self.caps.name,
            "precision": plan.precision, "precision_reason": plan.reason("precision"),
            "compiled": plan.compiled, "compile_reason": plan.reason("compile"),
            "activation_checkpointing": bool(self.ac_blocks), "grad_accum": plan.grad_accum,
            "optimizer": plan.reason("optimizer"), "optimizer_state_bytes": optim.state_bytes(self.opt),
            "attention": plan.reason("attention") or None,
            "attention_calls": self.attention.report(),
            "host_memory": self.host_memory, "execution_plan": plan.to_dict(),
            "steps": self.step, "skipped_steps": skipped,
            "samples_per_s": samples_per_s, "tokens_per_s": (samples_per_s * self.workload.tokens_per_sample
                                                             if samples_per_s and self.workload.tokens_per_sample else None),
            "throughput_note": "steady state: excludes the first step of this invocation "
                               "(warm-up, compilation), evaluation and checkpoint time",
            "model_flops_per_step": self.flops_per_step, "achieved_flops_per_s": achieved,
            "mfu": mfu(achieved, basis_flops), "mfu_peak_flops_per_s": basis_flops,
            "mfu_peak_source": basis_source,
            "mfu_vs_measured": mfu(achieved, peak.measured_flops_per_s),
            "measured_peak_flops_per_s": peak.measured_flops_per_s,
            "datasheet_peak_flops_per_s": peak.datasheet_flops_per_s,
            "peak_memory_bytes": peak_bytes, "peak_memory_method": peak_method,
            "initial_val_loss": initial_val, "final_train_loss": last_loss, "final_val_loss": last_val,
            "wall_s": time.perf_counter() - t_fit + self.setup_s, "setup_s": self.setup_s,
            "train_s": time.perf_counter() - t_fit,
        }
        if self.spec.bits_per_byte:
            out["final_val_bpb"] = last_val / LN2
        out["checkpoint"] = str(self.last_checkpoint) if self.last_checkpoint else None
        tuned = self.tune_result
        out["autotune"] = tuned.to_dict() if tuned is not None else None
        lay = plan.layout
        out["parallel"] = {"layout": lay.name, "world_size": lay.world, "dp": lay.dp, "tp": lay.tp, "pp": lay.pp,
                           "sharding": lay.sharding,
                           "step_s": 1.0 / steps_per_s if steps_per_s else None}
        out["step_peak_memory_bytes"], out["step_peak_memory_method"] = self._step_peak
        out["predicted"] = self._prediction(1.0 / steps_per_s if steps_per_s else None) if self.par.is_main else None
        out.update(self._energy_summary(timed_s, timed_steps, timed_j, out["predicted"]))
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}

    def _energy_summary(self, timed_s: float, timed_steps: int, timed_j: float, predicted) -> dict[str, Any]:
        """Energy of the loop and of its timed steps, summed over the run's processes (a collective
        in a multi-process run, see energy.sum_over_processes); per sample and token over the timed
        steps, like samples_per_s; CO2 of the whole loop at --grid-intensity. The planner's energy
        per step goes into ``predicted["formula"]``, beside its step time, where it has one."""
        loop_j, steps_j, source = self.energy.read(), timed_j, self.energy.source
        if self.par.active:
            (loop_j, steps_j), source = energy.sum_over_processes(
                self.energy, [loop_j, steps_j], local_rank=self.par.ctx.local_rank, device=self.device)
        finite = lambda x: x if x is not None and math.isfinite(x) else None  # noqa: E731
        loop_j, steps_j = finite(loop_j), finite(steps_j)
        samples = timed_steps * self.plan.samples_per_step
        tokens = samples * (self.workload.tokens_per_sample or 0)
        per_step = steps_j / timed_steps if steps_j is not None and timed_steps else None
        grid = self.cfg.train.grid_intensity
        formula = (predicted or {}).get("formula") or {}
        if formula.get("power_w_per_device"):                        # the planner's figure beside ours
            formula.update(energy.formula_prediction(formula["power_w_per_device"], formula["n_devices"],
                                                     formula["step_time_s"], per_step) or {})
        if predicted and predicted.get("energy_per_step_j"):         # the traced plan's (any model)
            predicted["measured_energy_per_step_j"] = per_step
            predicted["energy_measured_over_predicted"] = (per_step / predicted["energy_per_step_j"]
                                                           if per_step is not None else None)
        return {
            "energy_j": loop_j, "energy_source": source, "energy_how": self.energy.how,
            "energy_steps_j": steps_j, "energy_per_step_j": per_step,
            "power_w": steps_j / timed_s if steps_j is not None and timed_s else None,
            "joules_per_sample": steps_j / samples if steps_j is not None and samples else None,
            "joules_per_token": steps_j / tokens if steps_j is not None and tokens else None,
            "grid_intensity_g_per_kwh": grid,
            "co2_g": energy.co2_grams(loop_j, grid) if loop_j is not None and grid is not None else None,
            "energy_note": "energy_j and co2_g: the training loop of this invocation (evaluation, checkpoints "
                           "and autotune trials included, setup not); energy_steps_j, energy_per_step_j, "
                           "power_w, joules_per_sample/token: the timed steps, like samples_per_s"
                           + (f"; summed over the run's {self.plan.layout.world} processes (a machine-wide "
                              "counter once per host)" if self.par.active else ""),
        }

    def _predict(self, sample) -> predicted.RunPrediction:
        """The traced plan of this run's step, made before anything is wrapped (see predicted.py)."""
        lay = self.plan.layout
        if lay.tp > 1 or lay.pp > 1:
            return predicted.RunPrediction(why_not="tensor and pipeline parallel steps are planned by the "
                                                   "formula planner only (`tensorpilot plan --tp/--pp`)")
        return predicted.predict_run(
            self.model, sample, self.workload.loss, name=self.cfg.model.name, optimizer=self.optim_cfg.name,
            device=self.device, autocast=self.choice.autocast, micro_batch=self.plan.micro_batch,
            grad_accum=self.plan.grad_accum, n_devices=lay.dp, sharding=lay.sharding,
            tokens_per_sample=self.workload.tokens_per_sample, clip_grad_norm=bool(self.cfg.optim.grad_clip))

    def step_peak(self) -> tuple[int | None, str | None]:
        """Run one training step under the profiler and return its allocator peak: (bytes, how it
        was measured), as the summary's ``step_peak_memory_bytes`` / ``_method`` report it."""
        self._profiled_step()
        return self._step_peak

    def _profiled_step(self):
        """One training step under the profiler: the allocator's peak (CPU: from its memory events;
        CUDA: max_memory_allocated) and the op times that refit the planner's calibration."""
        from tensorpilot.observe.memory import profiled_step, storage_bytes

        result = {}

        def step():
            result["value"] = self.train_step()
        state = [t for st in self.opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        live = storage_bytes(list(self.model.parameters()) + list(self.model.buffers()) + state)
        known = set(self.prediction.known) if self.prediction is not None else set()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        peak, ops, how = profiled_step(step, live, known)
        if self.device.type == "cuda":
            peak, how = int(torch.cuda.max_memory_allocated(self.device)), "torch.cuda.max_memory_allocated"
        self._step_peak = (peak, how)
        self._step_ops = ops
        return result["value"]

    def _planner_model(self, meta: dict) -> tuple[Any, int] | None:
        """(ModelSpec, tokens per sample) of this run's model for the planner, from its workload
        spec (the workload being built is the one the config names, or the one given)."""
        kind = self._workload.kind if self._workload is not None else self.cfg.model.name
        return specs.get(kind).plan_model(meta)

    def _prediction(self, measured_step_s: float | None) -> dict[str, Any] | None:
        """The traced plan of this run beside what was measured (step time, allocator peak); the
        ratios refit this machine's planner calibration. A model its workload spec describes to
        the formula planner (the built-in gpt) also gets that planner's figures under "formula"."""
        if self.prediction is None:
            return None
        peak, how = self._step_peak
        out = predicted.compare(self.prediction, measured_step_s=measured_step_s, measured_peak=peak,
                                peak_method=how, compiled=self.plan.compiled)
        if self.device.type == "cpu" and measured_step_s and self._step_ops and not self.plan.compiled:
            # CPU op times are the kernels' times; on a GPU the profiler's CPU times are launches
            out["calibration_after"] = predicted.record(self.prediction, str(self.device), self.cfg.model.name,
                                                        self._step_ops, measured_step_s)
        planned = self.spec.plan_model(self.workload.meta)
        if planned is not None:
            from tensorpilot.plan.local import local_accelerator, local_setup
            from tensorpilot.plan.predict import predict

            try:
                spec, seq_len = planned
                acc = local_accelerator(self.caps)
                setup = local_setup(seq_len, global_batch=self.plan.samples_per_step, precision=self.plan.precision,
                                    compiled=self.plan.compiled, optimizer_impl=self.plan.optimizer)
                p = predict(spec, acc, self.plan.layout, setup)
                out["formula"] = {"step_time_s": p.step_time_s, "memory_bytes": p.memory_bytes["total"],
                                  "hardware": p.hardware, "layout": p.layout, "n_devices": p.n_devices,
                                  "power_w_per_device": p.power_w_per_device}
                if measured_step_s:
                    # the share of the planner's kernel (or, host-bound, op-dispatch) rates this stack
                    # reached (plan.anchor): `tensorpilot plan --stack-efficiency` carries it to other plans
                    from tensorpilot.plan.anchor import stack_efficiency

                    found = stack_efficiency(spec, acc, self.plan.layout, setup, measured_step_s)
                    out["formula"]["anchor"] = {"factor": found.part, "value": found.efficiency,
                                                "reached": found.reached}
            except (TensorpilotError, ValueError) as exc:
                out["formula"] = {"error": str(exc)}
        return out

    def _write_summary(self, summary: dict[str, Any]) -> None:
        if not self.par.is_main:
            return
        write_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=1), "summary")

    @staticmethod
    def _energy_line(s: dict[str, Any]) -> str:
        """'41.2 J (estimate); 6.0 W over the timed steps, 1.9 mJ/token; 0.005 g CO2 at 400 g/kWh'."""
        if s["energy_j"] is None:
            return f"n/a ({s['energy_source']})"
        j = energy.format_joules
        text = f"{j(s['energy_j'])} ({s['energy_source']})"
        if s["power_w"] is not None:
            per = (f"{j(s['joules_per_token'])}/token" if s["joules_per_token"] is not None
                   else f"{j(s['joules_per_sample'])}/sample")
            text += f"; {s['power_w']:,.1f} W over the timed steps, {per}"
        if s["co2_g"] is not None:
            text += f"; {s['co2_g']:.3g} g CO2 at {s['grid_intensity_g_per_kwh']:g} g/kWh"
        traced = s.get("predicted") or {}
        formula = traced.get("formula") or {}
        for pred, who in ((traced, "traced step"), (formula, "formula planner")):
            if pred.get("energy_per_step_j") and s["energy_per_step_j"] is not None:
                text += (f"; per step {j(s['energy_per_step_j'])} measured, {j(pred['energy_per_step_j'])} "
                         f"predicted ({who} on {pred['hardware']}; measured / predicted "
                         f"{pred['energy_measured_over_predicted']:.2f})")
        return text

    def print_summary(self, s: dict[str, Any]) -> None:
        t = Table(title="tensorpilot train: summary", show_header=False, title_justify="left")
        t.add_column(style="bold")
        t.add_column()
        fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
        t.add_row("device / precision", escape(f"{s['device_name']} [{s['device']}] / {s['precision']}")
                  + (" + compile" if s["compiled"] else ""))
        t.add_row("steps", f"{s['steps']} ({s['skipped_steps']} skipped)")
        t.add_row("throughput", f"{fmt(s['samples_per_s'], ',.1f')} samples/s"
                  + (f", {fmt(s['tokens_per_s'], ',.0f')} tokens/s" if s.get("tokens_per_s") else ""))
        mfu_text = "MFU n/a"
        if s["mfu"] is not None:
            mfu_text = f"MFU {s['mfu']:.1%} of {s['mfu_peak_source']} ({s['mfu_peak_flops_per_s'] / 1e9:,.0f} GFLOP/s)"
            if s["datasheet_peak_flops_per_s"] and s["mfu_vs_measured"] is not None:
                mfu_text += f"; {s['mfu_vs_measured']:.1%} of the measured ceiling"
        t.add_row("model FLOP/s", escape(f"{fmt((s['achieved_flops_per_s'] or 0) / 1e9, ',.1f')} GFLOP/s; {mfu_text}"))
        t.add_row("peak memory", f"{s['peak_memory_bytes'] / 2**20:,.0f} MiB ({s['peak_memory_method']})"
                  if s["peak_memory_bytes"] else "n/a")
        val = f"{fmt(s['initial_val_loss'], '.3f')} -> {fmt(s['final_val_loss'], '.3f')}"
        if s.get("final_val_bpb") is not None:
            val += f" ({s['final_val_bpb']:.3f} bits/byte)"
        t.add_row("loss (train / val)", f"{fmt(s['final_train_loss'], '.3f')} / {val}")
        pred = s.get("predicted") or {}
        if pred.get("step_time_s") and pred.get("measured_step_time_s"):
            t.add_row("step time", escape(f"{pred['measured_step_time_s'] * 1e3:,.1f} ms measured, "
                                          f"{pred['step_time_s'] * 1e3:,.1f} ms predicted (traced plan on "
                                          f"{pred['hardware']}; measured / predicted "
                                          f"{pred['measured_over_predicted']:.2f})"))
        anchor = (pred.get("formula") or {}).get("anchor")
        if anchor:
            part, value = anchor["factor"], anchor["value"]
            from tensorpilot.plan.anchor import RATES

            t.add_row(part.replace("_", " "), escape(
                f"{value:.3g} of the formula planner's {RATES[part]}"
                + f" on {pred['formula']['hardware']} ({pred['formula']['step_time_s'] * 1e3:,.1f} ms planned at 1); "
                f"pass --{part.replace('_', '-')} {value:.3g} to `tensorpilot plan` to plan other runs of this stack"
                + ("" if anchor["reached"] else " (clamped: the stack does not set this step)")))
        if pred.get("memory_bytes"):
            measured = pred.get("measured_memory_bytes")
            t.add_row("step memory", escape(
                (f"{measured / 2**20:,.1f} MiB measured ({pred['measured_memory_method']}), " if measured else "")
                + f"{pred['memory_bytes'] / 2**20:,.1f} MiB predicted"
                + (f" (measured / predicted {pred['memory_measured_over_predicted']:.2f})" if measured else "")))
        elif pred.get("error"):
            t.add_row("prediction", escape(pred["error"]))
        if s.get("energy_source"):
            t.add_row("energy", escape(self._energy_line(s)))
            t.add_row("energy source", escape(s["energy_how"]))
        t.add_row("time", f"{s['wall_s']:.1f} s wall ({s['setup_s']:.1f} s setup)")
        t.add_row("run directory", f"{s['run_dir']} (summary.json, metrics.jsonl, tensorboard/, checkpoints/)")
        self.console.print(t)
