"""Peak FLOP/s of a device for a dtype: the one function MFU is computed against.

Two numbers, kept apart and both labelled:
- ``datasheet``: the catalog's dense peak for a recognised accelerator (accelerators.toml).
  For CPUs there is no datasheet figure; ``cpu_estimate`` (cores x clock x FLOP/cycle) is shown
  by ``tensorpilot hw`` but never used for MFU, because it is a guess.
- ``measured``: the matmul ceiling probed on this machine (cached per machine fingerprint).

``mfu_basis`` is the datasheet peak when there is one, else the measured ceiling — never an
invented number. An unrecognised GPU therefore gets MFU against its measured ceiling only, and
the source string says so.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DevicePeak:
    dtype: str
    catalog_key: str | None
    datasheet_flops_per_s: float | None
    datasheet_source: str | None
    measured_flops_per_s: float | None
    measured_source: str | None
    cpu_estimate_flops_per_s: float | None = None
    cpu_estimate_source: str | None = None

    @property
    def mfu_basis(self) -> tuple[float | None, str]:
        if self.datasheet_flops_per_s:
            return self.datasheet_flops_per_s, self.datasheet_source or "datasheet"
        if self.measured_flops_per_s:
            why = "no datasheet peak for this device" if self.catalog_key is None else \
                f"the catalog has no {self.dtype} figure for {self.catalog_key}"
            return self.measured_flops_per_s, f"{self.measured_source} ({why})"
        return None, "unknown: no datasheet peak and nothing measured"


def _catalog_dtype(dtype: str) -> str:
    return dtype  # the catalog uses the same names: fp32, tf32, bf16, fp16, fp8, int8


def device_peak(device: str, dtype: str, *, measure: bool = True) -> DevicePeak:
    """Datasheet and measured peak of ``device`` ('cpu', 'cuda:0', ...) for ``dtype``."""
    from tensorpilot.hardware import catalog
    from tensorpilot.hardware.device import cpu_estimate, detect
    from tensorpilot.hardware.probe import quick_ceiling

    caps = detect(device)
    key = datasheet = source = None
    est = est_source = None
    if caps.kind == "cpu":
        estimate = cpu_estimate(dtype)
        est, est_source = estimate.flops_per_s, estimate.source
    else:
        key = catalog.normalize_device_name(caps.name)
        if key is not None:
            acc = catalog.get(key)
            datasheet = acc.peak_flops_per_s(_catalog_dtype(dtype))
            if datasheet:
                uncertain = " (uncertain)" if acc.is_uncertain(f"{dtype}_tflops") else ""
                source = f"datasheet {dtype} peak of {key}{uncertain}: {acc.source}"
    measured = measured_source = None
    if measure:
        measured, measured_source = quick_ceiling(device, dtype)
    return DevicePeak(dtype, key, datasheet, source, measured, measured_source, est, est_source)


def mfu(achieved_flops_per_s: float | None, peak_flops_per_s: float | None) -> float | None:
    """Model FLOPs utilisation; None when either number is unknown."""
    if not achieved_flops_per_s or not peak_flops_per_s:
        return None
    return achieved_flops_per_s / peak_flops_per_s
