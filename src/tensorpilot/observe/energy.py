"""Energy of a run, measured where the platform exposes a counter and estimated (labelled as
such, with its formula) where it does not.

One meter per device the run trains on, chosen by :func:`choose` from a :class:`Capabilities`
value, which holds what this machine exposes as plain values so that tests build fake profiles
(a fake ``pynvml`` object, a temporary directory standing in for ``/sys/class/powercap``):

    cuda (NVIDIA)  NVML total energy counter      -> estimate: catalog TDP x NVML utilisation
    cuda (ROCm)    AMD SMI energy accumulator     -> estimate: catalog TDP x utilisation
    cpu            RAPL through Linux powercap    -> estimate: W per logical CPU x process CPU time
    mps, xpu       (no counter read here)         -> estimate from the catalog's TDP, else none

A meter counts the device's energy, not the host's: a GPU run's CPU, DRAM and fans are not in
it. ``start()`` zeroes it, ``read()`` gives joules since ``start()``; ``source`` is one of
``nvml``, ``amdsmi``, ``rapl``, ``estimate``, ``none`` and ``how`` says in one sentence what
is counted and how.

    >>> m = choose(Capabilities(kind="cpu", cpu_threads=2, powercap_root=Path("/nonexistent")))
    >>> m.source
    'estimate'
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["Capabilities", "CPU_W_PER_THREAD", "SOURCES", "EnergyMeter", "choose", "co2_grams",
           "format_joules", "formula_prediction", "probe", "rapl_delta_uj", "sum_over_processes"]

SOURCES = ("nvml", "amdsmi", "rapl", "estimate", "none")

POWERCAP = Path("/sys/class/powercap")

# A busy logical CPU draws about its share of the package TDP: TDP / hardware threads is 1.9 W
# on an AMD EPYC 9654 (360 W, 192 threads), 2.2 W on an EPYC 7763 (280 W, 128), 3.1 W on an
# Intel Xeon Platinum 8480+ (350 W, 112) and 3.75 W on a Xeon Gold 6248 (150 W, 40) (vendor
# datasheets). A virtual machine shows neither the part's TDP nor its thread count, so the
# estimate uses a mid value: ASSUMED, good to a factor of ~2 either way.
CPU_W_PER_THREAD = 3.0

# RAPL counters are 32-bit in hardware: the kernel's energy_uj wraps at max_energy_range_uj,
# ~65.5 kJ with the usual 2^-16 J unit (Intel SDM vol. 3B, MSR_RAPL_POWER_UNIT), i.e. every
# ~5 minutes at 200 W. A reading every few seconds sees every wrap, also across a long
# compilation or evaluation between two training steps.
RAPL_SAMPLE_S = 5.0


def _read_text(path: Path) -> str:
    return path.read_text()


@dataclass(frozen=True)
class Capabilities:
    """What this machine exposes for measuring the energy of one device (see :func:`probe`)."""

    kind: str = "cpu"                       # torch device type: cpu, cuda, mps, xpu
    name: str = "cpu"
    index: int = 0                          # the device's index as torch numbers it
    uuid: str | None = None                 # torch's uuid of a CUDA device (NVML finds it by that)
    is_rocm: bool = False
    nvml: Any = None                        # the pynvml module, or None
    nvml_missing: str = "pynvml is not installed (pip install 'tensorpilot[gpu]')"
    amdsmi: Any = None                      # the amdsmi module, or None
    powercap_root: Path = POWERCAP
    read_text: Callable[[Path], str] = field(default=_read_text, repr=False)
    tdp_w: float | None = None              # the catalog's board power of the accelerator
    cpu_threads: int = 1                    # logical CPUs this process may run on
    cpu_seconds: Callable[[], float] | None = field(default=None, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)


# ---------------------------------------------------------------------------- meters
class EnergyMeter:
    """Joules of one device since :meth:`start`. ``machine_wide``: the counter covers every
    process on the host (RAPL), so a multi-process run counts it once per host."""

    source = "none"
    machine_wide = False

    def __init__(self, how: str, fallbacks: tuple[str, ...] = ()):
        self.how = how
        self.fallbacks = fallbacks          # why each better source was not used

    def start(self) -> None:
        pass

    def read(self) -> float:
        return math.nan

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "how": self.how, "machine_wide": self.machine_wide,
                "fallbacks": list(self.fallbacks)}


class NvmlMeter(EnergyMeter):
    """nvmlDeviceGetTotalEnergyConsumption: the board's energy in mJ since the driver was loaded
    (NVML API reference, Device Queries; Volta and newer). NVML refreshes it every 20-100 ms, so
    a window much shorter than that reads coarsely; sums over many steps do not drift."""

    source = "nvml"

    def __init__(self, nvml: Any, handle: Any, how: str, fallbacks=()):
        super().__init__(how, fallbacks)
        self._nvml, self._handle, self._start_mj = nvml, handle, 0

    def _mj(self) -> int:
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def start(self) -> None:
        self._start_mj = self._mj()

    def read(self) -> float:
        return (self._mj() - self._start_mj) / 1e3


class AmdSmiMeter(EnergyMeter):
    """amdsmi_get_energy_count: a 64-bit energy accumulator times its resolution in uJ (AMD SMI
    Power Queries; the key is "energy_accumulator" from amdsmi 6.2.1, "power" before)."""

    source = "amdsmi"

    def __init__(self, amdsmi: Any, handle: Any, how: str, fallbacks=()):
        super().__init__(how, fallbacks)
        self._amdsmi, self._handle, self._start_uj = amdsmi, handle, 0.0

    def _uj(self) -> float:
        d = self._amdsmi.amdsmi_get_energy_count(self._handle)
        count = d["energy_accumulator"] if "energy_accumulator" in d else d["power"]
        return float(count) * float(d["counter_resolution"])

    def start(self) -> None:
        self._start_uj = self._uj()

    def read(self) -> float:
        return (self._uj() - self._start_uj) / 1e6


def rapl_delta_uj(before: int, now: int, max_range_uj: int) -> int:
    """Energy between two readings of one powercap counter, in uJ. ``energy_uj`` counts up to
    ``max_energy_range_uj`` and starts again from 0 (Linux Documentation/power/powercap/
    powercap.rst), so a reading below the one before means the counter wrapped, once if the
    readings are closer together than a wrap (:data:`RAPL_SAMPLE_S`)."""
    return now - before if now >= before else max_range_uj - before + now


@dataclass(frozen=True)
class RaplZone:
    name: str                               # package-0, dram, ...
    energy: Path                            # .../intel-rapl:0/energy_uj
    max_range_uj: int


class RaplMeter(EnergyMeter):
    """The sum of RAPL zones read through powercap, unwrapped reading by reading. A thread reads
    every :data:`RAPL_SAMPLE_S` seconds so that no wrap goes unseen between the caller's reads."""

    source = "rapl"
    machine_wide = True

    def __init__(self, zones: list[RaplZone], read_text: Callable[[Path], str], how: str, fallbacks=(),
                 sample_s: float = RAPL_SAMPLE_S):
        super().__init__(how, fallbacks)
        self._zones, self._read_text, self._sample_s = zones, read_text, sample_s
        self._last: list[int] = []
        self._total_uj = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _now(self) -> list[int]:
        return [int(self._read_text(z.energy)) for z in self._zones]

    def start(self) -> None:
        with self._lock:
            self._last, self._total_uj = self._now(), 0
        if self._thread is None and self._sample_s > 0:
            self._thread = threading.Thread(target=self._sample, name="tensorpilot-rapl", daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self._sample_s):
            try:
                self.read()
            except (OSError, ValueError):   # the next reading in the caller's thread says why
                return

    def read(self) -> float:
        with self._lock:
            now = self._now()
            self._total_uj += sum(rapl_delta_uj(b, n, z.max_range_uj)
                                  for b, n, z in zip(self._last, now, self._zones))
            self._last = now
            return self._total_uj / 1e6

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None


class CpuTimeEstimate(EnergyMeter):
    """ESTIMATE: TDP share x measured utilisation x wall time, where the TDP share is
    ``w_per_thread`` x the logical CPUs this process may use and the utilisation is the
    process's CPU time / (wall time x those CPUs); the product is ``w_per_thread`` x CPU seconds.
    Idle, uncore and DRAM power and other processes are not in it."""

    source = "estimate"

    def __init__(self, w_per_thread: float, threads: int, cpu_seconds: Callable[[], float],
                 clock: Callable[[], float], how: str, fallbacks=()):
        super().__init__(how, fallbacks)
        self.w_per_thread, self.threads = w_per_thread, threads
        self._cpu_seconds, self._clock = cpu_seconds, clock
        self._c0 = self._t0 = 0.0
        self.utilisation: float | None = None     # over the whole time since start, at the last read

    def start(self) -> None:
        self._c0, self._t0 = self._cpu_seconds(), self._clock()

    def read(self) -> float:
        cpu_s, wall_s = self._cpu_seconds() - self._c0, self._clock() - self._t0
        if wall_s > 0:
            self.utilisation = cpu_s / (wall_s * self.threads)
        return self.w_per_thread * cpu_s


class UtilisationEstimate(EnergyMeter):
    """ESTIMATE for an accelerator: TDP x utilisation, integrated reading by reading; the
    utilisation is NVML's (the share of the last sample period in which a kernel ran) where
    ``utilisation`` is given, else taken as 1 (busy throughout: an upper bound)."""

    source = "estimate"

    def __init__(self, tdp_w: float, utilisation: Callable[[], float] | None, clock: Callable[[], float],
                 how: str, fallbacks=()):
        super().__init__(how, fallbacks)
        self.tdp_w, self._utilisation, self._clock = tdp_w, utilisation, clock
        self._t = 0.0
        self._joules = 0.0

    def start(self) -> None:
        self._t, self._joules = self._clock(), 0.0

    def read(self) -> float:
        t = self._clock()
        busy = self._utilisation() if self._utilisation is not None else 1.0
        self._joules += self.tdp_w * min(max(busy, 0.0), 1.0) * (t - self._t)
        self._t = t
        return self._joules


# ------------------------------------------------------------------------- the choice
def choose(caps: Capabilities) -> EnergyMeter:
    """The best meter ``caps`` allows, not started; ``fallbacks`` says why each better one was
    not used (its one sentence each)."""
    fallbacks: list[str] = []
    util = None
    if caps.kind == "cuda" and caps.is_rocm:
        meter = _amdsmi_meter(caps, fallbacks)
        if meter is not None:
            return meter
    elif caps.kind == "cuda":
        meter, util = _nvml_meter(caps, fallbacks)
        if meter is not None:
            return meter
    elif caps.kind == "cpu":
        meter = _rapl_meter(caps, fallbacks)
        if meter is not None:
            return meter
    return _estimate(caps, util, tuple(fallbacks))


def _estimate(caps: Capabilities, util: Callable[[], float] | None, fallbacks: tuple[str, ...]) -> EnergyMeter:
    why = f"; no counter here: {'; '.join(fallbacks)}" if fallbacks else ""
    if caps.kind == "cpu":
        threads = max(1, caps.cpu_threads)
        w = f"{CPU_W_PER_THREAD:g} W"
        how = (f"estimate: {w} x process CPU seconds, i.e. TDP share ({w} x {threads} logical CPUs) x utilisation "
               f"(CPU time / (wall x {threads})) x wall; {w} per busy logical CPU is ASSUMED (server TDP / "
               "threads: 1.9-3.75 W)" + why)
        return CpuTimeEstimate(CPU_W_PER_THREAD, threads, caps.cpu_seconds or _process_cpu_seconds,
                               caps.clock, how, fallbacks)
    if caps.tdp_w:
        busy = "NVML utilisation" if util is not None else "utilisation taken as 1 (not measurable here: an upper bound)"
        how = f"estimate: catalog TDP {caps.tdp_w:g} W of {caps.name} x {busy} x time" + why
        return UtilisationEstimate(caps.tdp_w, util, caps.clock, how, fallbacks)
    return EnergyMeter(f"none: no energy counter and no TDP in the catalog for {caps.name}" + why, fallbacks)


def _process_cpu_seconds() -> float:
    """User + system CPU time of this process (all its threads; CLOCK_PROCESS_CPUTIME_ID, ns
    resolution, where os.times() counts 10 ms clock ticks: coarser than a small step) and of its
    children that have exited (getrusage(RUSAGE_CHILDREN): DataLoader workers count once they end)."""
    cpu = time.process_time()
    try:
        import resource

        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu += children.ru_utime + children.ru_stime
    except ImportError:                     # Windows: no resource module
        pass
    return cpu


def _nvml_meter(caps: Capabilities, fallbacks: list[str]):
    """(NvmlMeter or None, a utilisation reader for the estimate or None)."""
    nv = caps.nvml
    if nv is None:
        fallbacks.append(f"NVML: {caps.nvml_missing}")
        return None, None
    error = getattr(nv, "NVMLError", Exception)
    try:
        nv.nvmlInit()
        handle, found_by = _nvml_handle(nv, caps, error)
    except error as exc:
        fallbacks.append(f"NVML: GPU {caps.index} was not found ({exc})")
        return None, None

    def util() -> float:
        return nv.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0

    try:
        nv.nvmlDeviceGetTotalEnergyConsumption(handle)
    except error as exc:                    # NVML_ERROR_NOT_SUPPORTED before Volta and on MIG instances
        fallbacks.append(f"NVML: GPU {caps.index} has no total energy counter ({exc}; Volta and newer have one)")
        try:
            util()
        except error:
            return None, None
        return None, util
    how = (f"NVML total energy counter of {caps.name} (GPU {caps.index}, found by {found_by}): "
           "nvmlDeviceGetTotalEnergyConsumption, the board alone, host CPU and memory not included")
    return NvmlMeter(nv, handle, how, tuple(fallbacks)), None


def _nvml_handle(nv, caps: Capabilities, error):
    """NVML numbers GPUs by PCI order over the whole machine; torch by CUDA_VISIBLE_DEVICES and
    CUDA_DEVICE_ORDER. The UUID names the same board in both."""
    if caps.uuid:
        try:
            uuid = caps.uuid if caps.uuid.startswith(("GPU-", "MIG-")) else f"GPU-{caps.uuid}"
            return nv.nvmlDeviceGetHandleByUUID(uuid), "UUID"
        except error:
            pass
    return nv.nvmlDeviceGetHandleByIndex(caps.index), "index"


def _amdsmi_meter(caps: Capabilities, fallbacks: list[str]) -> EnergyMeter | None:
    amd = caps.amdsmi
    if amd is None:
        fallbacks.append("AMD SMI: the amdsmi module is not importable (it ships with ROCm)")
        return None
    try:
        amd.amdsmi_init()
        handle = amd.amdsmi_get_processor_handles()[caps.index]
        meter = AmdSmiMeter(amd, handle, f"AMD SMI energy accumulator of {caps.name} (GPU {caps.index}): "
                            "amdsmi_get_energy_count, the device alone, host CPU and memory not included")
        meter._uj()
    except Exception as exc:  # noqa: BLE001 - amdsmi's exception classes differ between releases
        fallbacks.append(f"AMD SMI: GPU {caps.index} has no readable energy counter "
                         f"({type(exc).__name__}: {exc}; not on virtual machine guests)")
        return None
    return meter


def _rapl_zones(caps: Capabilities) -> tuple[list[RaplZone] | None, str]:
    """The package zones (``intel-rapl:N``, also AMD's, which the kernel's RAPL driver exposes
    under the same name) and their ``dram`` sub-zones, which packages do not contain. ``core``
    and ``uncore`` sub-zones are parts of a package, and ``psys`` (the platform) contains it:
    adding either would count energy twice. ``intel-rapl-mmio`` repeats a package; the pattern
    leaves it out."""
    root = caps.powercap_root
    try:
        paths = sorted(root.glob("intel-rapl:*"))
    except OSError as exc:
        return None, f"{root} cannot be listed ({exc.strerror})"
    if not paths:
        return None, f"no intel-rapl zones under {root} (virtual machines and containers usually hide them)"
    zones = []
    for p in paths:
        try:
            name = caps.read_text(p / "name").strip()
            top = p.name.count(":") == 1
            if not ((top and name.startswith("package")) or (not top and name == "dram")):
                continue
            int(caps.read_text(p / "energy_uj"))
            zones.append(RaplZone(name, p / "energy_uj", int(caps.read_text(p / "max_energy_range_uj"))))
        except PermissionError:
            return None, (f"{p / 'energy_uj'} is readable by root only (Linux 5.10 and newer, "
                          "CVE-2020-8694); run as root or grant read access to measure")
        except (OSError, ValueError) as exc:
            return None, f"{p} cannot be read ({getattr(exc, 'strerror', None) or exc})"
    if not zones:
        return None, f"no package zone under {root}"
    return zones, ""


def _rapl_meter(caps: Capabilities, fallbacks: list[str]) -> EnergyMeter | None:
    zones, why = _rapl_zones(caps)
    if zones is None:
        fallbacks.append(f"RAPL: {why}")
        return None
    names = " + ".join(z.name for z in zones)
    how = (f"RAPL counters {names} through Linux powercap ({caps.powercap_root}/intel-rapl:*/energy_uj): "
           "the whole CPU package(s) and DRAM, every process on them, counted once per host")
    return RaplMeter(zones, caps.read_text, how, tuple(fallbacks))


def probe(device: str) -> Capabilities:
    """This machine's energy capabilities for a resolved torch device ('cpu', 'cuda:0', ...)."""
    from tensorpilot.hardware import catalog
    from tensorpilot.hardware.device import cpu_cores, detect

    caps = detect(device)
    kind = caps.kind
    index = caps.index if caps.index is not None else 0
    kw: dict[str, Any] = {"kind": kind, "name": caps.name, "index": index, "is_rocm": caps.is_rocm,
                          "cpu_threads": cpu_cores()}
    if kind != "cpu":
        key = catalog.normalize_device_name(caps.name)
        kw["tdp_w"] = catalog.get(key).tdp_w if key else None
    if kind == "cuda" and not caps.is_rocm:
        import torch

        if caps.index is None:
            index = kw["index"] = torch.cuda.current_device()
        kw["uuid"] = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "") or None
        try:
            import pynvml

            kw["nvml"] = pynvml
        except ImportError:
            pass
    if kind == "cuda" and caps.is_rocm:
        try:
            import amdsmi

            kw["amdsmi"] = amdsmi
        except ImportError:
            pass
    return Capabilities(**kw)


# -------------------------------------------------------------------------- figures
def format_joules(joules: float) -> str:
    """1234.5 -> '1.23 kJ', 0.0042 -> '4.2 mJ' (three significant digits)."""
    for scale, unit in ((1e6, "MJ"), (1e3, "kJ"), (1.0, "J"), (1e-3, "mJ"), (1e-6, "uJ")):
        if abs(joules) >= scale:
            return f"{joules / scale:.3g} {unit}"
    return f"{joules / 1e-9:.3g} nJ" if joules else "0 J"


def co2_grams(joules: float, grid_g_per_kwh: float) -> float:
    """Grams of CO2 for ``joules`` drawn from a grid emitting ``grid_g_per_kwh`` (1 kWh = 3.6 MJ)."""
    return joules / 3.6e6 * grid_g_per_kwh


def formula_prediction(power_w_per_device: float | None, n_devices: int, step_time_s: float | None,
                       measured_per_step_j: float | None) -> dict[str, Any] | None:
    """The planner's energy of one step (board power per device x devices x its predicted step
    time; plan/predict.py: power = TDP x (idle + (1 - idle) x busy)) beside the measured one;
    None when the planner has no power for the hardware (no TDP in the catalog, e.g. a CPU)."""
    if not power_w_per_device or not step_time_s:
        return None
    predicted = power_w_per_device * n_devices * step_time_s
    return {"energy_per_step_j": predicted, "power_w": power_w_per_device * n_devices,
            "measured_energy_per_step_j": measured_per_step_j,
            "energy_measured_over_predicted": measured_per_step_j / predicted if measured_per_step_j else None}


def sum_over_processes(meter: EnergyMeter, values: list[float], *, local_rank: int, device: Any):
    """``values`` summed over every process of a multi-process run (a collective: every rank
    calls it), with the run's source: a device counter (NVML, AMD SMI) or an estimate is each
    process's own and adds up; a machine-wide counter (RAPL) is added by local rank 0 only,
    once per host. Mixed sources across ranks read "mixed". One process: ``values`` as they are."""
    try:
        import torch.distributed as dist
    except ImportError:
        return values, meter.source
    if not (dist.is_available() and dist.is_initialized()):
        return values, meter.source
    import torch

    counts = not meter.machine_wide or local_rank == 0
    total = torch.tensor([v if counts else 0.0 for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    code = SOURCES.index(meter.source)
    seen = torch.tensor([code, -code], dtype=torch.int64, device=device)
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    high, low = int(seen[0]), -int(seen[1])
    return total.tolist(), meter.source if high == low else "mixed"
