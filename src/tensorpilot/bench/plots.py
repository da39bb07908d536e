"""One PNG per bench suite (matplotlib, ``pip install 'tensorpilot[plots]'``; without it the
PNGs are skipped with a one-line note, as `tensorpilot profile` does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_png"]


def write_png(name: str, suite: dict[str, Any], path: Path) -> tuple[Path | None, str | None]:
    """(path written, None) or (None, why not)."""
    try:
        import matplotlib
    except ImportError:
        return None, f"{path.name} skipped: matplotlib is not installed (pip install 'tensorpilot[plots]')"
    matplotlib.use("Agg")                        # files only, no display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    _PLOTS[name](axes, suite["rows"])
    verdicts = "; ".join(f"{c['claim']}: {c['verdict']}" for c in suite["claims"])
    fig.suptitle(f"tensorpilot bench {name}\n{verdicts}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path, None


def _bars(ax, labels, values, xlabel, title) -> None:
    ax.barh(labels, [v or 0 for v in values], color="#4c72b0")
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)


def _devices(axes, rows) -> None:
    mm = [r for r in rows if r["workload"].startswith("matmul")]
    for key in dict.fromkeys((r["device"], r["workload"].split()[-1]) for r in mm):
        pts = [(int(r["workload"].split()[1].split("x")[0]), r["flops_per_s"] / 1e9) for r in mm
               if (r["device"], r["workload"].split()[-1]) == key]
        axes[0].plot(*zip(*pts), marker="o", label=f"{key[0]} {key[1]}")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("matrix size n")
    axes[0].set_ylabel("GFLOP/s")
    axes[0].set_title("matmul sweep", fontsize=9)
    axes[0].legend(fontsize=7, frameon=False)
    other = [r for r in rows if not r["workload"].startswith("matmul")]
    _bars(axes[1], [f"{r['device']}: {r['workload']}" for r in other], [r["throughput"] for r in other],
          "samples/s", "training step and inference (same workloads on every device)")


def _precision(axes, rows) -> None:
    labels = [r["precision"] for r in rows]
    _bars(axes[0], labels, [r["step_s"] * 1e3 for r in rows], "ms per step", "step time")
    _bars(axes[1], labels, [r["peak_bytes"] / 2**20 for r in rows], "MiB", "step peak memory")
    for i, r in enumerate(rows):
        axes[0].annotate(f"loss {r['loss']:.3f}", (r["step_s"] * 1e3, i), fontsize=7, xytext=(3, 0),
                         textcoords="offset points", va="center")


def _compile(axes, rows) -> None:
    labels = [r["config"] for r in rows]
    _bars(axes[0], labels, [r["step_s"] * 1e3 for r in rows], "ms per step", "typical step")
    _bars(axes[1], labels, [r["compile_s"] or 0 for r in rows], "seconds", "compile time (first steps)")


def _checkpointing(axes, rows) -> None:
    labels = [r["policy"] for r in rows]
    _bars(axes[0], labels, [(r["step_s"] or 0) * 1e3 for r in rows], "ms per step", "step time (measured)")
    y = range(len(rows))
    axes[1].barh([i - 0.2 for i in y], [(r["peak_bytes"] or 0) / 2**20 for r in rows], height=0.4, label="peak, measured")
    axes[1].barh([i + 0.2 for i in y], [(r["predicted_peak_bytes"] or 0) / 2**20 for r in rows], height=0.4,
                 label="peak, planner")
    axes[1].set_yticks(list(y), labels)
    axes[1].invert_yaxis()
    axes[1].set_xlabel("MiB")
    axes[1].set_title("memory: measured vs planner", fontsize=9)
    axes[1].legend(fontsize=7, frameon=False)


def _batch(axes, rows) -> None:
    b = [r["batch"] for r in rows]
    for key, label in (("train_samples_per_s", "training"), ("infer_samples_per_s", "inference")):
        axes[0].plot(b, [r[key] for r in rows], marker="o", label=label)
        sat = [r for r in rows if r[f"{key[:5]}_saturated"]]
        axes[0].scatter([r["batch"] for r in sat], [r[key] for r in sat], s=120, facecolors="none", edgecolors="red")
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("batch size")
    axes[0].set_ylabel("samples/s")
    axes[0].set_title("throughput (red circle: saturation)", fontsize=9)
    axes[0].legend(fontsize=7, frameon=False)
    axes[1].plot(b, [r["infer_latency_s"] * 1e3 for r in rows], marker="o")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("batch size")
    axes[1].set_ylabel("ms")
    axes[1].set_title("inference latency", fontsize=9)


def _scaling(axes, rows) -> None:
    for kind in ("weak", "strong"):
        pts = sorted((r["processes"], r["efficiency"]) for r in rows if r["scaling"] == kind or r["processes"] == 1)
        if pts:
            axes[0].plot(*zip(*pts), marker="o", label=kind)
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set_xlabel("processes")
    axes[0].set_ylabel("efficiency")
    axes[0].set_title("scaling efficiency (1.0 = linear)", fontsize=9)
    axes[0].legend(fontsize=7, frameon=False)
    _bars(axes[1], [f"{r['processes']} {r['scaling']}" for r in rows], [r["samples_per_s"] for r in rows],
          "samples/s", "throughput")


def _energy(axes, rows) -> None:
    labels = [f"{r['device']} {r['precision']}" for r in rows]
    _bars(axes[0], labels, [r["j_per_1k"] for r in rows], f"J per 1k {rows[0]['per_1k'] if rows else ''}",
          f"energy ({', '.join(sorted({r['energy_source'] for r in rows}))})")
    _bars(axes[1], labels, [(r["flop_per_j"] or 0) / 1e9 for r in rows], "GFLOP per joule", "work per energy")


_PLOTS = {"devices": _devices, "precision": _precision, "compile": _compile, "checkpointing": _checkpointing,
          "batch": _batch, "scaling": _scaling, "energy": _energy}
