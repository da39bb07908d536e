"""``tensorpilot plan`` for any model: the planner's parser (plan/command.py) plus the options of
a traced model, and ``tensorpilot plan calibration``. Presets and Hugging Face configs without
``--batch-size`` still go to the formula planner (multi-node layouts, search, deadlines)."""

from __future__ import annotations

import argparse

from tensorpilot import argtypes
from tensorpilot.errors import UsageError

BUILTIN = ("gpt", "mlp", "cnn")
DEFAULT_BATCH = 8


def register(sub) -> dict[str, argparse.ArgumentParser]:
    from tensorpilot.plan import command as formula

    parsers = formula.register(sub)
    p = parsers["plan"]
    a = p.add_argument_group(
        "any model (traced)",
        "--model gpt|mlp|cnn, --model PKG.MOD:FACTORY, --model timm:NAME or --hf-config FILE with "
        "--batch-size: the model is built without weights, one training step (forward, loss, backward, "
        "optimizer) runs on fake tensors, and each op is costed on the device (--gpu local: this "
        "machine's measured costs; the default for traced models).")
    a.add_argument("--batch-size", type=argtypes.integer(1, 2**20), default=None, metavar="N",
                   help=f"Samples per device per step (default: {DEFAULT_BATCH}); also selects the traced planner "
                        "for --hf-config.")
    a.add_argument("--input-shape", metavar="D,D,...",
                   help="One sample's input shape without the batch, e.g. 3,224,224 or 512 (default: the "
                        "model's own: timm's input size, a config's context up to 512, a Workload's first sample).")
    a.add_argument("--input-dtype", metavar="DTYPE",
                   help="float32, bfloat16, int64 (token ids), ... (default: the model's own, else float32).")
    a.add_argument("--loss", metavar="ce|mse|sum|PKG.MOD:FN",
                   help="The step's loss: cross-entropy over the output's last dimension (default), mse, the "
                        "output's sum, or your function(output, targets).")
    a.add_argument("--optim", choices=["adamw", "sgd", "adafactor", "adamw8bit", "none"], default=None,
                   help="The optimizer, as train's --optim.name (default: adamw); none: forward and backward "
                        "only, as a benchmark that times loss.backward() does.")
    a.add_argument("--memory-format", choices=["contiguous", "channels_last"], default="contiguous",
                   help="The model's 4-D tensors as train's channels_last option lays them out: contiguous (NCHW, "
                        "PyTorch's default; on an NVIDIA GPU a 16-bit convolution is then run between cuDNN's "
                        "NCHW<->NHWC transforms) or channels_last (NHWC) (default: contiguous).")
    a.add_argument("--top-k", type=argtypes.integer(1, 10_000), default=10, metavar="K",
                   help="Modules and ops to list (default: 10).")
    a.add_argument("--no-calibration", action="store_true",
                   help="Plan from measured op costs only, without the factors refitted from this machine's runs.")
    a.add_argument("--reset", action="store_true", help="With 'calibration': delete this machine's factors.")
    a.add_argument("--device", default="cpu", metavar="DEV",
                   help="With --gpu local: the local device to cost on, e.g. cpu, cuda:0 (default: cpu).")
    for action in p._actions:                       # 'plan calibration' beside 'plan validate'
        if action.dest == "action":
            action.choices = ["validate", "calibration"]
            action.help = "'validate FILE.csv': compare with published runs; 'calibration': show this machine's factors."
    p.set_defaults(func=cmd_plan)
    return parsers


def traced(args: argparse.Namespace) -> bool:
    name = args.model or ""
    return name in BUILTIN or ":" in name or (args.hf_config is not None and args.batch_size is not None) \
        or (args.gpu == "local")


def cmd_plan(args: argparse.Namespace) -> int:
    from tensorpilot.plan import command as formula

    if args.action == "calibration":
        return _cmd_calibration(args)
    if args.action is None and not args.list_models and traced(args):
        return _cmd_traced(args)
    return formula.cmd_plan(args)


def _cmd_calibration(args) -> int:
    from tensorpilot.modelplan import calibration
    from tensorpilot.plan.command import _json

    if args.reset:
        gone = calibration.reset(args.device)
        print(f"calibration of {args.device} on this machine " + ("deleted." if gone else "was already empty."))
        return 0
    data = calibration.load(args.device)
    if args.json:
        print(_json({"path": str(calibration.path(args.device)), "bounds": calibration.BOUNDS, **data}))
        return 0
    print(f"planner calibration for {args.device} on this machine ({calibration.path(args.device)}):")
    if not data["observations"]:
        print("  no runs yet: every factor is 1 (a `tensorpilot train` run records one).")
        return 0
    for cls in calibration.CLASSES:
        lo, hi = calibration.BOUNDS[cls]
        print(f"  {cls:8s} factor {data['factors'].get(cls, 1.0):.3f} (bounds {lo:g}-{hi:g})")
    print(f"  from {len(data['observations'])} run(s); latest:")
    for o in data["observations"][-5:]:
        ratios = ", ".join(f"{k} {v:.2f}" for k, v in o["ratios"].items())
        print(f"    {o['at']}  {o['model']}: measured / predicted {ratios}")
    print("  `tensorpilot plan ... --no-calibration` ignores them; `tensorpilot plan calibration --reset` deletes them.")
    return 0


def _cmd_traced(args) -> int:
    from tensorpilot.modelplan import planner, sources
    from tensorpilot.observe.gpu_attention import fuses_dropout_attention
    from tensorpilot.plan import command as plan_command
    from tensorpilot.plan.anchor import sentence
    from tensorpilot.plan.command import _json

    if args.deadline or args.inference:
        raise UsageError("--deadline and --inference plan presets; a traced model is planned for a training "
                         "layout: pass --gpus N and --sharding, or --search to rank its shardings.")
    if args.search and (args.gpus or 1) < 2:
        raise UsageError("--search ranks the data-parallel shardings of a traced model over several devices: "
                         "pass --gpus N (N >= 2).")
    plan_command.check_stack(args)
    split = [f"--{k} {getattr(args, k)}" for k in ("tp", "pp", "cp") if getattr(args, k, 1) > 1]
    if split or args.sharding == "hsdp":
        raise UsageError(f"{' '.join(split) or '--sharding hsdp'}: a traced model is planned on data-parallel "
                         "layouts only (--gpus N with --sharding none, zero1, zero2 or fsdp); tensor, pipeline, "
                         "context and hybrid layouts are planned for presets and config.json models.")
    name = args.model if args.hf_config is None else "hf:" + args.hf_config
    src = sources.load(name)
    batch = args.batch_size or DEFAULT_BATCH
    shape = sources.parse_shape(args.input_shape) if args.input_shape else None
    dtype = sources.parse_dtype(args.input_dtype) if args.input_dtype else None
    loss = sources.Loss.parse(args.loss, src.loss_fn)
    optimizer = args.optim or ("adamw" if args.optimizer == "adam" else args.optimizer)
    precision = {"bf16-amp": "bf16", "fp16-amp": "fp16"}.get(args.precision, args.precision)
    if precision not in planner.PRECISIONS:
        raise UsageError(f"--precision {args.precision} is not available for a traced model; use "
                         f"{', '.join(planner.PRECISIONS)}.")
    gpus = args.gpus or 1
    if args.measured_tokens_per_s is not None and not src.tokens_per_sample:
        raise UsageError(f"--measured-tokens-per-s needs a model whose samples are tokens, and {src.name}'s are "
                         "not: pass the measured step's seconds as --measured-step-s.")
    acc = None if args.gpu in (None, "local") else plan_command.accelerator(args)
    # a GPU's autocast casts by op lists of its own (observe/gpu_autocast.py)
    gpu_autocast = planner.autocasts_like_cuda(acc) if acc is not None \
        else args.device.split(":")[0] in ("cuda", "xpu")
    # and its SDPA takes dropout in a fused kernel, where the CPU's materialises the scores
    gpu_attention = fuses_dropout_attention(acc) if acc is not None else args.device.split(":")[0] == "cuda"
    trace = planner.trace_source(src, batch_size=batch, precision=precision, optimizer=optimizer, loss=loss,
                                 input_shape=shape, input_dtype=dtype, gpu_autocast=gpu_autocast,
                                 gpu_attention=gpu_attention,
                                 memory_format=args.memory_format)
    if args.kernels == "fused":                     # the step under torch.compile
        from tensorpilot.modelplan.fusion import fuse

        trace = fuse(trace)
    if getattr(args, "stack", None):
        raise UsageError(f"--stack {args.stack} says how a preset or config.json model's stack compares with a tuned "
                         "recipe; a traced model is planned from its own ops: pass --stack-efficiency X (or "
                         "--measured-step-s S) instead.")
    stack = {"stack_efficiency": args.stack_efficiency or 1.0, "host_efficiency": args.host_efficiency or 1.0,
             "sharding": args.sharding}
    if acc is None:
        def make(**given):
            return planner.plan_local(trace, src, batch_size=batch, precision=precision, optimizer=optimizer,
                                      device=args.device, calibrate=not args.no_calibration, n_devices=gpus,
                                      top=args.top_k, **{**stack, **given})
    else:
        def make(**given):
            return planner.plan_catalog(trace, src, acc, batch_size=batch, precision=precision, optimizer=optimizer,
                                        n_devices=gpus, top=args.top_k, **{**stack, **given})
    step_s = args.measured_step_s
    if args.measured_tokens_per_s is not None:
        step_s = batch * gpus * src.tokens_per_sample / args.measured_tokens_per_s
    if step_s is None:
        plan = make()
    else:
        plan, found = planner.anchor(make, step_s)
        plan.notes.insert(0, sentence(found, "this run", step_s))
        stack[found.part] = found.efficiency
    if args.search:
        return _search(args, make, plan)
    if args.json:
        print(_json(plan.to_dict()))
    else:
        _print(plan, args.top_k)
    return 0


SEARCH_SHARDINGS = ("none", "zero1", "zero2", "fsdp")


def _search(args, make, measured) -> int:
    """Each data-parallel sharding of the traced step, ranked: the fastest that fits first, then
    the rest by speed. ``measured``: the plan of the flags' own sharding (anchored when a step was
    measured: every candidate runs at the share it solved)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from tensorpilot.plan.command import _json

    plans = [measured if s == args.sharding else make(sharding=s) for s in SEARCH_SHARDINGS]
    ranked = sorted(plans, key=lambda p: (p.fits is False, -p.samples_per_s))
    best = ranked[0]
    rows = [{"sharding": p.sharding, "step_time_s": p.step_time_s, "samples_per_s": p.samples_per_s,
             "tokens_per_s": p.tokens_per_s, "memory_bytes": p.memory_bytes["total"], "fits": p.fits,
             "communication_s": p.time_breakdown_s["communication"]} for p in ranked]
    if args.json:
        print(_json({"model": best.model, "hardware": best.hardware, "n_devices": best.n_devices,
                     "batch_size": best.batch_size, "best": best.sharding if best.fits is not False else None,
                     "search": rows, "anchor": measured.anchor}))
        return 0
    con = Console(highlight=False)
    con.print(escape(f"{best.model} on {best.n_devices} x {best.hardware}, batch {best.batch_size} per device, "
                     f"{best.precision}, {best.optimizer}: data-parallel shardings, fastest that fits first"))
    t = Table("sharding", "step ms", "samples/s", "memory / device", "exposed comm ms", "fits")
    for r in rows:
        fits = "?" if r["fits"] is None else ("[green]yes[/]" if r["fits"] else "[red]no[/]")
        t.add_row(r["sharding"], f"{r['step_time_s'] * 1e3:,.2f}", f"{r['samples_per_s']:,.1f}",
                  f"{r['memory_bytes'] / 2**30:,.2f} GiB", f"{r['communication_s'] * 1e3:,.2f}", fits)
    con.print(t)
    if best.fits is False:
        con.print("[red]no sharding fits[/]: lower --batch-size, or plan more devices with --gpus.")
    if measured.anchor:
        con.print(f"note: {escape(measured.notes[0])}")
    return 0


def _print(plan, top: int) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console(highlight=False)
    lay = f"{plan.n_devices} x " if plan.n_devices > 1 else ""
    con.print(escape(f"{plan.model} ({plan.params / 1e6:,.2f}M params, {plan.trainable_params / 1e6:,.2f}M trained) on "
                     f"{lay}{plan.hardware}, batch {plan.batch_size} per device, {plan.precision}, {plan.optimizer}"
                     + (f", {plan.sharding}" if plan.n_devices > 1 else "")))
    mt = Table(title="memory per device at the step's peak", show_header=False, title_justify="left")
    for k, v in plan.memory_bytes.items():
        if k != "total" and v:
            mt.add_row(k, f"{v / 2**20:,.1f} MiB")
    fit = "" if plan.fits is None else (" [green]fits[/]" if plan.fits else " [red]does NOT fit[/]") + (
        f" (limit {plan.memory_limit_bytes / 2**30:,.1f} GiB)")
    mt.add_row("[bold]total[/]", f"[bold]{plan.memory_bytes['total'] / 2**20:,.1f} MiB[/]{fit}")
    con.print(mt)
    con.print(f"  ({escape(plan.memory_method)})")
    tt = Table(title="step", show_header=False, title_justify="left")
    tt.add_row("step time", f"{plan.step_time_s * 1e3:,.2f} ms ({plan.samples_per_s:,.1f} samples/s"
               + (f", {plan.tokens_per_s:,.0f} tokens/s" if plan.tokens_per_s else "") + ")")
    for k, v in plan.time_breakdown_s.items():
        if v:
            tt.add_row(f"  {k}", f"{v * 1e3:,.2f} ms")
    tt.add_row("model FLOPs", f"{plan.model_flops_per_step / 1e9:,.2f} GFLOP per step")
    if plan.mfu is not None:
        tt.add_row("MFU", escape(f"{plan.mfu:.1%} of {plan.peak_source}"))
    if plan.energy_per_step_j is not None:
        tt.add_row("energy", f"{plan.energy_per_step_j:,.2f} J per step at {plan.power_w_per_device:,.0f} W per device "
                   "(TDP x utilisation, the formula planner's power model)")
    cal = ", ".join(f"{k} x{v:.2f}" for k, v in plan.calibration.items() if abs(v - 1) > 1e-9)
    tt.add_row("calibration", cal or "none (no runs on this machine yet, or --no-calibration)")
    con.print(tt)
    mod = Table("module", "type", "time ms", "GFLOP", "MiB moved", "activations MiB", title=f"top {top} modules by predicted time",
                title_justify="left")
    for r in plan.modules[:top]:
        mod.add_row(escape(r["module"]), escape(r["type"]), f"{r['time_s'] * 1e3:,.2f}", f"{r['flops'] / 1e9:,.3f}",
                    f"{r['bytes'] / 2**20:,.1f}", f"{r['activation_bytes'] / 2**20:,.1f}")
    con.print(mod)
    for n in plan.notes:
        con.print(f"note: {escape(n)}")
