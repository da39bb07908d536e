"""The console report of a profile (rich tables): step time and the profiler's overhead, the
breakdown, the roofline per op class, the top modules, the findings with their flags, and
--apply's before/after. Reads only the result dict (profile.json's content)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:,.2f}"


def _g(x: float | None, unit: float = 1e9) -> str:
    return "—" if not x else f"{x / unit:,.1f}"


def _bar(share: float, width: int = 24) -> str:
    return "█" * round(share * width)


def print_report(r: dict[str, Any], console: Console | None = None) -> None:
    con = console or Console(highlight=False)
    st = r["step_time_s"]
    plan = r["execution_plan"]
    con.print(f"[bold]tensorpilot profile[/] " + escape(f"{r['model']} on {r['device_name']} [{r['device']}]: "
                                                       f"{plan['label']}")
              + (f", {r['world_size']} processes" if r["world_size"] > 1 else ""))
    overhead = r.get("profiler_overhead")
    con.print(f"  step {_ms(st['unprofiled'])} ms without the profiler (median of {r['steps']['measured']}, mean "
              f"{_ms(st['unprofiled_mean'])} ms), {_ms(st['profiled'])} ms profiled"
              + (f": profiler overhead {overhead:+.0%}" if overhead is not None else "")
              + f"; {r['samples_per_step']} samples per step")

    t = Table(title="where the step goes (profiler cost taken off host overhead)", title_justify="left")
    for col, just in (("category", "left"), ("ms", "right"), ("share", "right"), ("", "left")):
        t.add_column(col, justify=just)
    for cat, v in sorted(r["breakdown"].items(), key=lambda kv: -kv[1]["seconds"]):
        if v["seconds"] > 0:
            t.add_row(cat, _ms(v["seconds"]), f"{v['share']:.1%}", _bar(v["share"]))
    con.print(t)
    comm = r["communication"]
    if comm["total_s"]:
        con.print(f"  communication: {_ms(comm['exposed_s'])} ms exposed, {_ms(comm['overlapped_s'])} ms overlapped "
                  f"with compute ({_ms(comm['total_s'])} ms of collectives)")
    if r.get("recompute_s"):
        con.print(f"  recomputation (activation checkpointing): {_ms(r['recompute_s'])} ms")

    roof = r["roofline"]
    ceil = roof["ceilings"]
    rt = Table(title="roofline per op class", title_justify="left")
    # GFLOP and bytes per class are in profile.json; the console keeps to what fits 80 columns
    for col in ("op class", "ms", "plan ms", "FLOP/B", "GFLOP/s", "GB/s", "bound", "% ceil"):
        rt.add_column(col, justify="left" if col in ("op class", "bound") else "right", no_wrap=True)
    for row in roof["classes"]:
        frac = row.get("fraction_of_ceiling")
        rt.add_row(row["op_class"], _ms(row["measured_s"]), _ms(row.get("predicted_s")),
                   f"{row['intensity_flop_per_byte']:,.1f}" if row["intensity_flop_per_byte"] else "—",
                   _g(row["achieved_flops_per_s"]), _g(row["achieved_bytes_per_s"]), row.get("bound", "—"),
                   f"{frac:.0%}" if frac is not None else "—")
    con.print(rt)
    con.print(escape(f"  ceilings: {_g(ceil['peak_flops_per_s'])} GFLOP/s {ceil['dtype']} ({ceil['peak_source']}); "
                     f"{_g(ceil['bandwidth_bytes_per_s'])} GB/s ({ceil['bandwidth_source']})"))
    if roof.get("predicted_host_overhead_s") is not None:
        con.print(f"  planner's host overhead for these ops: {_ms(roof['predicted_host_overhead_s'])} ms")

    if r["modules"]:
        mt = Table("module", "ms", "share", title=f"top {len(r['modules'])} modules (kernel time, forward + backward)",
                   title_justify="left")
        for m in r["modules"]:
            mt.add_row(escape(m["module"]), _ms(m["seconds"]), f"{m['share']:.1%}")
        con.print(mt)

    if r["findings"]:
        ft = Table("#", "kind", "share", "evidence / fix", "flag", title="findings", title_justify="left")
        for i, f in enumerate(r["findings"], 1):
            ft.add_row(str(i), f["kind"], f"{f['share_of_step']:.0%}", escape(f"{f['evidence']}\n-> {f['fix']}"),
                       escape(f["flag"]))
        con.print(ft)
    else:
        con.print("findings: none above their thresholds (docs/profile.md)")
    if r.get("apply"):
        print_apply(r["apply"], con)
    for n in r.get("notes", []):
        con.print(f"note: {escape(n)}")
    files = r.get("files", {})
    shown = [files[k] for k in ("json", "trace", "png") if files.get(k)]
    if shown:
        con.print(escape("wrote " + ", ".join(shown)))


def print_apply(a: dict[str, Any], con: Console) -> None:
    if a.get("applied") is None:
        con.print(escape(f"--apply: {a.get('note', 'nothing applied')}"))
        return
    same = a["before_samples_per_step"] == a["after_samples_per_step"]
    con.print(escape(
        f"--apply {a['applied']} ({a['kind']}): step {_ms(a['before_step_s'])} ms -> {_ms(a['after_step_s'])} ms"
        + ("" if same else f" ({a['before_samples_per_step']} -> {a['after_samples_per_step']} samples per step; "
                           f"{a['before_s_per_sample'] * 1e3:,.3f} -> {a['after_s_per_sample'] * 1e3:,.3f} ms per sample)")
        + f": {a['speedup_per_sample']:.2f}x {'faster' if a['speedup_per_sample'] >= 1 else 'as fast'} per sample"))
