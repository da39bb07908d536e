"""profile.png: the step breakdown as one stacked bar, and the roofline (attainable FLOP/s
against arithmetic intensity, log-log) with each op class's achieved rate as a point.
matplotlib (``pip install 'tensorpilot[plots]'``, in ``dev``) is optional: without it the PNG
is skipped with a one-line note."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_png(r: dict[str, Any], path: Path) -> tuple[Path | None, str | None]:
    """(path written, None) or (None, why not)."""
    try:
        import matplotlib
    except ImportError:
        return None, "profile.png skipped: matplotlib is not installed (pip install 'tensorpilot[plots]')"
    matplotlib.use("Agg")                        # files only, no display
    import matplotlib.pyplot as plt

    fig, (bar, roof) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1, 2]})
    _stacked_bar(bar, r)
    _roofline(roof, r)
    fig.suptitle(f"tensorpilot profile: {r['model']} on {r['device_name']} ({r['execution_plan']['label']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, None


def _stacked_bar(ax, r: dict[str, Any]) -> None:
    import matplotlib.pyplot as plt

    parts = [(c, v["seconds"] * 1e3) for c, v in r["breakdown"].items() if v["seconds"] > 0]
    colors = plt.get_cmap("tab20").colors
    bottom = 0.0
    for i, (cat, ms) in enumerate(parts):
        ax.bar(0, ms, bottom=bottom, color=colors[i % len(colors)], label=f"{cat} {ms:,.1f} ms", width=0.6)
        bottom += ms
    ax.set_xticks([])
    ax.set_xlim(-0.6, 1.8)
    ax.set_ylabel("ms per step (profiler cost taken off)")
    ax.set_title("where the step goes", fontsize=9)
    ax.legend(fontsize=7, loc="upper right", frameon=False)


def _roofline(ax, r: dict[str, Any]) -> None:
    ceil = r["roofline"]["ceilings"]
    peak, bw = ceil.get("peak_flops_per_s"), ceil.get("bandwidth_bytes_per_s")
    rows = [row for row in r["roofline"]["classes"] if row.get("intensity_flop_per_byte") and row.get("achieved_flops_per_s")]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"roofline ({ceil['dtype']})", fontsize=9)
    if peak and bw:
        xs = [2.0 ** k for k in range(-6, 13)]
        ax.plot(xs, [min(peak, x * bw) for x in xs], color="black", lw=1.2,
                label=f"ceiling: {peak / 1e9:,.0f} GFLOP/s, {bw / 1e9:,.0f} GB/s")
    for row in rows:
        ax.scatter(row["intensity_flop_per_byte"], row["achieved_flops_per_s"], s=40)
        ax.annotate(row["op_class"], (row["intensity_flop_per_byte"], row["achieved_flops_per_s"]), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    if not rows:
        ax.text(0.5, 0.5, "no FLOPs counted (step not traced)", transform=ax.transAxes, ha="center")
    ax.legend(fontsize=7, loc="lower right", frameon=False)
