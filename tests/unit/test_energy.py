"""Energy sources and meters (observe/energy.py), chosen from fake capability profiles: a fake
``pynvml``/``amdsmi`` object, a temporary directory laid out like /sys/class/powercap, fake CPU
and wall clocks. Every expected number is worked out by hand in the comment beside it."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tensorpilot.observe import energy
from tensorpilot.observe.energy import Capabilities, choose, rapl_delta_uj

NOWHERE = Path("/nonexistent/powercap")


def clock(*values: float):
    """A fake clock returning ``values`` in turn."""
    it = iter(values)
    return lambda: next(it)


# ------------------------------------------------------------------------------ NVML
class FakeNvml:
    """The few pynvml calls the meter makes; the energy counter steps through ``energy_mj``."""

    class NVMLError(Exception):
        pass

    def __init__(self, energy_mj=(1000, 3500), supported=True, util=40, uuids=("GPU-abc",)):
        self.energy_mj, self.supported, self.util, self.uuids = iter(energy_mj), supported, util, uuids
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.uuids:
            raise self.NVMLError("Not Found")
        return ("uuid", uuid)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("index", i)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.supported:
            raise self.NVMLError("Not Supported")
        return next(self.energy_mj)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=self.util, memory=10)


def gpu(**kw) -> Capabilities:
    return Capabilities(**{"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "index": 0, "uuid": "abc",
                           "tdp_w": 700.0, "powercap_root": NOWHERE, **kw})


def test_nvml_present_is_chosen_and_reads_millijoules_since_start():
    # capability check reads 1000 mJ, start() 1000 mJ, read() 3500 mJ: (3500 - 1000) / 1000 = 2.5 J
    nv = FakeNvml(energy_mj=(1000, 1000, 3500))
    m = choose(gpu(nvml=nv))
    assert m.source == "nvml" and not m.machine_wide and m.fallbacks == ()
    assert "found by UUID" in m.how and "nvmlDeviceGetTotalEnergyConsumption" in m.how
    m.start()
    assert m.read() == 2.5


def test_nvml_finds_the_board_by_index_when_the_uuid_is_unknown():
    m = choose(gpu(nvml=FakeNvml(energy_mj=(0,), uuids=()), index=3))
    assert m.source == "nvml" and "found by index" in m.how and m._handle == ("index", 3)


def test_nvml_without_an_energy_counter_falls_back_to_tdp_times_nvml_utilisation():
    # pre-Volta: no counter. 250 W x 0.40 (NVML says 40 %) x (102 - 100) s = 200 J, then
    # + 250 x 0.40 x (102.5 - 102) = 50 J: 250 J
    caps = gpu(nvml=FakeNvml(supported=False, util=40), name="Tesla P100-PCIE-16GB", tdp_w=250.0,
               clock=clock(100.0, 102.0, 102.5))
    m = choose(caps)
    assert m.source == "estimate"
    assert m.how.startswith("estimate: catalog TDP 250 W of Tesla P100-PCIE-16GB x NVML utilisation x time")
    assert "no total energy counter" in m.fallbacks[0]
    m.start()
    assert m.read() == pytest.approx(200.0)
    assert m.read() == pytest.approx(250.0)


def test_gpu_without_nvml_assumes_busy_and_says_it_is_an_upper_bound():
    # 700 W x 1 x 0.5 s = 350 J
    m = choose(gpu(clock=clock(0.0, 0.5)))
    assert m.source == "estimate" and "upper bound" in m.how
    assert m.fallbacks == ("NVML: pynvml is not installed (pip install 'tensorpilot[gpu]')",)
    m.start()
    assert m.read() == pytest.approx(350.0)


def test_an_uncatalogued_accelerator_without_counters_has_no_energy():
    m = choose(Capabilities(kind="mps", name="mps", powercap_root=NOWHERE))
    assert m.source == "none" and "no TDP in the catalog" in m.how
    m.start()
    assert math.isnan(m.read())


# --------------------------------------------------------------------------- AMD SMI
def fake_amdsmi(key: str, counts):
    it = iter(counts)
    return SimpleNamespace(amdsmi_init=lambda: None, amdsmi_get_processor_handles=lambda: ["h0", "h1"],
                           amdsmi_get_energy_count=lambda h: {key: next(it), "counter_resolution": 15.3,
                                                              "timestamp": 0})


@pytest.mark.parametrize("key", ["energy_accumulator", "power"])     # amdsmi >= 6.2.1, and before
def test_amdsmi_accumulator_times_resolution_in_microjoules(key):
    # (1,000,000 - 0) counts x 15.3 uJ = 15.3 J
    m = choose(Capabilities(kind="cuda", is_rocm=True, name="AMD Instinct MI300X", index=1,
                            amdsmi=fake_amdsmi(key, [0, 0, 1_000_000]), powercap_root=NOWHERE))
    assert m.source == "amdsmi" and m._handle == "h1"
    m.start()
    assert m.read() == pytest.approx(15.3)


def test_rocm_without_amdsmi_falls_back_with_its_reason():
    m = choose(Capabilities(kind="cuda", is_rocm=True, name="AMD Instinct MI300X", tdp_w=750.0,
                            powercap_root=NOWHERE))
    assert m.source == "estimate" and "amdsmi module is not importable" in m.fallbacks[0]


# ------------------------------------------------------------------------------ RAPL
def zone(root: Path, name: str, label: str, energy_uj: int, max_uj: int = 262_143_328_850) -> Path:
    d = root / name
    d.mkdir()
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


@pytest.fixture
def powercap(tmp_path):
    """One socket as the kernel lays it out: the package, its core and dram sub-zones, the
    platform zone (psys) and the MMIO copy of the package."""
    zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000, max_uj=10_000_000)
    zone(tmp_path, "intel-rapl:0:0", "core", 400_000)
    zone(tmp_path, "intel-rapl:0:1", "dram", 2_000_000, max_uj=50_000_000)
    zone(tmp_path, "intel-rapl:1", "psys", 9_000_000)
    zone(tmp_path, "intel-rapl-mmio:0", "package-0", 1_000_000)
    return tmp_path


def test_rapl_present_counts_packages_and_dram_not_core_psys_or_mmio(powercap):
    m = choose(Capabilities(kind="cpu", cpu_threads=2, powercap_root=powercap))
    try:
        assert m.source == "rapl" and m.machine_wide
        assert [z.name for z in m._zones] == ["package-0", "dram"]
        assert "package-0 + dram" in m.how and "once per host" in m.how
        m.start()
        # package: 1,000,000 -> 3,500,000 uJ (+2.5 J); dram: 2,000,000 -> 2,250,000 (+0.25 J)
        (powercap / "intel-rapl:0" / "energy_uj").write_text("3500000\n")
        (powercap / "intel-rapl:0:1" / "energy_uj").write_text("2250000\n")
        (powercap / "intel-rapl:0:0" / "energy_uj").write_text("999999999\n")     # ignored
        assert m.read() == pytest.approx(2.75)
        # the package counter wraps at 10,000,000: 3,500,000 -> 9,900,000 (+6.4 J), then -> 600,000:
        # (10,000,000 - 9,900,000) + 600,000 = 700,000 uJ (+0.7 J); dram unchanged
        (powercap / "intel-rapl:0" / "energy_uj").write_text("9900000\n")
        assert m.read() == pytest.approx(2.75 + 6.4)
        (powercap / "intel-rapl:0" / "energy_uj").write_text("600000\n")
        assert m.read() == pytest.approx(2.75 + 6.4 + 0.7)
    finally:
        m.close()


def test_rapl_wraparound_arithmetic_by_hand():
    assert rapl_delta_uj(200, 700, 1_000) == 500                 # no wrap: 700 - 200
    assert rapl_delta_uj(900, 100, 1_000) == 200                 # wrapped: (1,000 - 900) + 100
    assert rapl_delta_uj(262_143_328_000, 150, 262_143_328_850) == 1_000   # 850 + 150, the usual range
    assert rapl_delta_uj(5, 5, 1_000) == 0


def test_unreadable_rapl_falls_back_to_the_estimate_with_the_reason(powercap):
    # energy_uj is root-only since Linux 5.10; the tests may run as root, so the denial is faked
    def read_text(path: Path) -> str:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return path.read_text()

    m = choose(Capabilities(kind="cpu", cpu_threads=4, powercap_root=powercap, read_text=read_text))
    assert m.source == "estimate"
    (reason,) = m.fallbacks
    assert reason.startswith("RAPL: ") and "readable by root only" in reason and "intel-rapl:0" in reason
    assert reason in m.how


def test_powercap_without_a_package_zone_falls_back(tmp_path):
    zone(tmp_path, "intel-rapl:1", "psys", 5)
    m = choose(Capabilities(kind="cpu", powercap_root=tmp_path))
    assert m.source == "estimate" and m.fallbacks == (f"RAPL: no package zone under {tmp_path}",)


# -------------------------------------------------------------------------- estimate
def test_no_counter_on_a_cpu_gives_the_labelled_cpu_time_estimate():
    # 2 logical CPUs; the process used 11.5 - 10.0 = 1.5 CPU seconds in 101 - 100 = 1 s of wall time:
    # utilisation 1.5 / (1 x 2) = 0.75; energy = TDP share (3 W x 2) x 0.75 x 1 s = 4.5 J = 3 W x 1.5 s
    m = choose(Capabilities(kind="cpu", cpu_threads=2, powercap_root=NOWHERE,
                            cpu_seconds=clock(10.0, 11.5), clock=clock(100.0, 101.0)))
    assert m.source == "estimate" and not m.machine_wide
    assert m.how.startswith("estimate: 3 W x process CPU seconds")
    assert "TDP share (3 W x 2 logical CPUs) x utilisation (CPU time / (wall x 2)) x wall" in m.how
    assert m.fallbacks == (f"RAPL: no intel-rapl zones under {NOWHERE} (virtual machines and containers "
                           "usually hide them)",)
    m.start()
    assert m.read() == pytest.approx(4.5)
    assert m.utilisation == pytest.approx(0.75)
    assert energy.CPU_W_PER_THREAD == 3.0


def test_the_real_cpu_time_estimate_grows_with_work():
    m = choose(Capabilities(kind="cpu", cpu_threads=1, powercap_root=NOWHERE))
    m.start()
    sum(i * i for i in range(200_000))            # a few ms of CPU
    assert 0 < m.read() < 3.0 * 5                  # less than 5 CPU seconds' worth


def test_this_machine_has_a_source(capsys):
    """Whatever this machine exposes (reported in the test output): a known source, a reading."""
    m = choose(energy.probe("cpu"))
    m.start()
    value = m.read()
    m.close()
    with capsys.disabled():
        print(f"\n  energy source of this machine's CPU: {m.how}")
    assert m.source in ("rapl", "estimate") and math.isfinite(value) and value >= 0


# ---------------------------------------------------------------------- figures, runs
def test_co2_and_formula_prediction_by_hand():
    assert energy.co2_grams(3.6e6, 400.0) == pytest.approx(400.0)       # 1 kWh at 400 g/kWh
    assert energy.co2_grams(1800.0, 0.0) == 0.0
    # planner: 500 W per device x 2 devices x 0.1 s = 100 J per step; measured 120 J: ratio 1.2
    p = energy.formula_prediction(500.0, 2, 0.1, 120.0)
    assert p == {"energy_per_step_j": pytest.approx(100.0), "power_w": 1000.0,
                 "measured_energy_per_step_j": 120.0, "energy_measured_over_predicted": pytest.approx(1.2)}
    assert energy.formula_prediction(None, 1, 0.1, 5.0) is None           # no TDP (a CPU)


def test_traced_plan_energy_uses_the_formula_planners_power_model_by_hand():
    """Any model's plan on a catalogued GPU gets board power and energy per step; CPUs none."""
    from tensorpilot.hardware import catalog
    from tensorpilot.modelplan.predict import ModelPlan
    from tensorpilot.plan import calibration as cal

    h100 = catalog.get("h100-sxm")
    plan = ModelPlan(model="m", hardware="h100-sxm", n_devices=2, sharding="none", batch_size=8, precision="bf16",
                     optimizer="adamw", params=1, trainable_params=1, memory_bytes={"total": 1.0}, memory_method="",
                     memory_accounting={}, memory_limit_bytes=None, device_memory_bytes=None, fits=None,
                     step_time_s=0.5, time_breakdown_s={}, model_flops_per_step=2 * 0.5 * 0.25 * 989e12,
                     samples_per_s=1.0, tokens_per_s=None, mfu=None, peak_flops_per_s=None, peak_source="",
                     calibration={})
    # per device: 0.25 x 989 TFLOP/s for 0.5 s = HFU 0.25 of the dense bf16 peak
    plan.with_power(h100, "bf16")
    busy = 0.25 / (cal.mamf_fraction("h100-sxm", "bf16") * cal.SUSTAINED_COMPUTE_FRACTION)
    watts = h100.tdp_w * (cal.IDLE_POWER_FRACTION + (1 - cal.IDLE_POWER_FRACTION) * min(1.0, busy))
    assert h100.peak_flops_per_s("bf16") == pytest.approx(989e12, rel=0.01)
    assert plan.power_w_per_device == pytest.approx(watts, rel=0.01)
    assert plan.energy_per_step_j == pytest.approx(watts * 2 * 0.5, rel=0.01)     # W x devices x s
    assert watts <= h100.tdp_w
    cpu = catalog.Accelerator(key="local-cpu", name="cpu", vendor="local", year=0, source="", tdp_w=None)
    plan.power_w_per_device = plan.energy_per_step_j = None
    assert plan.with_power(cpu, "fp32").energy_per_step_j is None


def test_format_joules():
    assert [energy.format_joules(x) for x in (1234.5, 2.5, 0.0042, 9.8e-5, 0.0)] == \
        ["1.23 kJ", "2.5 J", "4.2 mJ", "98 uJ", "0 J"]


def test_one_process_run_keeps_its_values():
    m = choose(Capabilities(kind="cpu", powercap_root=NOWHERE))
    assert energy.sum_over_processes(m, [1.0, 2.0], local_rank=0, device="cpu") == ([1.0, 2.0], "estimate")


def test_a_machine_wide_counter_counts_once_per_host(powercap, tmp_path_factory):
    """In a process group, RAPL's energy is added by local rank 0 only: another process on the
    same host reads the same counter. A one-process gloo group shows both sides of the rule."""
    import torch.distributed as dist

    rapl = choose(Capabilities(kind="cpu", powercap_root=powercap))
    rapl.close()
    store = tmp_path_factory.mktemp("store") / "init"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        assert energy.sum_over_processes(rapl, [3.0, 1.0], local_rank=0, device="cpu") == ([3.0, 1.0], "rapl")
        assert energy.sum_over_processes(rapl, [3.0, 1.0], local_rank=1, device="cpu") == ([0.0, 0.0], "rapl")
        est = choose(Capabilities(kind="cpu", powercap_root=NOWHERE))       # per process: always counts
        assert energy.sum_over_processes(est, [3.0, 1.0], local_rank=1, device="cpu") == ([3.0, 1.0], "estimate")
    finally:
        dist.destroy_process_group()


def test_importing_the_module_loads_neither_torch_nor_pynvml():
    code = ("import sys, tensorpilot.observe.energy; "
            "sys.exit(1 if {'torch', 'pynvml', 'amdsmi'} & set(sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_sources_are_the_documented_ones():
    assert energy.SOURCES == ("nvml", "amdsmi", "rapl", "estimate", "none")


def test_trainer_energy_summary_and_line_by_hand():
    """The summary's energy keys from a fake trainer: the loop read 1,000 J; 10 timed steps of
    8 samples x 128 tokens took 600 J in 2 s; the planner gives 350 W for one device at 0.25 s."""
    from tensorpilot.training.trainer import Trainer

    meter = energy.EnergyMeter("a fake counter")
    meter.source, meter.read = "nvml", lambda: 1000.0
    fake = SimpleNamespace(energy=meter, par=SimpleNamespace(active=False),
                           plan=SimpleNamespace(samples_per_step=8), workload=SimpleNamespace(tokens_per_sample=128),
                           cfg=SimpleNamespace(train=SimpleNamespace(grid_intensity=500.0)))
    predicted = {"formula": {"hardware": "h100-sxm", "n_devices": 1, "step_time_s": 0.25, "power_w_per_device": 350.0}}
    s = Trainer._energy_summary(fake, 2.0, 10, 600.0, predicted)
    assert (s["energy_j"], s["energy_source"], s["energy_how"]) == (1000.0, "nvml", "a fake counter")
    assert s["energy_per_step_j"] == 60.0                  # 600 J / 10 steps
    assert s["power_w"] == 300.0                           # 600 J / 2 s
    assert s["joules_per_sample"] == 7.5                   # 600 J / 80 samples
    assert s["joules_per_token"] == 600 / 10240            # 80 samples x 128 tokens
    assert s["co2_g"] == pytest.approx(1000 / 3.6e6 * 500)  # 0.139 g
    f = predicted["formula"]                               # 350 W x 1 x 0.25 s = 87.5 J; 60 / 87.5
    assert f["energy_per_step_j"] == 87.5 and f["energy_measured_over_predicted"] == pytest.approx(60 / 87.5)
    line = Trainer._energy_line({**s, "predicted": predicted})
    assert line == ("1 kJ (nvml); 300.0 W over the timed steps, 58.6 mJ/token; 0.139 g CO2 at 500 g/kWh; "
                    "per step 60 J measured, 87.5 J predicted (formula planner on h100-sxm; measured / "
                    "predicted 0.69)")
