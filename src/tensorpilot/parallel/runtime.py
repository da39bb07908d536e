"""The trainer's view of parallelism: one object that parallelizes the model once and then answers
the few per-step questions whose answer depends on the layout (how to run forward/backward, when
to reduce gradients, how to clip a sharded gradient, what the loss is across ranks).

Running alone, every hook is the plain single-device behaviour, so the trainer has one code path.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from tensorpilot.errors import ConfigError
from tensorpilot.parallel.mesh import ParallelContext, init_distributed

__all__ = ["Parallel"]


class Parallel:
    def __init__(self, ctx: ParallelContext, pcfg):
        self.ctx, self.pcfg, self.layout = ctx, pcfg, ctx.layout
        self.schedule = None                     # pipeline schedule when pp > 1
        self.ddp = None                          # the DDP wrapper when sharding == "none" and dp > 1

    @classmethod
    def init(cls, pcfg, device_kind: str) -> Parallel:
        return cls(init_distributed(pcfg, device_kind), pcfg)

    # ------------------------------------------------------------------------- who am I
    @property
    def active(self) -> bool:
        return self.ctx.active

    @property
    def is_main(self) -> bool:
        return self.ctx.is_main

    @property
    def dp_rank(self) -> int:
        return self.ctx.dp_rank

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def pipelined(self) -> bool:
        return self.schedule is not None

    def describe(self) -> str:
        lay = self.layout
        if not self.active:
            return "one process"
        extra = []
        if lay.dp > 1:
            extra.append("FSDP2 (fully_shard per block)" if lay.sharding == "fsdp" else
                         f"DDP ({self.pcfg.bucket_mb:g} MiB buckets)")
        if lay.tp > 1:
            extra.append("tensor parallel" + (" + sequence parallel" if lay.sequence_parallel else ""))
        if lay.pp > 1:
            extra.append(f"pipeline {self.layout.schedule}, {self.microbatches} micro-batches")
        return (f"{lay.world} processes, layout {lay.name!r} (dp={lay.dp} x tp={lay.tp} x pp={lay.pp}): "
                + ", ".join(extra))

    # ------------------------------------------------------------------------ parallelize
    def parallelize(self, model: nn.Module, spec, *, activation_checkpointing: bool, compile: bool,
                    precision_dtype: str, batch_size: int, loss_fn, grad_accum: int, device) -> tuple[nn.Module, nn.Module, int]:
        """Apply the layout to ``model``; ``spec`` (a tensorpilot.workloads.specs.WorkloadSpec)
        says how its layers split for tensor and pipeline parallelism. Returns (the module whose
        parameters this rank owns, the module to call in the step, blocks activation-checkpointed).
        The order is fixed:"""
        from tensorpilot import modules

        lay, pcfg, mesh = self.layout, self.pcfg, self.ctx.mesh
        # 1. pipeline split first: every later step then sees only this rank's stage
        if lay.pp > 1:
            model = spec.stage(model, lay.pp, self.ctx.pp_rank)
        blocks = _blocks(model)
        # 2. tensor parallel: replaces Linear weights by DTensor shards; must precede FSDP, which
        #    shards those DTensors once more along the dp axis
        if lay.tp > 1:
            from tensorpilot.parallel.tensor import apply_tp

            apply_tp(model, mesh["tp"], spec.tp_plan(model, lay.tp, lay.sequence_parallel))
        # 3. activation checkpointing: wraps each block's forward, before compile sees it
        ac_blocks = 0
        if activation_checkpointing:
            ac_blocks = modules.apply_activation_checkpointing(model)[0] if blocks is None else \
                modules.checkpoint_blocks(blocks)
        # 4. compile per block (not the whole model): graph breaks stay inside a block and
        #    FSDP's/DDP's hooks between blocks stay in eager Python
        if compile:
            modules.compile_blocks(blocks or modules.repeated_blocks(model))
        # 5. data parallelism last: it must see the final parameters (DTensors under TP)
        step_model = model
        if lay.dp > 1 and lay.sharding == "fsdp":
            from tensorpilot.parallel.fsdp import apply_fsdp

            param_dtype = precision_dtype if pcfg.param_dtype == "auto" else pcfg.param_dtype
            apply_fsdp(model, mesh["dp"], blocks=blocks, param_dtype=param_dtype,
                       reshard_after_forward=pcfg.reshard_after_forward, cpu_offload=pcfg.cpu_offload)
        elif lay.dp > 1:
            if lay.tp > 1:
                raise ConfigError("dp x tp needs --parallel.sharding fsdp (DDP does not reduce "
                                  "DTensor gradients); FSDP2 composes with tensor parallelism.")
            if lay.pp > 1 and lay.schedule == "gpipe":
                # GPipe runs several forwards before the first backward, which DDP's reducer
                # does not allow; FSDP2 and 1F1B have no such restriction
                raise ConfigError("dp x pp with DDP needs --parallel.pp_schedule 1f1b (or use "
                                  "--parallel.sharding fsdp with gpipe).")
            from tensorpilot.parallel.ddp import apply_ddp

            step_model = self.ddp = apply_ddp(model, mesh["dp"], pcfg.bucket_mb, device)
        # 6. the pipeline schedule drives the (data-parallel) stage module
        if lay.pp > 1:
            from tensorpilot.parallel.pipeline import build_schedule

            self.schedule, self.microbatches = build_schedule(
                step_model, lay.pp, self.ctx.pp_rank, device, self.ctx.group("pp"),
                schedule=lay.schedule, microbatches=pcfg.pp_microbatches, batch_size=batch_size,
                loss_fn=lambda out, y: loss_fn(out, y) / grad_accum)
        return model, step_model, ac_blocks

    # ------------------------------------------------------------------------ per step
    def grad_sync(self, model: nn.Module, enabled: bool):
        """Gradient reduction on (last micro-step) or off (accumulation micro-steps)."""
        if enabled or self.pipelined:            # the schedule handles its own micro-batches
            return contextlib.nullcontext()
        if self.ddp is not None:
            return self.ddp.no_sync()
        if hasattr(model, "set_requires_gradient_sync"):       # an FSDP2 module
            return _fsdp_no_sync(model)
        return contextlib.nullcontext()

    def pipeline_step(self, x: torch.Tensor, y: torch.Tensor, train: bool = True) -> torch.Tensor:
        """One batch through the pipeline; the mean loss of its micro-batches on every pp rank
        (only the last stage computes it; the others receive it)."""
        rank, last = self.ctx.pp_rank, self.layout.pp - 1
        losses: list[torch.Tensor] = []
        run = self.schedule.step if train else self.schedule.eval
        args = (x,) if rank == 0 else ()
        kwargs = dict(target=y, losses=losses) if rank == last else {}
        run(*args, **kwargs)
        loss = torch.stack(losses).mean().detach().float() if losses else torch.zeros((), device=x.device)
        import torch.distributed as dist

        dist.all_reduce(loss, group=self.ctx.group("pp"))          # a sum with one non-zero term
        return loss

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
        """Global gradient norm over every rank's parameters, then clip (like clip_grad_norm_).
        DTensor gradients (FSDP, TP) give their norm per group of equal placement, reduced over
        their mesh by ``full_tensor``; plain gradients are replicas (DDP) or pipeline slices."""
        groups: dict = {}                        # (kind, mesh, placements) -> parameters
        for p in params:
            g = p.grad
            if g is not None:
                key = (type(g).__name__, getattr(g, "device_mesh", None), tuple(getattr(g, "placements", ())))
                groups.setdefault(key, []).append(p)
        sq = torch.zeros((), device=self.ctx.device, dtype=torch.float32)
        for group in groups.values():
            n = torch.nn.utils.get_total_norm([p.grad for p in group], 2.0, foreach=True)
            n = n.full_tensor() if hasattr(n, "full_tensor") else n
            sq = sq + n.float() ** 2
        if self.layout.pp > 1:                   # each stage holds different parameters
            import torch.distributed as dist

            dist.all_reduce(sq, group=self.ctx.group("pp"))
        total = sq.sqrt()
        if math.isfinite(max_norm):
            for group in groups.values():
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
        return total

    def mean_over_dp(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a per-rank scalar over data-parallel ranks (the global batch's loss)."""
        if self.layout.dp == 1:
            return value
        import torch.distributed as dist

        value = value.clone()
        dist.all_reduce(value, group=self.ctx.group("dp"))       # SUM: gloo has no AVG
        return value / self.layout.dp

    def agree_max(self, value: int) -> int:
        """The largest ``value`` of all ranks, on every rank (e.g. the stop signal one rank saw)."""
        if not self.active:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64, device=self.ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def same_everywhere(self, value):
        """Rank 0's ``value`` on every rank (e.g. a run directory named after the clock)."""
        if not self.active:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist

            dist.barrier()

    def close(self, clean: bool = True) -> None:
        """Leave the process group this run created (once; later calls do nothing). A group the
        caller created before training is left to the caller. After a clean finish every rank
        meets at a barrier first: a rank that tears its gloo pairs down while a peer still
        drains its last pipeline receive aborts that peer (std::terminate). After an error
        there is no barrier (the failed peers would never arrive)."""
        if self.active:
            import torch.distributed as dist

            if self.ctx.owns_group and dist.is_initialized():
                if clean:
                    dist.barrier()
                dist.destroy_process_group()
            self.ctx.mesh = None


def _blocks(model: nn.Module) -> list[nn.Module] | None:
    """A pipeline stage keeps its blocks in a ModuleDict (to keep their names); else None."""
    blocks = getattr(model, "blocks", None)
    return list(blocks.values()) if isinstance(blocks, nn.ModuleDict) else None


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
