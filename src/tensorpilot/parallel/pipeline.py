"""Pipeline parallelism with ``torch.distributed.pipelining``. Where a model is cut is the
workload's knowledge (its spec's ``pipeline_stage``, e.g. tensorpilot.workloads.gpt_parallel);
this builds the stage and the schedule that drives it.

A batch of B samples is cut into m micro-batches of B/m. Schedules (Huang et al. 2019 GPipe;
Narayanan et al. 2021 1F1B / PipeDream-flush):
    gpipe  all m forwards, then all m backwards: activations of m micro-batches alive at once
    1f1b   after a warm-up of pp-1 forwards, alternate one forward / one backward: at most pp
           micro-batches alive; same bubble, (pp-1)/(m+pp-1) of the step idle
More micro-batches shrink the bubble; the default m = 2*pp keeps it at most ~1/3.
"""

from __future__ import annotations

from torch import nn

from tensorpilot.errors import ConfigError


def build_schedule(stage_module: nn.Module, pp: int, pp_rank: int, device, pp_group, *, schedule: str,
                   microbatches: int, batch_size: int, loss_fn):
    """A PipelineStage for this rank and the schedule that drives it."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    m = microbatches or 2 * pp
    if batch_size % m:
        raise ConfigError(f"pipeline parallelism cuts each batch into {m} micro-batches: data.batch_size "
                          f"({batch_size}) must be divisible by it (set --parallel.pp_microbatches).")
    stage = PipelineStage(stage_module, pp_rank, pp, device, group=pp_group)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    # loss_fn returns the mean over a micro-batch; scale_grads divides the summed gradients by m,
    # so the step's gradient is the mean over the whole batch, as without pipelining
    return cls(stage, n_microbatches=m, loss_fn=loss_fn, scale_grads=True), m
