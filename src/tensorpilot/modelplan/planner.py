"""Plan any model: trace one training step symbolically, cost it on a device, calibrate.

    source = sources.load("timm:resnet50")
    trace = trace_source(source, batch_size=32, precision="bf16", optimizer="adamw")
    plan = plan_local(trace, source, batch_size=32, precision="bf16", optimizer="adamw")

``measure_step`` runs the same step for real (time and allocator peak), which is what the
trainer's summary and the benchmark compare the plan with.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable

import torch
from torch import nn

from tensorpilot.errors import ConfigError
from tensorpilot.modelplan.sources import Loss, ModelSource, batch_maker
from tensorpilot.observe.trace import StepTrace, TraceError, forward_loss, trace_step

# bf16 / fp16: fp32 weights under autocast; -pure: the model cast to the type (model.to(torch.bfloat16)
# or from_pretrained(torch_dtype=...)), weights, gradients and optimizer states in it
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "bf16-pure", "fp16-pure")
OPTIMIZERS = ("adamw", "adam", "sgd", "adafactor", "adamw8bit", "none")    # none: forward and backward only
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
PURE = {"bf16-pure": torch.bfloat16, "fp16-pure": torch.float16}


def compute_key(precision: str) -> str:
    """The datasheet peak a precision's GEMMs run at: fp32, tf32, bf16 or fp16."""
    return precision.split("-")[0]


def optimizer_factory(name: str, device_kind: str = "cpu") -> Callable[[list[nn.Parameter]],
                                                                     torch.optim.Optimizer | None]:
    """The optimizer ``tensorpilot train`` builds for ``--optim.name`` (training/optim.py: fused
    AdamW where the device has the kernel), on the parameters it is given; "none" builds none (a
    forward-backward step, as attention benchmarks time it)."""
    if name == "none":
        return lambda ps: None
    if name in ("adamw", "adam"):
        return lambda ps: torch.optim.AdamW(ps, fused=device_kind in ("cuda", "cpu"))
    if name == "sgd":
        return lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)
    if name == "adafactor":
        return lambda ps: torch.optim.Adafactor(ps, foreach=True)
    if name == "adamw8bit":
        def make(ps):
            try:
                from torchao.optim import AdamW8bit
            except ImportError:
                raise ConfigError("--optim adamw8bit needs torchao: pip install 'tensorpilot[lowbit]'.") from None
            return AdamW8bit(ps)
        return make
    raise ConfigError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}.")


def _inputs(source: ModelSource, input_shape: tuple[int, ...] | None, input_dtype: torch.dtype | None):
    shape = input_shape or source.sample_shape
    if shape is None:
        raise ConfigError(f"{source.name} {source.no_sample}: describe one sample with --input-shape "
                          "(e.g. --input-shape 3,224,224; --input-dtype int64 for token ids).")
    return shape, input_dtype or source.sample_dtype


def trace_source(source: ModelSource, *, batch_size: int, precision: str = "fp32", optimizer: str = "adamw",
                 loss: Loss | None = None, input_shape: tuple[int, ...] | None = None,
                 input_dtype: torch.dtype | None = None, device: str = "cpu", clip_grad_norm: bool = True,
                 gpu_autocast: bool = False, gpu_attention: bool = False,
                 memory_format: str = "contiguous") -> StepTrace:
    """One step of ``source``'s model traced symbolically, gradients clipped as ``tensorpilot
    train`` clips them by default; one sentence when it cannot be. ``gpu_autocast``: cast as a
    GPU's autocast does (a plan of a GPU; ``autocasts_like_cuda``). ``gpu_attention``: SDPA with
    dropout as the GPU's fused kernel (``observe.gpu_attention.fuses_dropout_attention``). ``memory_format``
    "channels_last": the model's 4-D weights in NHWC, as train's channels_last moves them (the
    convolutions' outputs follow their weights' layout), for the trace only."""
    if precision not in PRECISIONS:
        raise ConfigError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}.")
    shape, dtype = _inputs(source, input_shape, input_dtype)
    if precision in PURE and dtype.is_floating_point:       # the batch in the model's type, as a pure run feeds it
        dtype = PURE[precision]
    if not any(p.requires_grad for p in source.model.parameters()):
        raise ConfigError(f"{source.name} has no trainable parameters (none, or all with requires_grad=False), so a "
                          "training step has nothing to update: plan a model with at least one parameter that trains.")
    loss = loss or Loss.parse(None, source.loss_fn)
    make = batch_maker(shape, dtype, batch_size, source.int_high, device)
    # each 4-D weight and buffer with its data, put back as it was (a caller's model may be NHWC already)
    kept = []
    if memory_format == "channels_last":
        kept = [(m, name, t, t.data) for m in source.model.modules()
                for name, t in (*m._parameters.items(), *m._buffers.items()) if t is not None and t.dim() == 4]
        source.model.to(memory_format=torch.channels_last)
    try:
        trace = trace_step(source.model, make, loss, optimizer_factory(optimizer, device.split(":")[0]),
                           device=device, autocast_dtype=AUTOCAST.get(precision),
                           clip_grad_norm=clip_grad_norm and optimizer != "none",
                           gpu_autocast=gpu_autocast, gpu_attention=gpu_attention,
                           param_dtype=PURE.get(precision))
    except TraceError as exc:
        root = type(source.model).__name__
        where = f"module {exc.module!r} ({trace_types(source.model).get(exc.module, '?')})" if exc.module \
            else f"the model's own forward ({root})"
        cause = str(exc)
        squeezed = cause.lower().replace("-", "").replace("_", "").replace(" ", "")
        if "datadependent" in squeezed or "localscalardense" in squeezed or "dynamicoutputshape" in squeezed:
            todo = ("it reads tensor values (.item(), int(tensor), boolean-mask indexing), which a trace without "
                    "data cannot: make that code independent of values (random layer drop or masking in training "
                    "mode: set its probability to 0), or measure the model with a short `tensorpilot train` run "
                    "instead")
        else:
            todo = ("check that --input-shape and --input-dtype describe what its forward expects (a forward "
                    "that takes more than one input or a dict, such as an encoder-decoder's decoder_input_ids, "
                    "needs a PKG.MOD:FACTORY wrapping it in a module that takes one tensor)")
        raise ConfigError(f"cannot trace {source.name} symbolically: {where} failed with {cause[:200]}; "
                          f"{todo}.") from None
    finally:
        for module, name, t, data in kept:
            if name in module._parameters:
                t.data = data                                # .to() kept the Parameter, swapped its data
            else:
                module._buffers[name] = t                    # .to() put a new tensor in the buffer's place
    if source.built_on != "meta":
        trace.notes.append(f"{source.name}'s constructor reads tensor values, so it was built once on the CPU "
                           "(the trace itself ran without memory)")
    return trace


def autocasts_like_cuda(acc: Any) -> bool:
    """Whether ``acc`` (hardware.catalog.Accelerator) runs torch.autocast with CUDA's op lists:
    CUDA, ROCm (HIP) and XPU register the same ones; Gaudi (HPU) and XLA devices (TPU, Trainium)
    have lists of their own, and those are not modelled (the CPU's are traced)."""
    return acc.vendor in ("NVIDIA", "AMD") or (acc.vendor == "Intel" and "gaudi" not in acc.key)


def trace_types(model: nn.Module) -> dict[str, str]:
    """Module path -> class name (the trace names modules by path)."""
    return {name: type(m).__name__ for name, m in model.named_modules()}


def plan_local(trace: StepTrace, source: ModelSource | None, *, batch_size: int, precision: str, optimizer: str,
               device: str = "cpu", calibrate: bool = True, n_devices: int = 1, sharding: str = "none",
               budget_s: float | None = None, top: int = 10, grad_accum: int = 1, name: str | None = None,
               tokens_per_sample: int | None = None, module_types: dict[str, str] | None = None,
               stack_efficiency: float = 1.0, host_efficiency: float = 1.0):
    """The plan on this machine's ``device``, from its measured costs (and calibration), at the
    user's stack's share of them (predict_step)."""
    from tensorpilot.hardware.device import detect
    from tensorpilot.hardware.peak import device_peak
    from tensorpilot.modelplan import calibration, costs
    from tensorpilot.modelplan.predict import predict_step
    from tensorpilot.plan.local import local_accelerator
    from tensorpilot.plan.predict import device_rates

    caps = detect(device)
    kw = {} if budget_s is None else {"budget_s": budget_s}
    dc = costs.local_costs(caps, trace.ops, **kw)
    factors = calibration.factors(device) if calibrate else {}
    key = "fp32" if precision == "tf32" else compute_key(precision)
    peak = device_peak(device, key)
    basis, source_name = peak.mfu_basis
    link = None
    if n_devices > 1:
        link = device_rates(local_accelerator(caps), "fp32").link_bytes_per_s
    plan = predict_step(trace, dc, model=name or source.name, batch_size=batch_size, precision=precision,
                        optimizer=optimizer, factors=factors, n_devices=n_devices, sharding=sharding,
                        link_bytes_per_s=link, device_memory_bytes=caps.memory_bytes or None,
                        peak_flops_per_s=basis, peak_source=source_name, grad_accum=grad_accum,
                        cpu_buffers=caps.kind == "cpu", stack_efficiency=stack_efficiency,
                        host_efficiency=host_efficiency,
                        tokens_per_sample=tokens_per_sample or (source.tokens_per_sample if source else None), top=top,
                        module_types=module_types or (trace_types(source.model) if source else None))
    # a catalogued GPU has a TDP for the power model; a CPU's is not in the catalog
    return plan.with_power(local_accelerator(caps), key) if caps.kind != "cpu" else plan


def plan_catalog(trace: StepTrace, source: ModelSource, acc: Any, *, batch_size: int, precision: str,
                 optimizer: str, n_devices: int = 1, sharding: str = "none", top: int = 10,
                 stack_efficiency: float = 1.0, host_efficiency: float = 1.0):
    """The plan on a catalogued accelerator ``acc`` (hardware.catalog.Accelerator), from its
    datasheet; the trace ran on fake CPU tensors, which have the same shapes, FLOPs and bytes.
    ``stack_efficiency`` / ``host_efficiency``: the user's stack's share of its rates (anchor)."""
    from tensorpilot.modelplan.costs import catalog_costs
    from tensorpilot.modelplan.predict import predict_step
    from tensorpilot.plan.predict import device_rates
    from tensorpilot.plan.timing import group_link

    key = compute_key(precision)
    peak = acc.peak_flops_per_s(key)
    if not peak:
        raise ConfigError(f"{acc.key} has no published {key} peak; choose another --precision.")
    rates = device_rates(acc, key)
    # the data-parallel group's link: the intra-node one inside a node, the network beyond it
    link, alpha = group_link(rates, n_devices, 1)
    dc = catalog_costs(acc)
    if precision == "tf32":
        dc.compute_flops_per_s["fp32"] = dc.compute_flops_per_s.get("tf32", dc.compute_flops_per_s.get("fp32", 0))
    plan = predict_step(trace, dc, model=source.name, batch_size=batch_size, precision=precision,
                        optimizer=optimizer, n_devices=n_devices, sharding=sharding,
                        link_bytes_per_s=link, alpha_s=alpha,
                        device_memory_bytes=(acc.mem_gb or 0) * 1e9 or None, peak_flops_per_s=peak,
                        peak_source=f"{acc.key} datasheet {key} peak", tokens_per_sample=source.tokens_per_sample,
                        top=top, module_types=trace_types(source.model), stack_efficiency=stack_efficiency,
                        host_efficiency=host_efficiency)
    return plan.with_power(acc, key)


def anchor(make: Callable[..., Any], measured_step_s: float):
    """The plan at the share of its rates that reproduces one measured step, and that share
    (plan.anchor.Anchor). ``make(stack_efficiency=, host_efficiency=)`` plans the measured run
    (plan_local / plan_catalog with its arguments bound).

    The share solved is that of the part the step's time follows more closely (plan.anchor's
    roofline argument: a measurement informs the bound that is active): the host's ops a second
    when a 10% faster host shortens the planned step more than 10% faster kernels do -- a GPU
    waiting for eager dispatch, a CPU step of many small ops -- else the kernels' rates."""
    from tensorpilot.plan.anchor import solve_part

    plan = make()
    step = plan.step_time_s
    faster = {part: make(**{part: 1.1}).step_time_s for part in ("stack_efficiency", "host_efficiency")}
    part = "host_efficiency" if faster["host_efficiency"] < faster["stack_efficiency"] else "stack_efficiency"

    def speed_at(p: str, e: float) -> float:
        return 1.0 / (step if e == 1.0 else make(**{p: e}).step_time_s)

    found = solve_part(speed_at, part, 1.0 / measured_step_s)
    anchored = make(**{found.part: found.efficiency})
    anchored.anchor = {"measured_step_s": measured_step_s, "part": found.part, "efficiency": found.efficiency,
                       "reached": found.reached, "unanchored_step_s": step}
    return anchored, found


def measure_step(source: ModelSource, *, batch_size: int, precision: str = "fp32", optimizer: str = "adamw",
                 loss: Loss | None = None, input_shape: tuple[int, ...] | None = None,
                 input_dtype: torch.dtype | None = None, steps: int = 5, warmup: int = 2,
                 model: nn.Module | None = None, known: set[str] | frozenset = frozenset(),
                 clip_grad_norm: bool = True) -> dict[str, Any]:
    """Run the step for real on the CPU: median step seconds over ``steps`` (after ``warmup``),
    the allocator's peak over one more, profiled, step, and the profiled op self-times. A given
    ``model`` is cast in place for a -pure precision."""
    from tensorpilot.hardware.hostmem import retain_freed_host_memory
    from tensorpilot.observe.memory import profiled_step, storage_bytes

    retain_freed_host_memory()                 # as train runs a CPU step (engine.retain_host_memory)
    shape, dtype = _inputs(source, input_shape, input_dtype)
    loss = loss or Loss.parse(None, source.loss_fn)
    torch.manual_seed(0)
    model = model if model is not None else source.real_model()
    if precision in PURE:                       # as trace_source: the model and a float batch in the type
        model.to(PURE[precision])
        dtype = PURE[precision] if dtype.is_floating_point else dtype
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer_factory(optimizer, "cpu")(params)
    x, _ = batch_maker(shape, dtype, batch_size, source.int_high)()
    cast = AUTOCAST.get(precision)

    def step():
        with torch.autocast("cpu", dtype=cast) if cast is not None else contextlib.nullcontext():
            value, _ = forward_loss(model, x, None, loss)
        value.backward()
        if opt is None:
            model.zero_grad(set_to_none=True)
            return
        if clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)] if opt else []
    live = storage_bytes(list(model.parameters()) + list(model.buffers()) + state + [x])
    peak, ops, how = profiled_step(step, live, known)
    return {"step_time_s": statistics.median(times), "times_s": times, "peak_bytes": peak, "peak_method": how,
            "op_self_s": ops}
