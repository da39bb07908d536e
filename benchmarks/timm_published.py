"""Planned vs published: training steps of timm's own models on an RTX 3090, as timm published them.

timm's benchmark.py timed a training step of each of its models (fp16 autocast without a scaler,
cross-entropy, SGD with momentum, each step synchronised) on one RTX 3090 with PyTorch 1.12 and
CUDA 11.3, once with NCHW and once with NHWC (channels_last) tensors. Those figures are in
benchmarks/data/timm_train_rtx3090_pt112.csv, copied unchanged from timm's repository
(huggingface/pytorch-image-models, commit c865028c, results/benchmark-train-amp-{nchw,nhwc}-pt112-
cu113-rtx3090.csv). None of these models or runs was used to build the planner, so they check the
traced planner (`tensorpilot plan --model timm:NAME`) on models nobody here wrote.

    python benchmarks/timm_published.py plan --out benchmarks/results/timm_published_plan.jsonl [--jobs 2]
        # plans a fixed sample of the models (sha1 of the name mod 5 == 0, so the sample does not
        # depend on anything measured) at the published batch size and image size, in NCHW and in
        # NHWC (`--memory-format channels_last`)
    python benchmarks/timm_published.py report --planned benchmarks/results/timm_published_plan.jsonl

The sample is split in two by the same hash, tune (mod 10 == 0) and check (mod 10 == 5), so a rule
studied on one half is judged on the other.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "timm_train_rtx3090_pt112.csv"
GPU = "rtx-3090"


def _bucket(name: str) -> int:
    return int(hashlib.sha1(name.encode()).hexdigest(), 16) % 10


def half(name: str) -> str | None:
    """'tune', 'check' or None (not sampled): a fixed split of the names, independent of any figure."""
    return {0: "tune", 5: "check"}.get(_bucket(name))


def published_rows() -> list[dict]:
    with DATA.open() as f:
        return [dict(r, batch_size=int(r["batch_size"]), img_size=int(r["img_size"]),
                     train_step_ms=float(r["train_step_ms"])) for r in csv.DictReader(f)]


def _worker(keys: list[list], out: str, kernels: str) -> None:
    """Plans ``keys`` ([name, batch, img]) in this one process, appending one JSON line per plan to
    ``out``: `tensorpilot plan --model timm:NAME --input-shape 3,IMG,IMG --batch-size B --precision fp16-amp
    --optim sgd --gpu rtx-3090` without its start-up (imports) for each model. NHWC is the same trace
    costed without cuDNN's NCHW<->NHWC transforms (costs.NCHW_TRANSPOSED_DTYPES emptied): what
    `--memory-format channels_last` plans up to the 4-D tensors' strides (resnet50 here: 519.6 vs
    524.4 ms), at half the tracing time."""
    import torch

    from tensorpilot.errors import ConfigError
    from tensorpilot.hardware import catalog
    from tensorpilot.modelplan import costs, planner, sources
    from tensorpilot.modelplan.fusion import fuse

    torch.set_num_threads(1)
    acc = catalog.get(GPU)
    nchw_dtypes = costs.NCHW_TRANSPOSED_DTYPES
    with open(out, "a") as f:
        for name, batch, img in keys:
            key = "%s@%d@%d" % (name, batch, img)
            try:
                src = sources.load(f"timm:{name}")
                trace = planner.trace_source(src, batch_size=batch, precision="fp16", optimizer="sgd",
                                             input_shape=(3, img, img), gpu_autocast=True)
                if kernels == "fused":
                    trace = fuse(trace)
            except (ConfigError, RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
                for layout in ("nchw", "nhwc"):
                    f.write(json.dumps({"key": key, "layout": layout, "error": f"{type(exc).__name__}: "
                                        f"{(str(exc).splitlines() or [''])[0][:300]}"}) + "\n")
                f.flush()
                continue
            for layout in ("nchw", "nhwc"):
                costs.NCHW_TRANSPOSED_DTYPES = nchw_dtypes if layout == "nchw" else ()
                p = planner.plan_catalog(trace, src, acc, batch_size=batch, precision="fp16", optimizer="sgd")
                f.write(json.dumps({"key": key, "layout": layout, "step_s": p.step_time_s,
                                    "breakdown_s": p.time_breakdown_s, "params": p.params,
                                    "memory_bytes": p.memory_bytes["total"]}) + "\n")
            costs.NCHW_TRANSPOSED_DTYPES = nchw_dtypes
            f.flush()


def plan(args) -> int:
    keys = sorted({(r["model"], r["batch_size"], r["img_size"]) for r in published_rows() if half(r["model"])})
    if args.family:
        keys = [k for k in keys if family(k[0]) in args.family.split(",")]
    if args.limit:
        keys = keys[:args.limit]
    out = Path(args.out)
    done = set()
    if out.exists():                # a second call plans only what the first did not finish
        done = {json.loads(line)["key"] for line in out.read_text().splitlines() if line.strip()}
    todo = [list(k) for k in keys if "%s@%d@%d" % k not in done]
    print(f"{len(keys)} sampled (model, batch, image) keys, {len(todo)} to plan, {args.jobs} processes", flush=True)
    procs = [subprocess.Popen([sys.executable, __file__, "_worker", json.dumps(todo[i::args.jobs]), str(out),
                               args.kernels], env=dict(os.environ, OMP_NUM_THREADS="1"))
             for i in range(args.jobs)]
    return max(p.wait() for p in procs)


def load_plans(path: str) -> dict[tuple[str, str], dict]:
    """(key, layout) -> plan record, from the JSON lines ``plan`` wrote."""
    plans = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            plans[(rec["key"], rec["layout"])] = rec
    return plans


def errors(plans: dict, layout_blind: bool = False) -> list[dict]:
    """One entry per published row that was planned in its layout: planned / published - 1 on the step time.
    ``layout_blind``: every row against the plan without layout transforms, as the planner before
    the transforms were modelled (8fbe630) planned NCHW and NHWC alike."""
    out = []
    for r in published_rows():
        p = plans.get(("%s@%d@%d" % (r["model"], r["batch_size"], r["img_size"]), "nhwc" if layout_blind
                       else r["layout"]))
        if not p or "step_s" not in p:
            continue
        out.append({"model": r["model"], "layout": r["layout"], "half": half(r["model"]),
                    "published_ms": r["train_step_ms"], "planned_ms": p["step_s"] * 1e3,
                    "error": p["step_s"] * 1e3 / r["train_step_ms"] - 1})
    return out


# For reading the report only (no rule uses them): models by name into three families
_ATTENTION = re.compile(r"vit|deit|beit|cait|crossvit|coat|xcit|swin|twins|pit_|tnt|mixer|resmlp|gmlp|gmixer|convit|"
                        r"levit|sequencer|volo|pvt|visformer|botnet|halonet|eva|maxvit|coatnet|nest_")
_DEPTHWISE = re.compile(r"efficientnet|mobilenet|mnasnet|mixnet|ghostnet|rexnet|convmixer|tinynet|fbnet|lcnet|"
                        r"hardcorenas|semnasnet|spnasnet|edgenext|mobilevit|convnext|regnetz|nfnet|_dw|xception|"
                        r"lambda|dla.*x|poolformer|efficientformer|mobileone|fastvit")


def family(name: str) -> str:
    if _ATTENTION.search(name):
        return "attention / MLP"
    return "depthwise / grouped-heavy" if _DEPTHWISE.search(name) else "dense convolutional"


def _summary(rows: list[dict]) -> str:
    if not rows:
        return "no rows"
    e = [r["error"] for r in rows]
    within = sum(abs(x) <= 0.10 for x in e) / len(e)
    return (f"{len(e)} rows, median |error| {statistics.median(abs(x) for x in e):.1%}, "
            f"median signed {statistics.median(e):+.1%}, {within:.0%} within 10%")


def report(args) -> int:
    plans = load_plans(args.planned)
    rows = errors(plans)
    failed = sorted({k for (k, _), v in plans.items() if "error" in v})
    print(f"{len({k for k, _ in plans})} sampled (model, batch, image) keys planned, {len(failed)} failed to plan")
    for part in ("tune", "check"):
        for layout in ("nchw", "nhwc"):
            sel = [r for r in rows if r["half"] == part and r["layout"] == layout]
            print(f"{part:5} {layout}: {_summary(sel)}")
    print(f"all: {_summary(rows)}")
    blind = errors(plans, layout_blind=True)
    for part in ("tune", "check"):
        sel = [r for r in blind if r["half"] == part and r["layout"] == "nchw"]
        print(f"{part:5} nchw without the layout transforms (the planner before 8fbe630): {_summary(sel)}")
    for fam in ("dense convolutional", "depthwise / grouped-heavy", "attention / MLP"):
        for layout in ("nchw", "nhwc"):
            sel = [r for r in rows if r["layout"] == layout and family(r["model"]) == fam]
            before = [r for r in blind if r["layout"] == layout and family(r["model"]) == fam]
            print(f"{fam} {layout}: {_summary(sel)}; without the transforms: {_summary(before)}")
    if args.rows:
        for r in sorted(rows, key=lambda r: r["error"]):
            if r["half"] == args.rows or args.rows == "all":
                print(f"| {r['model']} | {r['layout']} | {r['published_ms']:.1f} | {r['planned_ms']:.1f} | "
                      f"{r['error']:+.0%} |")
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        _worker(json.loads(sys.argv[2]), sys.argv[3], sys.argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--out", required=True, help="JSON lines, appended to: a second call plans what is missing")
    p.add_argument("--jobs", type=int, default=2, help="processes")
    p.add_argument("--limit", type=int, default=0, help="plan only the first N sampled models (a smoke test)")
    p.add_argument("--kernels", choices=["eager", "fused"], default="eager")
    p.add_argument("--family", default="", help="plan only these families (comma-separated names of family())")
    r = sub.add_parser("report")
    r.add_argument("--planned", required=True)
    r.add_argument("--rows", choices=["tune", "check", "all"], help="also list each row of that half")
    args = ap.parse_args()
    return {"plan": plan, "report": report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
