"""The accelerator catalog: datasheet peaks, memory, links and power of devices known by name.

The data live in ``accelerators.toml`` next to this module (package data, so an installed wheel
has it); the file's header states every unit and convention. This module parses it once, checks
it, and answers three kinds of question:

- what is this device?   :func:`normalize_device_name` maps a driver's device string to a catalog
  key, or ``None`` -- never a near miss: a MIG slice, a laptop part or an unlisted sibling stays
  unmatched; :func:`get` is the forgiving lookup for names people type, :func:`closest` the
  "did you mean" list for when it fails;
- how fast is it?         :func:`peak_tflops` (dense datasheet peak, ``None`` when not published);
- how fast is this CPU?   :func:`cpu_peak_flops`, an *estimate* from cores x clock x FLOPs/cycle.

Pure standard library, no torch: ``tensorpilot plan`` uses it on machines without an accelerator.

>>> get("h100 sxm").bf16_tflops                      # dense, not the 1979 "with sparsity"
989.4
>>> normalize_device_name("NVIDIA A100-SXM4-80GB")
'a100-sxm4-80gb'
>>> normalize_device_name("NVIDIA GeForce GTX 1080") is None
True
>>> peak_tflops("a100-sxm4-80gb", "fp8") is None      # Ampere has no fp8 tensor cores
True
>>> closest("h100-sxn")[0]
'h100-sxm'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from tensorpilot.errors import ConfigError

__all__ = [
    "Accelerator",
    "CpuPeakEstimate",
    "PEAK_FIELDS",
    "UnknownAcceleratorError",
    "all_accelerators",
    "base_chain",
    "closest",
    "cpu_peak_flops",
    "get",
    "load_hardware_file",
    "normalize_device_name",
    "peak_tflops",
    "variant",
]

# dtype -> catalog field holding its dense peak, in 1e12 ops/s (int8 in integer ops, the rest FLOPs)
PEAK_FIELDS: Mapping[str, str] = MappingProxyType({
    "fp32": "fp32_tflops", "tf32": "tf32_tflops", "bf16": "bf16_tflops",
    "fp16": "fp16_tflops", "fp8": "fp8_tflops", "fp4": "fp4_tflops", "int8": "int8_tops",
})
_DTYPE_SYNONYMS = {
    "float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8",
    "nvfp4": "fp4", "mxfp4": "fp4", "float4_e2m1fn_x2": "fp4", "e2m1": "fp4",
}


class UnknownAcceleratorError(ConfigError, LookupError):
    """A device name the catalog does not know; the message lists the closest keys."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """One catalog entry. ``None`` means not published / not supported, never zero."""

    key: str                                   # stable id, e.g. "h100-sxm"
    name: str                                  # display name
    vendor: str
    year: int                                  # first shipped / announced
    source: str                                # where the figures come from
    aliases: tuple[str, ...] = ()              # names and driver strings that mean this part
    fp32_tflops: float | None = None           # dense peaks, 1e12 FLOP/s
    tf32_tflops: float | None = None
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    fp8_tflops: float | None = None
    fp4_tflops: float | None = None            # block-scaled 4-bit (NVFP4 / MXFP4) tensor rate
    int8_tops: float | None = None             # 1e12 integer ops/s
    mem_gb: float | None = None                # vendor capacity figure
    mem_bw_gb_per_s: float | None = None       # 1e9 bytes/s
    link_gb_per_s: float | None = None         # intra-node device link, 1e9 bytes/s, both directions
    tdp_w: float | None = None                 # W
    internode_gbit_per_s: float | None = None  # typical scale-out network per device, 1e9 bit/s, one direction
    internode_source: str | None = None
    price_usd_per_gpu_hour: float | None = None
    price_date: str | None = None              # "YYYY-MM"
    price_source: str | None = None
    uncertain: frozenset[str] = frozenset()    # fields whose value the source marks uncertain
    unknown: frozenset[str] = frozenset()      # supported, but no figure published
    notes: str = ""
    base: str | None = None                    # the catalog part this one is a variant of (same silicon)
    # devices that share the scale-up link (one NVLink / Infinity Fabric domain); None: a board
    # of calibration.GPUS_PER_NODE. GB200/GB300 NVL72 racks: 72 GPUs on one NVLink switch fabric.
    link_domain_gpus: int | None = None
    # PCIe slot bandwidth (both directions) of a part whose link joins fewer devices than its host
    # holds (NVLink-bridged PCIe cards): groups beyond the bridge talk over PCIe
    host_link_gb_per_s: float | None = None

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense datasheet peak at ``dtype`` in 1e12 ops/s ('int8': integer ops), None if unpublished."""
        return getattr(self, PEAK_FIELDS[_dtype(dtype)])

    def peak_flops_per_s(self, dtype: str) -> float | None:
        """:meth:`peak_tflops` in ops/s, the unit MFU is computed in."""
        tflops = self.peak_tflops(dtype)
        return None if tflops is None else tflops * 1e12

    def is_uncertain(self, field_name: str) -> bool:
        return field_name in self.uncertain


# ---------------------------------------------------------------------------------------- loading

_NUMBER_FIELDS = frozenset(f.name for f in fields(Accelerator)
                           if f.name.endswith(("_tflops", "_tops", "_gb", "_per_s", "_w", "_hour")))
_TEXT_FIELDS = frozenset({"name", "vendor", "source", "internode_source", "price_date",
                          "price_source", "notes", "base"})
_LIST_FIELDS = frozenset({"aliases", "uncertain", "unknown"})
_INT_FIELDS = frozenset({"year", "link_domain_gpus"})
_REQUIRED = ("name", "vendor", "year", "source")
_KEY_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")

# Words drivers and people put around a model name; dropped before comparing names.
# vendor words, and the trademark marks Intel's device names carry ("Intel(R) Data Center GPU Max 1550")
_NOISE_WORDS = frozenset({"nvidia", "amd", "geforce", "tesla", "instinct", "intel", "google", "habana", "r", "tm"})


def _canonical(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'a100sxm480gb': lower case, vendor words and punctuation dropped."""
    return "".join(t for t in re.findall(r"[a-z0-9]+", name.lower()) if t not in _NOISE_WORDS)


def _build(raw: Mapping[str, Any]) -> tuple[Mapping[str, Accelerator], Mapping[str, str]]:
    """Validate the parsed TOML; return (key -> entry, canonical alias -> key).

    A malformed catalog is a bug in the package, so problems raise ValueError naming the entry.
    """
    if raw.get("schema_version") != 1:
        raise ValueError(f"accelerators.toml: unsupported schema_version {raw.get('schema_version')!r}")
    entries: dict[str, Accelerator] = {}
    index: dict[str, str] = {}
    for key, table in raw.get("accelerator", {}).items():
        where = f"accelerators.toml [accelerator.{key}]"
        if not _KEY_RE.match(key):
            raise ValueError(f"{where}: key must be lower-case words joined by '-'")
        extra = set(table) - _NUMBER_FIELDS - _TEXT_FIELDS - _LIST_FIELDS - _INT_FIELDS
        if extra:
            raise ValueError(f"{where}: unknown field(s) {sorted(extra)}")
        missing = [f for f in _REQUIRED if f not in table]
        if missing:
            raise ValueError(f"{where}: missing {missing}")
        for f in _NUMBER_FIELDS & set(table):
            v = table[f]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{where}: {f} must be a positive number, got {v!r} (leave it out if unknown)")
        for f in _INT_FIELDS & set(table):
            if not isinstance(table[f], int) or isinstance(table[f], bool) or table[f] <= 0:
                raise ValueError(f"{where}: {f} must be a positive integer")
        for f in _LIST_FIELDS & set(table):
            if not isinstance(table[f], list) or not all(isinstance(x, str) for x in table[f]):
                raise ValueError(f"{where}: {f} must be a list of strings")
        uncertain, unknown = set(table.get("uncertain", ())), set(table.get("unknown", ()))
        if bad := uncertain - (_NUMBER_FIELDS & set(table)):
            raise ValueError(f"{where}: uncertain names fields that are not numbers given here: {sorted(bad)}")
        if bad := unknown - (_NUMBER_FIELDS - set(table)):
            raise ValueError(f"{where}: unknown names fields that are not absent numbers: {sorted(bad)}")
        if ("price_usd_per_gpu_hour" in table) != ("price_date" in table) or \
                ("price_usd_per_gpu_hour" in table) != ("price_source" in table):
            raise ValueError(f"{where}: a price needs price_date and price_source, and vice versa")
        if ("internode_gbit_per_s" in table) != ("internode_source" in table):
            raise ValueError(f"{where}: internode_gbit_per_s and internode_source go together")

        values = {f: float(v) if f in _NUMBER_FIELDS else v for f, v in table.items()}
        values.update(aliases=tuple(table.get("aliases", ())), uncertain=frozenset(uncertain),
                      unknown=frozenset(unknown))
        entry = Accelerator(key=key, **values)
        entries[key] = entry
        for alias in (key, *entry.aliases):
            canon = _canonical(alias)
            if not canon:
                raise ValueError(f"{where}: alias {alias!r} is empty once vendor words are dropped")
            owner = index.setdefault(canon, key)
            if owner != key:
                raise ValueError(f"{where}: alias {alias!r} already belongs to {owner!r}")
    return MappingProxyType(entries), MappingProxyType(index)


# Parts a user described (``--hardware-file``, :func:`load_hardware_file`) on top of the
# package's catalog; None until one is loaded.
_OVERLAY: tuple[Mapping[str, Accelerator], Mapping[str, str]] | None = None


def _catalog() -> tuple[Mapping[str, Accelerator], Mapping[str, str]]:
    return _OVERLAY or _builtin()


@lru_cache(maxsize=1)
def _builtin() -> tuple[Mapping[str, Accelerator], Mapping[str, str]]:
    # Imported here, not at module level: only the first lookup pays for them (~ms).
    from importlib.resources import files

    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    text = files("tensorpilot.hardware").joinpath("accelerators.toml").read_text(encoding="utf-8")
    entries, index = _build(tomllib.loads(text))
    for key, entry in entries.items():
        if entry.base is not None and entry.base not in entries:
            raise ValueError(f"accelerators.toml [accelerator.{key}]: base {entry.base!r} is not a catalog key")
    return entries, index


# ---------------------------------------------------------------------------------------- user parts

_OVERRIDES = {"memory_gb": "mem_gb", "tdp_w": "tdp_w", "mem_bw_gb_per_s": "mem_bw_gb_per_s"}


def load_hardware_file(path: str) -> list[str]:
    """Add the parts a user's TOML file describes to the catalog for this process; their keys.

    Same fields and units as the package's ``accelerators.toml`` (``[accelerator.KEY]`` tables).
    A table with ``base = "h100-sxm"`` starts from that entry's figures and overrides what it
    gives (a power-capped or larger-memory variant); the base may be a catalog entry or a part
    described earlier in the same file (a new part, then its power-capped variants); without a
    base, name, vendor, year and source are required. Keys and aliases may not reuse the
    catalog's. A file that is missing, not TOML, or describes a part wrongly raises ConfigError
    naming the file and the entry."""
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    from tensorpilot.files import existing_path, os_reason

    global _OVERLAY
    p = existing_path(path, "hardware file", kind="file")
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"hardware file {str(path)!r} cannot be read: {os_reason(exc)}.") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"hardware file {str(path)!r} is not TOML: {str(exc).splitlines()[0]}.") from None
    tables = raw.get("accelerator")
    if not isinstance(tables, dict) or not tables or not all(isinstance(t, dict) for t in tables.values()):
        raise ConfigError(f"hardware file {str(path)!r} describes no part: it needs [accelerator.KEY] tables "
                          "with the fields of the catalog (see `tensorpilot hw --help`).")
    builtin, _ = _builtin()
    current = dict(_catalog()[0])
    merged: dict[str, Any] = {}
    for key, table in tables.items():
        table = dict(table)
        base = table.get("base")
        if base is not None and str(base) in merged:
            # a part described earlier in this file (its power-capped variants, say)
            parent_table = merged[str(base)]
            inherited = {k: v for k, v in parent_table.items() if k not in ("aliases", "uncertain", "unknown", "base")}
            inherited.update(name=f"{parent_table.get('name', base)} variant ({key})")
            table = {**inherited, **table, "base": str(base)}
        elif base is not None:
            if str(base) in tables and str(base) != key:
                raise ConfigError(f"hardware file {str(path)!r} [accelerator.{key}]: its base {str(base)!r} is "
                                  "described below it; move [accelerator." + str(base) + "] above it.")
            try:
                parent = get(str(base))
            except ConfigError as exc:
                raise ConfigError(f"hardware file {str(path)!r} [accelerator.{key}]: base: {exc}") from None
            inherited = {f.name: getattr(parent, f.name) for f in fields(Accelerator)
                         if f.name not in ("key", "aliases", "uncertain", "unknown", "base")
                         and getattr(parent, f.name) is not None}
            inherited.update(name=f"{parent.name} variant ({key})", source=f"{parent.source}; changed by {path}")
            table = {**inherited, **table, "base": parent.base or parent.key}
        if key in builtin:
            raise ConfigError(f"hardware file {str(path)!r}: [accelerator.{key}] reuses a catalog key; "
                              "name the variant differently and set base = \"{key}\".")
        merged[key] = table
    try:
        entries, _ = _build({"schema_version": 1, "accelerator": {**{k: _as_table(a) for k, a in current.items()},
                                                                   **merged}})
    except ValueError as exc:
        raise ConfigError(f"hardware file {str(path)!r}: {str(exc).replace('accelerators.toml ', '')}.") from None
    _OVERLAY = (MappingProxyType(entries), _build_index(entries))
    return list(merged)


def _as_table(acc: Accelerator) -> dict[str, Any]:
    """An entry back as the TOML table it was read from (for re-validation with user parts)."""
    out: dict[str, Any] = {}
    for f in fields(Accelerator):
        v = getattr(acc, f.name)
        if f.name == "key" or v is None or v == () or v == frozenset() or (f.name == "notes" and not v):
            continue
        out[f.name] = sorted(v) if isinstance(v, frozenset) else list(v) if isinstance(v, tuple) else \
            int(v) if f.name == "year" else v
    return out


def _build_index(entries: Mapping[str, Accelerator]) -> Mapping[str, str]:
    return MappingProxyType({_canonical(a): k for k, e in entries.items() for a in (k, *e.aliases)})


def variant(acc: Accelerator, *, memory_gb: float | None = None, tdp_w: float | None = None,
            peak_scale: float | None = None, mem_bw_gb_per_s: float | None = None,
            gpus_per_node: int | None = None) -> Accelerator:
    """``acc`` with some figures changed: capacity, board power, memory bandwidth, every compute
    peak scaled by ``peak_scale`` (a power cap or lower clocks; 0 < scale <= 4), and the devices its
    scale-up link joins, ``gpus_per_node`` (a four-GPU board: 4). The measured fractions of ``acc``
    keep applying (``base``)."""
    import dataclasses

    changes: dict[str, Any] = {}
    if gpus_per_node is not None:
        if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or not 1 <= gpus_per_node <= 1024:
            raise ConfigError(f"--gpus-per-node must be a whole number from 1 to 1024, not {gpus_per_node!r}.")
        changes["link_domain_gpus"] = gpus_per_node
    for arg, value in (("memory_gb", memory_gb), ("tdp_w", tdp_w), ("mem_bw_gb_per_s", mem_bw_gb_per_s)):
        if value is not None:
            if not (isinstance(value, (int, float)) and 0 < value < 1e7):
                raise ConfigError(f"--{arg.replace('_', '-')} must be a positive number, not {value!r}.")
            changes[_OVERRIDES[arg]] = float(value)
    if peak_scale is not None:
        if not (isinstance(peak_scale, (int, float)) and 0 < peak_scale <= 4):
            raise ConfigError(f"--peak-scale must be in (0, 4], not {peak_scale!r}.")
        for f in PEAK_FIELDS.values():
            if getattr(acc, f) is not None:
                changes[f] = getattr(acc, f) * peak_scale
    if not changes:
        return acc
    what = ", ".join(f"{k}={v:g}" for k, v in (("memory_gb", memory_gb), ("tdp_w", tdp_w),
                                                ("peak_scale", peak_scale), ("mem_bw_gb_per_s", mem_bw_gb_per_s),
                                                ("gpus_per_node", gpus_per_node))
                     if v is not None)
    return dataclasses.replace(acc, key=f"{acc.key}-variant", name=f"{acc.name} ({what})", aliases=(),
                               base=acc.base or acc.key, **changes)


# ---------------------------------------------------------------------------------------- lookup

def all_accelerators() -> Mapping[str, Accelerator]:
    """Every entry, by key, in file order (read-only)."""
    return _catalog()[0]


def normalize_device_name(device_name: str) -> str | None:
    """Catalog key of a device string such as ``torch.cuda.get_device_name()`` returns, else None.

    Exact after canonicalisation (case, punctuation and vendor words ignored), so
    "NVIDIA H100 80GB HBM3" -> "h100-sxm" but "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> None.
    """
    canon = _canonical(device_name)
    return _catalog()[1].get(canon) if canon else None


def get(name: str) -> Accelerator:
    """The entry for a key, alias or device name ("H100-SXM", "h100 sxm", "NVIDIA H100 80GB HBM3").

    Raises UnknownAcceleratorError (a ConfigError) with suggestions when nothing matches.
    """
    key = normalize_device_name(name)
    if key is None:
        hint = closest(name)
        tail = f"did you mean {', '.join(hint)}?" if hint else f"known: {', '.join(all_accelerators())}."
        raise UnknownAcceleratorError(f"unknown accelerator {name!r}; {tail}")
    return all_accelerators()[key]


def base_chain(acc: Accelerator) -> list[Accelerator]:
    """``acc`` and the parts it is a variant of, nearest first: a user's capped variant of a part
    the same file describes on a catalog part's silicon gives [variant, part, catalog part]."""
    chain = [acc]
    while getattr(chain[-1], "base", None):
        chain.append(get(chain[-1].base))
    return chain


def closest(name: str, n: int = 3) -> list[str]:
    """Up to ``n`` catalog keys whose key or an alias looks like ``name``, best first.

    Similarity is difflib's ratio on canonical names (cut-off 0.6, as difflib.get_close_matches);
    names that *start with* what was typed rank first, so "h100" suggests the H100 variants
    before the (textually as close) "h200".
    """
    import difflib

    query = _canonical(name)
    if not query:
        return []
    best: dict[str, float] = {}                # key -> best score over its aliases
    for canon, key in _catalog()[1].items():
        ratio = difflib.SequenceMatcher(None, query, canon).ratio()
        score = 1.0 + ratio if len(query) >= 2 and canon.startswith(query) else ratio
        if score >= 0.6 and score > best.get(key, 0.0):
            best[key] = score
    order = {key: i for i, key in enumerate(all_accelerators())}   # ties: file order
    return sorted(best, key=lambda k: (-best[k], order[k]))[:n]


def _dtype(dtype: str) -> str:
    name = str(dtype).lower().removeprefix("torch.")
    name = _DTYPE_SYNONYMS.get(name, name)
    if name not in PEAK_FIELDS:
        raise ValueError(f"the catalog has peaks for {', '.join(PEAK_FIELDS)}; not for {dtype!r}")
    return name


def peak_tflops(name: str, dtype: str) -> float | None:
    """Dense datasheet peak of device ``name`` at ``dtype``, 1e12 ops/s; None when not published.

    ``dtype``: fp32, tf32, bf16, fp16, fp8, int8 (also 'bfloat16', 'torch.float16', ...).
    An unknown device raises UnknownAcceleratorError; an unknown dtype raises ValueError.
    """
    return get(name).peak_tflops(dtype)


# ----------------------------------------------------------------------------------- CPU estimate

@dataclass(frozen=True, slots=True)
class CpuPeakEstimate:
    """A CPU peak computed from the ISA, not measured. ``source`` always starts with "estimate:"."""

    flops_per_s: float | None                  # cores x clock_hz x flops_per_cycle_per_core
    flops_per_cycle_per_core: float | None
    source: str


# Per-core FLOP/cycle, derived from vector width x FMA pipes x 2 (an FMA is a multiply and an add):
#   AVX-512 FMA, fp32: 16 lanes x 2 FLOP x fma_units -> 64 with 2 units (Skylake-SP Gold 6xxx /
#     Platinum and later Xeon Scalable, Zen 5 server). Intel 64 and IA-32 Architectures Optimization
#     Reference Manual (Skylake Server: two 512-bit FMA units on ports 0+1 and 5); Intel Architecture
#     Day 2021 Sapphire Rapids slide: "AVX-512 (2xFMA) 64 FP32 ops/cycle".
#     One unit (Xeon Bronze/Silver, many Gold 5xxx, Ice Lake client) or AMD Zen 4 (512-bit ops
#     split over its two 256-bit FMA pipes, AMD Zen 4 Software Optimization Guide) -> fma_units=1.
#   AVX2 + FMA3, fp32: 8 lanes x 2 x fma_units -> 32 with 2 units (Haswell and later; AMD Zen 2+).
#     Intel Optimization Reference Manual (Haswell: two FMA units); Zen 1 has the throughput of one.
#   AVX without FMA, fp32: one 8-wide multiply + one 8-wide add per cycle -> 16 (Sandy/Ivy Bridge).
#   SSE2 only, fp32: 4-wide multiply + 4-wide add -> 8.
#   Arm NEON ("asimd"), fp32: 4 lanes x 2 x fma_units -> 16 with 2 x 128-bit pipes (Arm Neoverse
#     N1 Software Optimization Guide); ASSUMPTION for other cores (Neoverse V1/V2, Apple M: 4 pipes).
#   AVX512-BF16 (vdpbf16ps), bf16: each 32-bit lane multiplies 2 bf16 pairs and adds both into an
#     fp32 accumulator = 4 FLOP vs the FMA's 2 -> 2x the AVX-512 fp32 rate. ASSUMPTION: the
#     instruction issues at the FMA rate; not verified per core.
#   AVX512-FP16, fp16: 32 lanes per zmm FMA -> 2x the AVX-512 fp32 rate (Intel ISA Extensions ref.).
#   AMX-BF16 (TMUL): 1024 bf16 FLOP/cycle per core; AMX-INT8: 2048 int8 ops/cycle (Intel, "4th Gen
#     Xeon Scalable can perform 2048 INT8 or 1024 BF16 operations per cycle"; 16x32 by 32x16 tile
#     product = 8192 multiply-adds every 16 cycles). AMX-FP16 (Granite Rapids): ASSUMED at the
#     AMX-BF16 rate.
#   AVX512-VNNI (vpdpbusd), int8: 4 multiply-adds per 32-bit lane = 8 ops -> 4x the fp32 rate
#     (256 int8 ops/cycle with 2 units, the Architecture Day 2021 slide); AVX-VNNI (256-bit): 128.
# Peaks assume every core runs the given clock; AVX-512 and AMX code usually runs at a lower
# "licence" clock than the base/turbo clock on the box.

def _norm_flags(isa_flags: Iterable[str]) -> frozenset[str]:
    return frozenset(f.lower().replace("_", "") for f in isa_flags)


def _fp32_path(flags: frozenset[str], fma_units: int) -> tuple[float, str] | None:
    if "avx512f" in flags:
        return 16 * 2 * fma_units, f"AVX-512: {fma_units} FMA unit(s) x 16 fp32 lanes x 2"
    if "avx2" in flags and "fma" in flags:
        return 8 * 2 * fma_units, f"AVX2+FMA: {fma_units} FMA unit(s) x 8 fp32 lanes x 2"
    if "avx" in flags:
        return 16, "AVX without FMA: 8-wide multiply + 8-wide add"
    if "asimd" in flags:
        return 4 * 2 * fma_units, f"NEON: {fma_units} x 128-bit FMA pipe(s) x 4 fp32 lanes x 2"
    if "sse2" in flags:
        return 8, "SSE2: 4-wide multiply + 4-wide add"
    return None


def cpu_peak_flops(cores: int, clock_hz: float, isa_flags: Iterable[str], dtype: str = "fp32",
                   *, fma_units: int = 2) -> CpuPeakEstimate:
    """ESTIMATED peak of a CPU: ``cores`` x ``clock_hz`` x FLOPs/cycle/core of the best ISA path.

    ``isa_flags``: /proc/cpuinfo flag names ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16",
    ...). ``fma_units``: FMA pipes per core at the widest vector width -- 2 is an ASSUMPTION (see
    the table above); pass 1 for Xeon Bronze/Silver or AMD Zen 4 with AVX-512. ``dtype``: fp32,
    tf32 (no CPU TF32: the fp32 rate), bf16, fp16, int8. Without dedicated bf16/fp16 instructions
    the estimate is the fp32 rate (the library converts). Unknown ISA or int8 without VNNI/AMX ->
    ``flops_per_s`` None.

    >>> cpu_peak_flops(2, 3.0e9, {"avx2", "fma"}).flops_per_s      # 2 x 3e9 x 32
    192000000000.0
    """
    if cores < 1 or not clock_hz > 0:
        raise ValueError(f"cores must be >= 1 and clock_hz > 0, got {cores}, {clock_hz}")
    if fma_units not in (1, 2, 4):
        raise ValueError(f"fma_units must be 1, 2 or 4, got {fma_units}")
    kind = str(dtype).lower().removeprefix("torch.")
    kind = _DTYPE_SYNONYMS.get(kind, kind)
    flags = _norm_flags(isa_flags)
    fp32 = _fp32_path(flags, fma_units)

    per_cycle: float | None = None
    how = "no known vector ISA in the flags"
    if kind in ("fp32", "tf32"):
        if fp32:
            per_cycle, how = fp32
            if kind == "tf32":
                how += " (CPUs have no TF32: fp32 rate)"
    elif kind == "bf16":
        if "amxbf16" in flags:
            per_cycle, how = 1024, "AMX-BF16: 1024 bf16 FLOP/cycle/core"
        elif "avx512bf16" in flags and "avx512f" in flags:
            per_cycle, how = 2 * 16 * 2 * fma_units, "AVX512-BF16 vdpbf16ps: 2x the AVX-512 fp32 rate"
        elif fp32:
            per_cycle, how = fp32[0], fp32[1] + " (no bf16 instructions: fp32 rate after conversion)"
    elif kind == "fp16":
        if "amxfp16" in flags:
            per_cycle, how = 1024, "AMX-FP16: assumed at the AMX-BF16 rate, 1024 FLOP/cycle/core"
        elif "avx512fp16" in flags:
            per_cycle, how = 2 * 16 * 2 * fma_units, "AVX512-FP16: 2x the AVX-512 fp32 rate"
        elif fp32:
            per_cycle, how = fp32[0], fp32[1] + " (no fp16 arithmetic: fp32 rate after conversion)"
    elif kind == "int8":
        if "amxint8" in flags:
            per_cycle, how = 2048, "AMX-INT8: 2048 int8 ops/cycle/core"
        elif "avx512vnni" in flags:
            per_cycle, how = 16 * 8 * fma_units, "AVX512-VNNI vpdpbusd: 4x the AVX-512 fp32 rate"
        elif "avxvnni" in flags:
            per_cycle, how = 8 * 8 * fma_units, "AVX-VNNI vpdpbusd (256-bit): 4x the AVX2 fp32 rate"
        else:
            how = "no int8 dot-product instructions (VNNI/AMX)"
    else:
        raise ValueError(f"cpu_peak_flops knows fp32, tf32, bf16, fp16, int8; not {dtype!r}")

    if per_cycle is None:
        return CpuPeakEstimate(None, None, f"estimate: unknown for {kind}: {how}")
    unit = "ops" if kind == "int8" else "FLOP"
    return CpuPeakEstimate(cores * clock_hz * per_cycle, float(per_cycle),
                           f"estimate: {cores} cores x {clock_hz / 1e9:.2f} GHz x {per_cycle:g} "
                           f"{kind} {unit}/cycle ({how}); not measured")
