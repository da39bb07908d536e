"""What `tensorpilot hw` shows: each local device's facts, datasheet peaks, measured ceilings,
% of peak and roofline ridge points; or one catalog entry (`--gpu NAME`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from tensorpilot.hardware import catalog
from tensorpilot.hardware.device import (NOTABLE_CPU_FLAGS, cpu_clock_hz, cpu_cores, cpu_estimate,
                                         detect, gpu_topology, numa_nodes)
from tensorpilot.hardware.probe import ProbeResult, matmul_dtypes

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")


def local_devices() -> list[str]:
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        devices.append("mps")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        devices += [f"xpu:{i}" for i in range(torch.xpu.device_count())]
    return devices


def describe(device: str, probe: ProbeResult | None) -> dict[str, Any]:
    """Facts and numbers of one device, in the JSON shape `tensorpilot hw --json` documents."""
    caps = detect(device)
    measured = probe.device(device) if probe else None
    out: dict[str, Any] = {"device": device, "name": caps.name, "kind": caps.kind,
                           "memory_bytes": caps.memory_bytes}
    peak: dict[str, float | None] = {d: None for d in DTYPES}
    bw = None
    if caps.kind == "cpu":
        clock, clock_source = cpu_clock_hz()
        out.update(cores=cpu_cores(), clock_hz=clock, clock_source=clock_source, numa_nodes=numa_nodes(),
                   isa_flags=[f for f in NOTABLE_CPU_FLAGS if f in caps.cpu_flags], catalog_key=None)
        # a CPU has no datasheet peak: peak_flops holds the ISA estimate, labelled as such
        peak.update({d: cpu_estimate(d).flops_per_s for d in ("fp32", "bf16", "fp16", "int8")})
        out["peak_kind"] = "estimate"
        out["estimate_source"] = cpu_estimate("fp32").source
    else:
        key = catalog.normalize_device_name(caps.name)
        out["catalog_key"] = key
        if caps.cuda_capability:
            out["compute_capability"] = ".".join(map(str, caps.cuda_capability))
        if caps.kind == "cuda":
            import torch

            props = torch.cuda.get_device_properties(caps.index or 0)
            out["multiprocessors"] = props.multi_processor_count
            out["bf16"], out["tf32"] = caps.supports_bf16_fast, caps.supports_tf32
            out["fp8"] = caps.cuda_capability is not None and caps.cuda_capability >= (8, 9)
            out["topology"] = gpu_topology(caps.index or 0)
        if key:
            acc = catalog.get(key)
            peak = {d: acc.peak_flops_per_s(d) for d in DTYPES}
            bw = acc.mem_bw_gb_per_s * 1e9 if acc.mem_bw_gb_per_s else None
            out["datasheet_source"] = acc.source
        out["peak_kind"] = "datasheet" if key else None
    out["peak_flops"] = peak
    out["measured_flops"] = {d: (measured.ceiling(d) if measured else None) for d in DTYPES}
    out["measured_memory_bandwidth_bytes_per_s"] = measured.copy_bytes_per_s if measured else None
    out["memory_bandwidth_bytes_per_s"] = bw or out["measured_memory_bandwidth_bytes_per_s"]
    out["memory_bandwidth_source"] = "datasheet" if bw else ("measured copy" if measured else None)
    if measured and measured.h2d_bytes_per_s:
        out["host_to_device_bytes_per_s"] = measured.h2d_bytes_per_s
        out["device_to_host_bytes_per_s"] = measured.d2h_bytes_per_s
    out["percent_of_peak"] = {d: 100 * out["measured_flops"][d] / peak[d]
                              for d in DTYPES if peak[d] and out["measured_flops"][d]}
    # roofline ridge point: the arithmetic intensity (FLOP per byte moved) above which a kernel is
    # compute-bound: peak FLOP/s / memory bytes/s (Williams, Waterman, Patterson, CACM 2009)
    ridge = {}
    for d in DTYPES:
        flops = peak[d] or out["measured_flops"][d]
        if flops and out["memory_bandwidth_bytes_per_s"]:
            ridge[d] = flops / out["memory_bandwidth_bytes_per_s"]
    out["ridge_point_flop_per_byte"] = ridge
    out["probe_dtypes"] = matmul_dtypes(device)
    return out


def catalog_entry(name: str) -> dict[str, Any]:
    acc = catalog.get(name)          # UnknownAcceleratorError (a usage error) with suggestions
    data = {f.name: getattr(acc, f.name) for f in dataclasses.fields(acc)}
    data["aliases"] = list(acc.aliases)
    data["uncertain"], data["unknown"] = sorted(acc.uncertain), sorted(acc.unknown)
    if acc.mem_bw_gb_per_s:
        data["ridge_point_flop_per_byte"] = {d: acc.peak_flops_per_s(d) / (acc.mem_bw_gb_per_s * 1e9)
                                             for d in DTYPES if acc.peak_flops_per_s(d)}
    return data


def _g(value: float | None, scale: float = 1e12, unit: str = "TFLOP/s") -> str:
    if value is None:
        return "—"
    return f"{value / scale:,.1f} {unit}" if value >= scale else f"{value / 1e9:,.1f} G{unit[1:]}"


def print_devices(console, devices: list[dict[str, Any]], probe: ProbeResult | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    for d in devices:
        head = f"[bold]{d['device']}[/]: {d['name']}"
        if d["kind"] == "cpu":
            head += (f" — {d['cores']} cores, {d['clock_hz'] / 1e9:.2f} GHz ({d['clock_source']}), "
                     f"{d['numa_nodes']} NUMA node(s), flags {' '.join(d['isa_flags'])}")
        else:
            head += f" — catalog: {d['catalog_key'] or 'not catalogued'}"
            if d.get("multiprocessors"):
                head += f", {d['multiprocessors']} SMs, compute capability {d.get('compute_capability')}"
        if d["memory_bytes"]:
            head += f", {d['memory_bytes'] / 2**30:,.1f} GiB"
        console.print(head)
        t = Table(show_edge=False)
        for col in ("dtype", "datasheet peak" if d["kind"] != "cpu" else "estimated peak",
                    "measured", "% of peak", "ridge point (FLOP/byte)"):
            t.add_column(col, justify="right")
        for dt in DTYPES:
            sheet = d["peak_flops"][dt]
            meas = d["measured_flops"][dt]
            if sheet is None and meas is None:
                continue
            pct = f"{100 * meas / sheet:.0f}%" if sheet and meas else "—"
            ridge = d["ridge_point_flop_per_byte"].get(dt)
            t.add_row(dt, _g(sheet), _g(meas), pct, f"{ridge:,.1f}" if ridge else "—")
        console.print(t)
        bw = d["memory_bandwidth_bytes_per_s"]
        console.print(f"  memory bandwidth: {_g(bw, 1e12, 'TB/s') if bw else '—'}"
                      + (f" ({d['memory_bandwidth_source']})" if bw else "")
                      + (f"; measured copy {_g(d['measured_memory_bandwidth_bytes_per_s'], 1e12, 'TB/s')}"
                         if d["memory_bandwidth_source"] == "datasheet" and d["measured_memory_bandwidth_bytes_per_s"] else ""))
        if d.get("host_to_device_bytes_per_s"):
            h = d["host_to_device_bytes_per_s"]
            console.print(f"  host->device: pageable {_g(h.get('pageable'), 1e12, 'TB/s')}, pinned {_g(h.get('pinned'), 1e12, 'TB/s')}")
        if d["kind"] == "cpu":
            console.print(f"  [dim]CPU peaks are estimates ({d['estimate_source']}); MFU uses the measured ceiling.[/]")
        if d.get("energy"):                     # filled in by the caller (observe/energy.py)
            console.print(f"  energy: {escape(d['energy']['how'])}")
    if probe is None:
        console.print("[dim]Nothing measured yet on this machine: `tensorpilot hw --probe` measures the ceilings.[/]")
    else:
        console.print(f"[dim]measured {probe.measured_at} (cache {probe.fingerprint}; --refresh re-measures)[/]")
        ar = probe.allreduce
        if ar.get("bus_bytes_per_s"):
            console.print(f"all-reduce ({ar['backend']}, {ar['nproc']} processes, {ar['bytes'] >> 20} MiB): "
                          f"bus bandwidth {_g(ar['bus_bytes_per_s'], 1e12, 'TB/s')}")


def print_entry(console, e: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(title=f"{e['name']} ({e['key']})", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    for k, v in e.items():
        if v in (None, [], {}, "") or k in ("key", "name"):
            continue
        if isinstance(v, dict):
            v = ", ".join(f"{kk} {vv:,.1f}" for kk, vv in v.items())
        elif isinstance(v, list):
            v = ", ".join(map(str, v))
        mark = " (uncertain)" if k in e.get("uncertain", []) else ""
        t.add_row(k, f"{v}{mark}")
    console.print(t)
