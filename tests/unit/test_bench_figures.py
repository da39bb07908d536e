"""The pure parts of `tensorpilot bench`: saturation point, scaling efficiency, break-even,
verdicts, which precisions a device can run, and report.md from a made-up result. Numbers are
computed by hand in the comments."""

from __future__ import annotations

import math

import pytest

from tensorpilot.bench import figures as fg
from tensorpilot.bench.report import markdown
from tensorpilot.bench.command import SUITE_NAMES
from tensorpilot.bench.suites import CLAIMS, SUITES, _precision_claims, unsupported_precision
from tensorpilot.hardware.device import DeviceCaps

CPU = DeviceCaps(kind="cpu", name="test cpu", cpu_flags=frozenset({"avx2"}))
AMX_CPU = DeviceCaps(kind="cpu", name="test cpu", cpu_flags=frozenset({"amx_bf16", "avx512_bf16"}))
V100 = DeviceCaps(kind="cuda", name="V100", cuda_capability=(7, 0))
A100 = DeviceCaps(kind="cuda", name="A100", cuda_capability=(8, 0))
H100 = DeviceCaps(kind="cuda", name="H100", cuda_capability=(9, 0))


def test_saturation_is_the_first_batch_within_ten_percent_of_the_best():
    # best 335; 90% of it is 301.5: batch 4 (300) is below, batch 8 (330) the first above
    assert fg.saturation_batch({1: 100.0, 2: 180.0, 4: 300.0, 8: 330.0, 16: 335.0}) == 8
    # a peak in the middle: 0.9 x 500 = 450, batch 2 (460) already reaches it
    assert fg.saturation_batch({1: 200.0, 2: 460.0, 4: 500.0, 8: 400.0}) == 2
    assert fg.saturation_batch({}) is None


def test_scaling_efficiency_weak_and_strong():
    # weak: 1 process 100 samples/s, 2 processes 180 samples/s at twice the global batch: 180 / 200
    assert fg.scaling_efficiency(100.0, 180.0, 2) == pytest.approx(0.9)
    # strong: global batch 16 in 0.1 s on one (160/s), in 0.0625 s on four (256/s): 256 / 640
    assert fg.scaling_efficiency(160.0, 256.0, 4) == pytest.approx(0.4)
    assert fg.scaling_efficiency(None, 1.0, 2) is None


def test_break_even_steps():
    # 20 s of compilation, 100 ms -> 80 ms per step: 20 / 0.02 = 1000 steps
    assert fg.break_even_steps(20.0, 0.100, 0.080) == pytest.approx(1000)
    assert fg.break_even_steps(20.0, 0.080, 0.100) is None          # slower: never
    assert fg.break_even_steps(20.0, 0.080, 0.080) is None
    assert fg.break_even_steps(None, 0.1, 0.05) is None


def test_verdicts():
    c = fg.verdict("x is 2-8x faster", "3x", 3.0, 2, 8)
    assert (c.verdict, c.why) == (fg.HOLDS, "")
    above = fg.verdict("x is 2-8x faster", "12x", 12.0, 2, 8)
    assert above.verdict == fg.HOLDS and "above the claimed range" in above.why
    below = fg.verdict("x is 2-8x faster", "1.2x", 1.2, 2, 8)
    assert below.verdict == fg.FAILS and "below" in below.why
    assert fg.verdict("c", "-", None, 1).verdict == fg.UNMEASURABLE
    assert fg.verdict("c", "-", math.nan, 1).verdict == fg.UNMEASURABLE
    assert fg.unmeasurable("c", "no GPU").to_dict() == {"claim": "c", "figure": "-", "verdict": fg.UNMEASURABLE,
                                                        "why": "no GPU", "value": None}
    assert fg.speedup(0.2, 0.1) == 2.0 and fg.speedup(None, 0.1) is None


def test_which_precisions_a_device_runs():
    assert unsupported_precision("fp32", CPU) is None
    assert unsupported_precision("bf16", CPU) is None                 # autocast runs, if slowly
    assert unsupported_precision("fp16", CPU, cpu_fp16=True) is None
    assert "no fp16 autocast" in unsupported_precision("fp16", CPU, cpu_fp16=False)
    assert "compute capability 8.0" in unsupported_precision("tf32", CPU)
    assert unsupported_precision("tf32", A100) is None
    assert "compute capability 8.0" in unsupported_precision("bf16", V100)
    assert "8.9" in unsupported_precision("fp8", CPU) and "8.9" in unsupported_precision("fp8", A100)
    assert "no fp8 training recipe" in unsupported_precision("fp8", H100)
    assert "unknown precision" in unsupported_precision("int3", CPU)


def test_precision_claims_from_rows():
    rows = [{"precision": "fp32", "speedup_vs_fp32": 1.0, "memory_vs_fp32": 1.0},
            {"precision": "bf16", "speedup_vs_fp32": 3.0, "memory_vs_fp32": 0.55}]
    speed, memory = _precision_claims(rows, AMX_CPU)
    assert speed.verdict == fg.HOLDS and "AMX" in speed.figure
    # 1 / 0.55 = 1.82 >= 1 / 0.6 = 1.67: halved, near enough
    assert memory.verdict == fg.HOLDS and memory.value == pytest.approx(1 / 0.55)
    rows[1].update(speedup_vs_fp32=0.7, memory_vs_fp32=0.8)
    speed, memory = _precision_claims(rows, CPU)
    assert speed.verdict == fg.FAILS and "no matrix units" in speed.why
    assert memory.verdict == fg.FAILS and "autocast keeps fp32 weights" in memory.why
    only_fp32 = _precision_claims(rows[:1], CPU)
    assert [c.verdict for c in only_fp32] == [fg.UNMEASURABLE, fg.UNMEASURABLE]


def test_report_states_each_claim_with_its_figure_and_verdict():
    result = {"quick": True, "machine": {"cpu": "test cpu", "torch": "2.x", "logical_cpus": 2, "torch_threads": 2},
              "accelerators": [], "date": "today", "tensorpilot": "0", "fingerprint": "abc", "wall_s": 5.0,
              "command": "tensorpilot bench batch nosuch --quick",
              "suites": {"batch": {"claims": [fg.verdict("batching raises throughput", "2.0x", 2.0, 1.1).to_dict()],
                                   "notes": ["a note"], "png": "batch.png", "rows": []}},
              "errors": {"nosuch": "unknown suite 'nosuch'."}}
    md = markdown(result)
    assert "| batch | batching raises throughput | 2.0x | holds |" in md
    assert "not run: unknown suite 'nosuch'." in md and "![batch](batch.png)" in md and "`abc`" in md


def test_the_command_names_the_registered_suites_in_order():
    # the command lists them without importing the suites (argparse only at import)
    assert SUITE_NAMES == tuple(SUITES) == tuple(CLAIMS)
