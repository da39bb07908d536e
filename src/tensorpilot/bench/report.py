"""What `tensorpilot bench` shows and writes: a rich table per suite in the console, and a
one-page report.md stating each claim, the figure measured for it and whether it holds here."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["COLUMNS", "print_suite", "markdown"]


def _ms(x) -> str:
    return f"{x * 1e3:,.1f} ms" if x is not None else "-"


def _s(x) -> str:
    return f"{x:,.1f} s" if x is not None else "-"


def _mib(x) -> str:
    return f"{x / 2**20:,.1f} MiB" if x is not None else "-"


def _x(x) -> str:
    return f"{x:.2f}x" if x is not None else "-"


def _num(x) -> str:
    if x is None:
        return "-"
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:,.2f} {unit}"
    return f"{x:,.2f}"


def _pct(x) -> str:
    return f"{x:.0f}%" if x is not None else "-"


def _eff(x) -> str:
    return f"{x:.0%}" if x is not None else "-"


def _plain(x) -> str:
    return "-" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))


def _steps(x) -> str:
    return f"{x:,.0f}" if x is not None else "never"


def _w(x) -> str:
    return f"{x:,.1f} W" if x is not None else "-"


def _j(x) -> str:
    from tensorpilot.observe.energy import format_joules

    return format_joules(x) if x is not None else "-"


Column = tuple[str, str, Callable[[Any], str]]
# per suite: (row key, header, formatter)
COLUMNS: dict[str, list[Column]] = {
    "devices": [("device", "device", _plain), ("workload", "workload", _plain), ("throughput", "throughput", _num),
                ("unit", "unit", _plain), ("pct_of_peak", "% of peak", _pct), ("speedup_vs_cpu", "vs CPU", _x)],
    "precision": [("precision", "precision", _plain), ("step_s", "step", _ms), ("speedup_vs_fp32", "speed vs fp32", _x),
                  ("peak_bytes", "peak memory", _mib), ("memory_vs_fp32", "memory vs fp32", _x),
                  ("loss", "loss after equal steps", _plain)],
    "compile": [("config", "configuration", _plain), ("precision", "precision", _plain), ("step_s", "step", _ms),
                ("speedup_vs_eager", "speed vs eager", _x), ("compile_s", "compile time", _s),
                ("break_even_steps", "break-even steps", _steps)],
    "checkpointing": [("policy", "policy", _plain), ("step_s", "step", _ms), ("time_vs_none", "time vs none", _x),
                      ("peak_bytes", "peak (measured)", _mib), ("memory_saved_bytes", "saved (measured)", _mib),
                      ("predicted_activation_bytes", "activations (planner)", _mib),
                      ("predicted_saved_bytes", "saved (planner)", _mib)],
    "batch": [("batch", "batch", _plain), ("train_samples_per_s", "train samples/s", _num),
              ("train_saturated", "train saturates", _plain), ("infer_latency_s", "inference latency", _ms),
              ("infer_samples_per_s", "inference samples/s", _num), ("infer_saturated", "inference saturates", _plain)],
    "scaling": [("processes", "processes", _plain), ("scaling", "scaling", _plain),
                ("global_batch", "global batch", _plain), ("samples_per_s", "samples/s", _num),
                ("step_s", "step", _ms), ("efficiency", "efficiency", _eff)],
    "energy": [("device", "device", _plain), ("precision", "precision", _plain),
               ("energy_per_step_j", "per step", _j), ("j_per_1k", "per 1k tokens/samples", _j),
               ("power_w", "power", _w), ("flop_per_j", "FLOP/J", _num), ("energy_source", "source", _plain)],
}

_VERDICT_STYLE = {"holds": "green", "does not hold": "red", "not measurable here": "yellow"}


def print_suite(console, name: str, suite: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"bench {name}", title_justify="left", show_lines=False)
    cols = COLUMNS[name]
    for _, header, _ in cols:
        table.add_column(header)
    for row in suite["rows"]:
        table.add_row(*(escape(fmt(row.get(key))) for key, _, fmt in cols))
    console.print(table)
    for c in suite["claims"]:
        style = _VERDICT_STYLE.get(c["verdict"], "")
        console.print(f"  claim: {escape(c['claim'])}: [{style}]{c['verdict']}[/] ({escape(c['figure'])})"
                      + (f"; {escape(c['why'])}" if c["why"] else ""))
    for note in suite["notes"]:
        console.print(f"  [dim]{escape(note)}[/]")


def markdown(result: dict[str, Any]) -> str:
    """report.md: one page, each claim with its measured figure and verdict, suite by suite."""
    m = result["machine"]
    lines = [f"# tensorpilot bench{' --quick' if result['quick'] else ''}: {m['cpu']}"
             + (f" + {', '.join(result['accelerators'])}" if result["accelerators"] else ""), "",
             f"{result['date']}, tensorpilot {result['tensorpilot']}, torch {m['torch']}, {m['logical_cpus']} logical "
             f"CPUs, {m['torch_threads']} torch threads; machine fingerprint `{result['fingerprint']}`.",
             f"Run: `{result['command']}` ({result['wall_s']:.0f} s). Every figure is measured here, now; "
             "bench.json has the rows and the command re-running each suite.", "",
             "| suite | claim | measured here | verdict |", "|---|---|---|---|"]
    for name, suite in result["suites"].items():
        for c in suite["claims"]:
            verdict = c["verdict"] + (f" ({c['why']})" if c["why"] else "")
            lines.append(f"| {name} | {c['claim']} | {c['figure']} | {verdict} |".replace("\n", " "))
    for name, msg in result["errors"].items():
        lines.append(f"| {name} | - | - | not run: {msg} |")
    lines.append("")
    for name, suite in result["suites"].items():
        fig = f" ![{name}]({suite['png']})" if suite.get("png") else ""
        notes = "; ".join(suite["notes"])
        lines.append(f"- **{name}**{fig}" + (f" {notes}." if notes else ""))
    return "\n".join(lines) + "\n"
