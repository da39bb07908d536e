"""End to end: a short CPU `tensorpilot train` reports its energy, the source and how, and CO2
when given a grid intensity; `tensorpilot hw --json` names the same source; bad intensities
end in one sentence and exit 2 before anything is built. The commands are docs/energy.md's."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
from conftest import FAST, run_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "energy.md"


def doc_command(verb: str) -> list[str]:
    """The arguments of docs/energy.md's first `tensorpilot VERB ...` line."""
    block = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)[0]
    lines = [shlex.split(line.split("#")[0])[1:] for line in block.splitlines() if line.startswith("tensorpilot ")]
    return next(argv for argv in lines if argv[0] == verb)


# a short run: no traced prediction, no checkpoint or TensorBoard files, fp32 (no ceiling probe)
QUICK = [*FAST, "--steps", "6", "--precision", "fp32", "--no-train.predict", "--no-checkpoint.enabled",
         "--no-logging.tensorboard", "--train.eval_interval", "6"]


def test_cpu_train_writes_finite_energy_its_source_and_co2(tmp_path):
    from tensorpilot.observe import energy

    run = tmp_path / "run"
    argv = doc_command("train")                               # later options win: QUICK shortens it
    proc = run_cli(*argv, *QUICK, "--run-dir", str(run), check=True)
    s = json.loads((run / "summary.json").read_text())
    here = energy.choose(energy.probe("cpu"))                # what this machine exposes
    assert s["energy_source"] == here.source and s["energy_how"] == here.how
    assert math.isfinite(s["energy_j"]) and s["energy_j"] > 0
    assert 0 < s["energy_steps_j"] <= s["energy_j"]          # the timed steps are part of the loop
    # 1 kWh = 3.6e6 J at 400 g/kWh (the doc's --grid-intensity)
    assert argv[argv.index("--grid-intensity") + 1] == "400" and s["grid_intensity_g_per_kwh"] == 400.0
    assert s["co2_g"] == pytest.approx(s["energy_j"] / 3.6e6 * 400)
    # per token and per sample over the timed steps: J/token x tokens/s = J/s of those steps = power_w
    assert s["joules_per_token"] * s["tokens_per_s"] == pytest.approx(s["power_w"], rel=1e-6)
    assert s["joules_per_sample"] == pytest.approx(s["joules_per_token"] * 32)          # 32-byte context
    if s["energy_source"] == "estimate":                      # W per logical CPU x at most every CPU busy
        assert s["power_w"] <= energy.CPU_W_PER_THREAD * here.threads * 1.05
    assert "energy" in proc.stdout and s["energy_source"] in proc.stdout


def test_hw_json_names_the_energy_source():
    from tensorpilot.observe import energy

    data = json.loads(run_cli(*doc_command("hw"), "--json", check=True).stdout)
    cpu = data["devices"][0]["energy"]
    assert cpu["source"] == energy.choose(energy.probe("cpu")).source
    assert cpu["source"] in energy.SOURCES and cpu["how"]
    assert cpu["source"] != "estimate" or cpu["fallbacks"]    # an estimate says why there is no counter


@pytest.mark.parametrize("bad, says", [("-1", "must be from 0 to 10,000 g CO2 per kWh, got -1."),
                                       ("nan", "expected a finite number, got 'nan'.")])
def test_bad_grid_intensity_is_one_sentence_and_exit_2(tmp_path, bad, says):
    proc = run_cli("train", "--grid-intensity", bad, "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"tensorpilot train: error: train.grid_intensity{':' if bad == 'nan' else ''} {says}"
    assert not (tmp_path / "run").exists()
