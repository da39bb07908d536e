"""Does an output layer whose vocabulary is not a multiple of 8 show in the published runs? The
speed rows outside the reference split, grouped by the part's family in calibration.MISALIGNED_GEMM_
SPEED (Hopper 0.16, Ampere / Ada 0.35, other parts unmeasured), by whether the row's vocabulary is a
multiple of 8 and by whether its stack pads it (validate._vocab_multiple), rows with a language-model head
only: median signed speed error
(planned over published: + is planned fast) and rows / sources, for one or more validate JSONs of the
same file side by side (say, before and after the unaligned rate).

    tensorpilot plan validate tests/unit/data/published_runs.csv \\
        --hardware-file tests/unit/data/published_runs_hardware.toml --json > after.json
    python benchmarks/vocab_alignment.py before.json after.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from tensorpilot.hardware import catalog
from tensorpilot.plan import calibration as cal
from tensorpilot.plan.validate import _spec, _speed, _vocab_multiple, load_rows

SPEED_KINDS = ("throughput", "step_time", "totals")


def group(row) -> tuple[str, str, str] | None:
    try:
        vocab = int(float(row["vocab"]))
        key = cal.calibration_key(catalog.get(row["gpu"]))
        spec = _spec(row)
    except Exception:            # a blank vocabulary, a part the catalog lacks: not grouped
        return None
    if spec is None or not spec.lm_head:      # an encoder's task head: no vocabulary GEMMs planned
        return None
    family = "hopper" if key in cal._HOPPER else "ampere/ada" if key in cal._AMPERE_ADA else "other"
    pads = "pads" if _vocab_multiple(row) > 1 else "unpadded"
    return family, "unaligned" if cal.unaligned(vocab, 2) else "aligned", pads


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("validated", nargs="+", type=Path, help="`plan validate --json` outputs of the same file")
    ap.add_argument("--csv", default="tests/unit/data/published_runs.csv")
    ap.add_argument("--hardware-file", default="tests/unit/data/published_runs_hardware.toml")
    a = ap.parse_args(argv)
    catalog.load_hardware_file(a.hardware_file)
    rows = {r["id"]: r for r in load_rows(a.csv)}
    cells: dict[tuple, list[list[float]]] = defaultdict(lambda: [[] for _ in a.validated])
    sources: dict[tuple, set] = defaultdict(set)
    for i, path in enumerate(a.validated):
        for x in json.loads(path.read_text())["rows"]:
            if x.get("predicted") is None or not x.get("published") or x["split"] == "reference" \
                    or x["kind"] not in SPEED_KINDS or (g := group(rows[x["id"]])) is None:
                continue
            cells[g][i].append(math.log(_speed(x["metric"], x["predicted"]) / _speed(x["metric"], x["published"])))
            sources[g].add(rows[x["id"]]["source"])
    print("| part family | vocabulary | stack | rows | sources | " + " | ".join(p.name for p in a.validated) + " |")
    print("|---|---|---|---:|---:|" + "---:|" * len(a.validated))
    for g in sorted(cells):
        med = [f"{math.exp(statistics.median(v)) - 1:+.1%}" if v else "n/a" for v in cells[g]]
        print(f"| {' | '.join(g)} | {len(cells[g][0])} | {len(sources[g])} | {' | '.join(med)} |")


if __name__ == "__main__":
    main()
