"""`tensorpilot bench --quick` end to end on this CPU: every suite once (one run shared by the
tests of this module), then a run naming an unknown suite and an unsupported precision beside a
good suite. Structure, files and finiteness are asserted, never timings."""

from __future__ import annotations

import json
import math

import pytest
from conftest import run_cli

from tensorpilot.bench.suites import CLAIMS, SUITES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _numbers(obj):
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _numbers(v)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "out"
    proc = run_cli("bench", "--quick", "--json", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_every_suite_writes_rows_claims_and_a_png(quick):
    out, proc = quick
    result = json.loads((out / "bench.json").read_text())
    assert json.loads(proc.stdout) == result                  # --json prints bench.json
    assert result["errors"] == {}
    assert result["fingerprint"] and result["machine"]["logical_cpus"] >= 1 and result["quick"] is True
    assert list(result["suites"]) == list(SUITES)
    for name, suite in result["suites"].items():
        assert suite["rows"], name
        assert [c["claim"] for c in suite["claims"]] == CLAIMS[name]
        for c in suite["claims"]:
            assert c["verdict"] in ("holds", "does not hold", "not measurable here")
            assert c["verdict"] == "holds" or c["why"], c        # a verdict other than holds says why
        assert result["commands"][name].startswith(f"tensorpilot bench {name} --quick")
        png = out / suite["png"]
        assert png.name == f"{name}.png" and png.read_bytes()[:8] == PNG_MAGIC
        # every figure is a finite number (JSON has no NaN: bench writes None for one)
        assert all(math.isfinite(x) for x in _numbers(suite["rows"]))
    assert result["suites"]["scaling"]["commands"] and "--nproc 2" in " ".join(result["suites"]["scaling"]["commands"])


def test_key_figures_are_positive(quick):
    suites = json.loads((quick[0] / "bench.json").read_text())["suites"]
    positive = {"devices": ["throughput"], "precision": ["step_s", "peak_bytes", "loss"],
                "compile": ["step_s"], "batch": ["train_samples_per_s", "infer_latency_s", "infer_samples_per_s"],
                "scaling": ["samples_per_s", "efficiency"], "energy": ["energy_per_step_j", "j_per_1k"]}
    for name, keys in positive.items():
        for row in suites[name]["rows"]:
            assert all(row[k] > 0 for k in keys), (name, row)
    ckpt = {r["policy"]: r for r in suites["checkpointing"]["rows"]}
    assert ckpt["none"]["peak_bytes"] > 0 and ckpt["full"]["step_s"] > 0
    assert ckpt["selective"]["step_s"] is None and ckpt["selective"]["predicted_activation_bytes"] > 0
    assert {r["device"] for r in suites["devices"]["rows"]} >= {"cpu"}
    assert {r["precision"] for r in suites["precision"]["rows"]} >= {"fp32", "bf16"}
    assert all(r["energy_source"] for r in suites["energy"]["rows"])


def test_report_states_every_claim(quick):
    out, _ = quick
    md = (out / "report.md").read_text()
    for name, claims in CLAIMS.items():
        for claim in claims:
            assert f"| {name} | {claim} |" in md
        assert f"![{name}]({name}.png)" in md
    assert "not measurable here" in md                         # no accelerator on the CPU runner


@pytest.fixture(scope="module")
def with_errors(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-errors") / "out"
    proc = run_cli("bench", "nosuch", "precision", "devices", "--quick", "--precisions", "fp8", "--out", str(out),
                   timeout=300)
    return out, proc


def test_unknown_suite_and_unsupported_precision_are_one_sentence_each_and_the_rest_runs(with_errors):
    out, proc = with_errors
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tensorpilot bench: error:")]
    assert len(errors) == 2, proc.stderr
    assert "unknown suite 'nosuch'" in errors[0] and "devices, precision" in errors[0]
    assert "precision fp8 cannot be measured on cpu" in errors[1]
    result = json.loads((out / "bench.json").read_text())
    assert set(result["errors"]) == {"nosuch", "precision"}
    assert list(result["suites"]) == ["devices"] and (out / "devices.png").exists()
    assert "bench devices" in proc.stdout                      # the table of the suite that ran
