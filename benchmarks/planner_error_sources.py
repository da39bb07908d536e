"""Where the planner's error on published runs lives: each source's level, or how runs scale in it.

Reads the validation file and what `tensorpilot plan validate --json` predicted for it, takes the
speed rows (throughput, TFLOP/s, MFU, step time, totals) outside the reference split, turns every
error into a signed error on speed (a step time planned 10% long is a speed planned 9.1% slow) and
prints:

1. the median |error| as planned, and with every prediction scaled by the one factor that best
   centres them (is the error a global bias?);
2. the median |error| once each row's source level is known: the row's log error less the median log
   error of the same source's *other* runs (never the same run published as another metric), so what
   remains is the planner's error on how runs scale within one document -- what anchoring on the
   user's own runs (`plan validate --anchor`) could reach at best;
3. the same level guessed from the other sources instead (source held out): the median level of the
   sources that share the row's framework (named in its source or notes), precision and kernels --
   how far coarse facts about a stack go towards its level;
4. the agreement of different sources that publish the same planner inputs (rows whose predictions
   are identical): their spread around their geometric median against the planner's error on them;
5. pairs of one source's rows (same metric) that differ in one planner input only: by input, how
   far the planner misses their ratio; for precision and the part, the most common pairs and which
   way the planner leans (the second row of the pair planned faster, relative to the first, by);
6. the memory rows outside the reference split by metric and sharding, and by metric and
   recompute: median signed error (planned over published) -- which memory the planner misses.

    tensorpilot plan validate tests/unit/data/published_runs.csv \\
        --hardware-file tests/unit/data/published_runs_hardware.toml --json > /tmp/validate.json
    python benchmarks/planner_error_sources.py /tmp/validate.json [tests/unit/data/published_runs.csv]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
from collections import Counter, defaultdict

from tensorpilot.plan.validate import SLOW_METRICS, _kernels, _run_key

SPEED_KINDS = ("throughput", "step_time", "totals")
# frameworks by the first name found in a row's source or notes (order: the more specific first)
FRAMEWORKS = ("nemo", "megatron", "deepspeed", "torchtitan", "maxtext", "jax", "colossal", "paddle",
              "mlcommons", "nanogpt", "llm.c", "unsloth", "axolotl", "torchtune", "llama-factory", "xtuner",
              "swift", "composer", "foundry", "lightning", "accelerate", "trainer", "fsdp")


# part families by the first name found in a row's gpu column (the more specific first)
PART_FAMILIES = ("gh200", "gb200", "gb300", "b200", "b300", "h200", "h100", "h800", "h20", "a100", "a800", "v100",
                 "mi250", "mi300", "mi325", "mi355", "4090", "3090", "5090", "a6000", "l40", "a10", "t4", "p100",
                 "tpu", "gaudi", "trn")


def part_family(row: dict) -> str:
    name = row["gpu"].lower()
    return next((f for f in PART_FAMILIES if f in name), "other")


def framework(row: dict) -> str:
    text = f"{row['source']} {row['flops_convention']}".lower()
    return next((f for f in FRAMEWORKS if f in text), "other")


def owner(source: str) -> str:
    found = re.search(r"([\w.-]+)/[\w.-]+", source)
    return (found.group(1) if found else (source.split() or [""])[0]).lower()


def speed_rows(results: list[dict], rows: dict[str, dict]) -> list[tuple[dict, float]]:
    """(CSV row, log of planned / published speed) of every predicted non-reference speed row."""
    out = []
    for r in results:
        if r.get("error_pct") is None or r["split"] == "reference" or r["kind"] not in SPEED_KINDS:
            continue
        ratio = 1 + r["error_pct"] / 100          # planned / published value
        out.append((rows[r["id"]], -math.log(ratio) if r["metric"] in SLOW_METRICS else math.log(ratio)))
    return out


def pct(logs: list[float]) -> str:
    errs = [abs(math.exp(x) - 1) * 100 for x in logs]
    within = sum(e <= 10 for e in errs) / len(errs)
    return f"{statistics.median(errs):.1f}% ({within:.0%} within 10%)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("validate_json", help="output of `tensorpilot plan validate FILE --json`")
    ap.add_argument("csv", nargs="?", default="tests/unit/data/published_runs.csv")
    args = ap.parse_args()
    rows = {r["id"]: r for r in csv.DictReader(open(args.csv, encoding="utf-8-sig"))}
    results = json.load(open(args.validate_json))["rows"]
    data = speed_rows(results, rows)
    logs = [x for _, x in data]
    print(f"{len(data)} predicted speed rows outside the reference split, "
          f"{len({r['source'] for r, _ in data})} sources")
    print(f"1. as planned: {pct(logs)}; median signed {math.exp(statistics.median(logs)) * 100 - 100:+.1f}%")
    centre = statistics.median(logs)
    print(f"   every prediction scaled by {math.exp(-centre):.3f} (signed median to 0): "
          f"{pct([x - centre for x in logs])}")

    grouped: dict[str, list[tuple[dict, float]]] = defaultdict(list)
    for row, x in data:
        grouped[row["source"]].append((row, x))
    by_source = {source: [(x, _run_key(row)) for row, x in members] for source, members in grouped.items()}
    planned, levelled = [], []
    for members in by_source.values():
        for x, key in members:
            others = [y for y, k in members if k != key]
            if others:
                planned.append(x)
                levelled.append(x - statistics.median(others))
    print(f"2. rows with another run in their source: {len(planned)}; as planned {pct(planned)}; "
          f"less the source's level (median of its other runs) {pct(levelled)}")
    levels = [statistics.median(x for x, _ in m) for m in by_source.values()]
    q = statistics.quantiles(levels, n=4)
    print(f"   source levels (median signed error of each source's rows): median "
          f"{math.exp(statistics.median(levels)) * 100 - 100:+.1f}%, quartiles "
          f"{math.exp(q[0]) * 100 - 100:+.1f}% .. {math.exp(q[2]) * 100 - 100:+.1f}%")

    keys = {"framework": lambda r: (framework(r),),
            "framework + precision": lambda r: (framework(r), (r["precision"].split() or ["?"])[0]),
            "framework + precision + kernels": lambda r: (framework(r), (r["precision"].split() or ["?"])[0],
                                                          _kernels(r))}
    print("3. the level guessed from the other sources sharing the row's (at least 5 of them):")
    for name, key in keys.items():
        source_level: dict[tuple, list[tuple[str, float]]] = defaultdict(list)
        for source, members in grouped.items():
            k = Counter(key(r) for r, _ in members).most_common(1)[0][0]
            source_level[k].append((source, statistics.median(x for _, x in members)))
        guessed = []
        for row, x in data:
            others = [lv for s, lv in source_level[key(row)] if s != row["source"]]
            guessed.append(x - (statistics.median(others) if len(others) >= 5 else 0.0))
        print(f"   {name}: {len(source_level)} groups, {pct(guessed)}")

    same: dict[tuple, list[tuple[str, float, float]]] = defaultdict(list)
    for r in results:
        if r.get("predicted") is None or r["split"] == "reference" or r["kind"] not in SPEED_KINDS:
            continue
        same[(r["metric"], round(r["predicted"], 6))].append((rows[r["id"]]["source"], r["published"],
                                                              r["error_pct"]))
    for label, apart in (("sources", lambda m: {s for s, _, _ in m}),
                         ("owners (a repository's owner, else the source's first word)",
                          lambda m: {owner(s) for s, _, _ in m})):
        spread, errors = [], []
        for members in same.values():
            if len(apart(members)) < 2:
                continue
            centre = statistics.median(math.log(p) for _, p, _ in members)
            spread += [abs(math.log(p) - centre) for _, p, _ in members]
            errors += [abs(e) for _, _, e in members]
        print(f"4. rows whose identical planner inputs two or more {label} published: {len(spread)}; "
              f"their spread around the group's geometric median {pct(spread)}; the planner's median "
              f"|error| on them {statistics.median(errors):.1f}%")

    # 5. one source's rows of one metric that differ in exactly one planner input
    runs: dict[tuple[str, str], list[tuple[float, dict, dict]]] = defaultdict(list)
    metric_of = {r["id"]: r["metric"] for r in results}
    for row, x in data:
        runs[(row["source"], metric_of[row["id"]])].append((x, dict(_run_key(row)), row))
    pairs: dict[str, list[tuple[float, str]]] = defaultdict(list)
    values: dict[tuple[str, str, str], list[tuple[float, str]]] = defaultdict(list)
    label = {"precision": lambda r: r["precision"].strip().lower(), "gpu": part_family}
    for (source, _), members in runs.items():
        for i, (xa, ka, ra) in enumerate(members):
            for xb, kb, rb in members[i + 1:]:
                differ = [k for k in set(ka) | set(kb) if ka.get(k) != kb.get(k)]
                if len(differ) != 1:
                    continue
                field = differ[0]
                pairs[field].append((abs(xb - xa), source))
                if field in label and label[field](ra) != label[field](rb):
                    (a, xa2), (b, xb2) = sorted([(label[field](ra), xa), (label[field](rb), xb)])
                    values[(field, a, b)].append((xb2 - xa2, source))
    print("5. one source's rows that differ in one planner input only (|error| on the ratio of the two):")
    for field, found in sorted(pairs.items(), key=lambda kv: -len(kv[1])):
        if len(found) >= 15:
            print(f"   {field}: {len(found)} pairs, {len({s for _, s in found})} sources, "
                  f"{pct([d for d, _ in found])}")
    for (field, a, b), found in sorted(values.items(), key=lambda kv: -len(kv[1]))[:12]:
        lean = math.exp(statistics.median(d for d, _ in found)) * 100 - 100
        print(f"   {field} {a} -> {b}: {len(found)} pairs, {len({s for _, s in found})} sources, "
              f"the second planned {lean:+.1f}% faster relative to the first")

    print("6. memory rows (median signed error, planned over published; groups of 20 rows or more):")
    for field in ("sharding", "recompute"):
        memory: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
        for r in results:
            if r.get("error_pct") is not None and r["split"] != "reference" and r["kind"] == "memory":
                row = rows[r["id"]]
                memory[(r["metric"], row[field] or "(blank)")].append((r["error_pct"], row["source"]))
        for (metric, value), found in sorted(memory.items(), key=lambda kv: -len(kv[1])):
            if len(found) >= 20:
                print(f"   {metric}, {field} {value}: {len(found)} rows, {len({s for _, s in found})} sources, "
                      f"{statistics.median(e for e, _ in found):+.1f}%")


if __name__ == "__main__":
    main()
