"""The blind error by kind of source: papers, vendor and framework pages, MLPerf, personal work.

Reads every row of benchmarks/results/holdout*_blind.md (| id | metric | published | predicted |
error | note |, each validated blind at its pass's commit) and classes its source, from the
validation file, by its text: MLPerf (mlcommons / mlperf named), a paper (arXiv, "et al.", a venue,
a year in an author-year citation), a vendor or framework page (the source starts with an
organisation that ships hardware or a training stack), else personal or other. Does a
well-documented source land closer?

    python benchmarks/blind_by_source_kind.py [tests/unit/data/published_runs.csv]
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROW = re.compile(r"^\| ([^|]+) \| [^|]+ \| [^|]+ \| [^|]+ \| ([+-][0-9.]+)% \|")
PAPER = re.compile(r"arxiv|et al\.|\b(19|20)\d\d,? ?'|proceedings|icml|neurips|iclr|sosp|osdi|mlsys|usenix|"
                   r"\bacl\b|emnlp|ppopp|paper")
VENDORS = ("nvidia", "deepspeedai", "microsoft", "huggingface", "pytorch", "meta-pytorch", "google", "aws",
           "amd", "rocm", "intel", "habana", "lightning-ai", "mosaicml", "databricks", "lambdal", "mila",
           "flagopen", "paddlepaddle", "oneflow", "hpcaitech", "bigscience", "eleutherai", "allenai",
           "modelscope", "internlm", "qwenlm", "openbmb", "foundation-model-stack", "ibm", "stas00",
           "mistralai", "jax-ml", "axolotl", "unslothai", "linkedin", "dao-ailab", "thunlp", "sail-sg")


def kind(source: str) -> str:
    text = source.lower()
    if "mlcommons" in text or "mlperf" in text:
        return "MLPerf"
    if PAPER.search(text):
        return "paper"
    if text.startswith(VENDORS):
        return "vendor or framework page"
    return "personal or other"


def main() -> None:
    csv_path = sys.argv[1] if len(sys.argv) > 1 else "tests/unit/data/published_runs.csv"
    source = {r["id"]: r["source"] for r in csv.DictReader(open(csv_path, encoding="utf-8-sig"))}
    errors: dict[str, list[float]] = defaultdict(list)
    for path in sorted((Path(__file__).parent / "results").glob("holdout*_blind.md")):
        for line in path.read_text().splitlines():
            if m := ROW.match(line):
                errors[kind(source[m.group(1).strip()])].append(abs(float(m.group(2))))
    for name, errs in sorted(errors.items(), key=lambda kv: -len(kv[1])):
        within = sum(e <= 10 for e in errs) / len(errs)
        print(f"{name:26s} {len(errs):6,d} rows  median |error| {statistics.median(errs):5.1f}%  "
              f"within 10% {within:.0%}")


if __name__ == "__main__":
    main()
