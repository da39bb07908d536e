"""Running the suites `tensorpilot bench` was asked for, one after the other, and writing
bench.json, a PNG per suite and report.md to the output directory. A suite that fails for a
reason a user can cause (an unknown name, a precision the device lacks, a failed `train`
subprocess, out of memory) is one sentence under "errors"; the others still run."""

from __future__ import annotations

import json
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorpilot.errors import TensorpilotError, first_line

__all__ = ["BenchOptions", "run", "suite_command"]

BUSY = 0.25      # other processes' share of the machine above which a suite's times are flagged


@dataclass(kw_only=True, slots=True)
class BenchOptions:
    """What `tensorpilot bench` was asked for."""

    suites: list[str]                  # in the order given (all when none was named)
    quick: bool = False                # about two minutes on a 2-core CPU
    out: str = "bench"                 # output directory
    device: str = "auto"               # the device of every suite but devices and scaling
    precisions: list[str] | None = None  # the precision ladder of precision and energy (None: all supported)


def suite_command(names: list[str], opts: BenchOptions) -> str:
    """The command line that runs ``names`` as this run ran them."""
    argv = ["tensorpilot", "bench", *names] + (["--quick"] if opts.quick else []) + ["--device", opts.device]
    if opts.precisions:
        argv += ["--precisions", ",".join(opts.precisions)]
    return shlex.join(argv + ["--out", opts.out])


def _facts(device: str) -> dict[str, Any]:
    from tensorpilot.bench.measure import machine
    from tensorpilot.hardware.device import detect
    from tensorpilot.hardware.probe import fingerprint
    from tensorpilot.hardware.report import local_devices
    from tensorpilot.version import __version__

    devices = local_devices()
    return {"tensorpilot": __version__, "fingerprint": fingerprint(devices), "machine": machine(),
            "devices": {d: detect(d).name for d in devices}, "device": device,
            "accelerators": [f"{d} ({detect(d).name})" for d in devices if d != "cpu"]}


def run(opts: BenchOptions, console) -> dict[str, Any]:
    """Run the suites, write the files; returns bench.json's content."""
    from rich.markup import escape

    from tensorpilot.bench import plots, report, suites
    from tensorpilot.files import finite, writable_dir, write_atomic
    from tensorpilot.hardware.device import resolve_device

    out = writable_dir(opts.out, "--out")
    device = resolve_device(opts.device)
    t_start = time.perf_counter()
    result: dict[str, Any] = {
        **_facts(device), "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "quick": opts.quick,
        "command": suite_command(opts.suites, opts), "commands": {}, "suites": {}, "errors": {}}
    sizes = suites.QUICK if opts.quick else suites.FULL
    for name in opts.suites:
        if name not in suites.SUITES:
            result["errors"][name] = (f"unknown suite {name!r}: use {', '.join(suites.SUITES)}.")
            console.print(f"[red]bench {escape(name)}: {escape(result['errors'][name])}[/]")
            continue
        console.print(f"[bold]bench {name}[/] ...")
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"tp-bench-{name}-") as work:
            ctx = suites.Context(device=device, sizes=sizes, work=Path(work), precisions=opts.precisions,
                                 log=lambda m: console.print(m, highlight=False, markup=False))
            try:
                res = suites.SUITES[name](ctx)
            except TensorpilotError as exc:
                result["errors"][name] = str(exc)
            except (RuntimeError, OSError) as exc:     # out of memory, a lost peer: the suite, not the run
                result["errors"][name] = f"{type(exc).__name__}: {first_line(exc)}."
        if name in result["errors"]:
            console.print(f"[red]bench {escape(name)}: {escape(result['errors'][name])}[/]")
            continue
        result["commands"][name] = suite_command([name], opts)
        suite = {"rows": res.rows, "claims": [c.to_dict() for c in res.claims], "notes": res.notes,
                 "commands": res.commands, "wall_s": time.perf_counter() - t0, "png": None}
        busy = max((r.get("max_foreign_load") or 0 for r in res.rows), default=0)
        if busy >= BUSY:
            suite["notes"].append(f"other processes used up to {busy:.0%} of the machine during some timed steps: "
                                  "their times are inflated")
        png, note = plots.write_png(name, suite, out / f"{name}.png")
        suite["png"] = png.name if png else None
        if note:
            suite["notes"].append(note)
        result["suites"][name] = suite
        report.print_suite(console, name, suite)
    result["wall_s"] = time.perf_counter() - t_start
    write_atomic(out / "bench.json", json.dumps(finite(result), indent=1), "bench.json")
    write_atomic(out / "report.md", report.markdown(result), "report.md")
    console.print(f"wrote {escape(str(out))}/bench.json, report.md and a PNG per suite ({result['wall_s']:.0f} s)")
    return result

