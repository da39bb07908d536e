"""The device this process runs on, as the planner sees it: a catalogued accelerator as it is,
anything else (CPUs, unrecognised GPUs) described by its *measured* ceilings.

The planner multiplies datasheet peaks by achievable fractions (``calibration``); measured
ceilings are achieved already, so they enter divided by those same fractions and come out of
the planner unchanged. Memory bandwidth is the measured copy bandwidth when a probe holds one
(``tensorpilot hw --probe``), else a quick 64 MiB copy measured now and cached; the device "link" is the
probe's measured all-reduce bus bandwidth when there is one (gloo over loopback on a CPU box),
else the planner's default.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tensorpilot.hardware.catalog import Accelerator


@lru_cache(maxsize=8)
def local_accelerator(caps: Any) -> Accelerator:
    """``caps``: a ``tensorpilot.hardware.device.DeviceCaps`` (imports torch through the probe).
    Cached per process: autotune's predictions and the run summary ask for the same device."""
    from tensorpilot.hardware import catalog
    from tensorpilot.hardware.peak import device_peak
    from tensorpilot.hardware.probe import load_cached, quick_copy_bandwidth
    from tensorpilot.plan import calibration as cal

    key = catalog.normalize_device_name(caps.name) if caps.kind != "cpu" else None
    if key is not None:
        return catalog.get(key)
    achieved = cal.SUSTAINED_COMPUTE_FRACTION * cal.mamf_fraction(None)
    peaks = {}
    for dtype in ("fp32", "bf16") + (("fp16",) if caps.kind != "cpu" else ()):
        measured = device_peak(caps.torch_device, dtype).measured_flops_per_s
        if measured:
            peaks[f"{dtype}_tflops"] = measured / achieved / 1e12
    cached = load_cached([caps.torch_device])
    probe = cached.device(caps.torch_device) if cached else None
    copy = quick_copy_bandwidth(caps.torch_device)
    bus = (cached.allreduce or {}).get("bus_bytes_per_s") if cached else None
    # plan/predict.py: link rate = link_gb_per_s x 1e9 / 2 (both directions) x LINK_BW_FRACTION
    link = bus * 2 / cal.LINK_BW_FRACTION / 1e9 if bus else None
    return Accelerator(key=f"local-{caps.kind}", name=f"{caps.name} (measured)", vendor="local", year=0,
                       source="measured ceilings of this machine (tensorpilot hw --probe)",
                       mem_gb=(caps.memory_bytes or 0) / 1e9 or None,
                       mem_bw_gb_per_s=copy / 1e9 / cal.MEMORY_BW_FRACTION, link_gb_per_s=link, **peaks)


def local_setup(seq_len: int, *, global_batch: int, precision: str, compiled: bool = False,
                optimizer_impl: str = "fused"):
    """The planner's TrainSetup of one training configuration run here: ``compiled``, the step runs
    under torch.compile (fused elementwise kernels), else eagerly; ``optimizer_impl``, how the
    trainer's AdamW runs (predict.OPTIMIZER_IMPLS; another, such as torchao's 8-bit one: fused)."""
    from tensorpilot.plan.predict import OPTIMIZER_IMPLS, TrainSetup

    return TrainSetup(seq_len=seq_len, global_batch=global_batch,
                      precision="fp32" if precision == "tf32" else precision, attention="flash",
                      kernels="fused" if compiled else "eager",
                      optimizer_impl=optimizer_impl if optimizer_impl in OPTIMIZER_IMPLS else "fused")


def local_plan(spec: Any, seq_len: int, acc: Accelerator, *, layout: Any, global_batch: int, precision: str,
               compiled: bool = False):
    """The planner's Plan of one training configuration of ``spec`` (a ModelSpec; from a
    workload spec's planner) on ``acc`` (e.g. ``local_accelerator``) with ``layout`` (a
    tensorpilot.layout.Layout: micro-batch and recomputation included); the setup is
    ``local_setup``'s."""
    from tensorpilot.plan.predict import predict

    return predict(spec, acc, layout, local_setup(seq_len, global_batch=global_batch, precision=precision,
                                                  compiled=compiled))
