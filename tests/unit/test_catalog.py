"""The accelerator catalog: data integrity, parity with the reference table, name lookup, CPU estimate."""

from __future__ import annotations

import csv
import doctest
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tensorpilot.errors import ConfigError
from tensorpilot.hardware import catalog
from tensorpilot.hardware.catalog import (
    PEAK_FIELDS,
    UnknownAcceleratorError,
    all_accelerators,
    closest,
    cpu_peak_flops,
    get,
    normalize_device_name,
    peak_tflops,
)

# The project's reference table of dense peaks, next to the repository (not shipped with it).
REFERENCE_CSV = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "accelerators.csv"

# reference column -> catalog field
CSV_NUMBER_COLUMNS = {
    "fp32_tflops": "fp32_tflops", "tf32_tflops": "tf32_tflops", "bf16_tflops": "bf16_tflops",
    "fp16_tflops": "fp16_tflops", "fp8_tflops": "fp8_tflops", "int8_tops": "int8_tops",
    "mem_gb": "mem_gb", "mem_bw_gbs": "mem_bw_gb_per_s", "link_gbs": "link_gb_per_s", "tdp_w": "tdp_w",
}
ENTRIES = list(all_accelerators().values())


# ------------------------------------------------------------------------------- reference parity

def _reference_rows() -> list[dict[str, str]]:
    if not REFERENCE_CSV.exists():
        pytest.skip(f"reference table not found at {REFERENCE_CSV}")
    with REFERENCE_CSV.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_every_reference_row_is_catalogued_with_its_numbers():
    rows = _reference_rows()
    assert len(rows) == 24
    keys = set()
    for row in rows:
        acc = get(row["name"])                           # the table's name is an alias
        keys.add(acc.key)
        assert acc.vendor == row["vendor"], row["name"]
        assert acc.year == int(row["year"]), row["name"]
        assert acc.source == row["source"], row["name"]
        for column, field in CSV_NUMBER_COLUMNS.items():
            cell = row[column].strip()
            value = getattr(acc, field)
            where = f"{row['name']} {column}={cell!r}"
            if cell == "":                               # not supported / not published
                assert value is None and field not in acc.unknown, where
            elif cell == "?":                            # exists, no figure: absent and listed
                assert value is None and field in acc.unknown, where
            else:                                        # "75" or "75?" (uncertain)
                assert value == pytest.approx(float(cell.rstrip("?")), abs=1e-9), where
                assert (field in acc.uncertain) == cell.endswith("?"), where
    assert len(keys) == 24                               # no two rows share an entry


# ------------------------------------------------------------------------------------ integrity

def test_catalog_size_and_keys():
    assert len(ENTRIES) >= 24
    for acc in ENTRIES:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", acc.key)
        assert normalize_device_name(acc.key) == acc.key
        for alias in acc.aliases:
            assert normalize_device_name(alias) == acc.key, alias


@pytest.mark.parametrize("acc", ENTRIES, ids=lambda a: a.key)
def test_entry_fields_present_positive_and_in_sane_units(acc):
    assert acc.name and acc.vendor and acc.source
    assert 2015 <= acc.year <= 2030
    assert acc.bf16_tflops or acc.fp16_tflops, "every entry has a half-precision matmul peak"
    # memory: GB not bytes or GiB-as-MiB; bandwidth in GB/s (T4 320 ... B200 8000)
    assert acc.mem_gb is not None and 8 <= acc.mem_gb <= 512
    assert acc.mem_bw_gb_per_s is not None and 100 <= acc.mem_bw_gb_per_s <= 10_000
    assert acc.link_gb_per_s is None or 10 <= acc.link_gb_per_s <= 5_000
    assert acc.tdp_w is None or 30 <= acc.tdp_w <= 2_000
    for field in PEAK_FIELDS.values():
        value = getattr(acc, field)
        assert value is None or 1 <= value <= 20_000, (field, value)   # TFLOP/s, not FLOP/s
    if acc.internode_gbit_per_s is not None:
        assert acc.internode_source and 10 <= acc.internode_gbit_per_s <= 1_600   # Gbit/s per device
    if acc.price_usd_per_gpu_hour is not None:
        assert 0.05 <= acc.price_usd_per_gpu_hour <= 100
        assert re.fullmatch(r"20\d\d-\d\d", acc.price_date) and acc.price_source
    # uncertain marks values that are there; unknown marks values that are not
    for field in acc.uncertain:
        assert getattr(acc, field) is not None, field
    for field in acc.unknown:
        assert getattr(acc, field) is None, field


@pytest.mark.parametrize("acc", ENTRIES, ids=lambda a: a.key)
def test_peaks_are_ordered_like_the_hardware(acc):
    # lower precision is never slower on the same device
    if acc.fp32_tflops and acc.bf16_tflops:
        assert acc.bf16_tflops >= acc.fp32_tflops
    if acc.fp32_tflops and acc.tf32_tflops:
        assert acc.tf32_tflops >= acc.fp32_tflops
    if acc.bf16_tflops and acc.fp8_tflops:
        assert acc.fp8_tflops >= acc.bf16_tflops
    if acc.tf32_tflops and acc.bf16_tflops:
        assert acc.bf16_tflops >= acc.tf32_tflops


def test_peaks_are_dense_not_sparse():
    # NVIDIA prints 1979 "with sparsity" for H100 SXM bf16; the dense figure is half of it.
    assert get("h100-sxm").bf16_tflops == 989.4
    assert get("h100-sxm").fp8_tflops == 1978.9
    assert get("a100-sxm4-80gb").bf16_tflops == 312       # not 624
    assert get("b200").bf16_tflops == 2250                 # not 4500
    assert get("mi300x").bf16_tflops == 1307.4             # AMD quotes dense; 2614.9 is with sparsity


# One figure per added entry, typed by hand from the document its `source` names (the independent
# reference): a sparse NVIDIA figure is halved here, never in the catalog's favour.
@pytest.mark.parametrize("key, field, expected, document", [
    ("h200-nvl", "bf16_tflops", 1671 / 2, "NVIDIA H200 page, H200 NVL: BF16 1,671 TFLOPS with sparsity"),
    ("h200-nvl", "tdp_w", 600, "NVIDIA H200 page, H200 NVL: up to 600 W"),
    ("l40", "fp8_tflops", 724 / 2, "NVIDIA L40 datasheet: FP8 362 | 724 TFLOPS (sparse)"),
    ("a800-sxm4-80gb", "link_gb_per_s", 400, "NVIDIA A800 datasheet: NVLink 400 GB/s"),
    ("rtx-5090", "bf16_tflops", 209.5, "RTX Blackwell whitepaper App. A: BF16 w/ FP32 acc 209.5"),
    ("mi355x", "bf16_tflops", 2516.6, "AMD MI355X datasheet: BF16 2.5166 PFLOPS dense"),
    ("mi250-gcd", "bf16_tflops", 362.1 / 2, "ROCm MI250 doc: matrix BF16 362.1 TFLOPS per OAM (2 GCDs)"),
    ("tpu-v6e", "mem_bw_gb_per_s", 1638, "Google TPU v6e doc: HBM bandwidth per chip 1638 GBps"),
    ("tpu7x", "fp8_tflops", 4614, "Google TPU7x doc: peak compute per chip (FP8) 4614 TFLOPs"),
    ("trainium2", "fp8_tflops", 1299, "AWS Neuron Trainium2 doc: 1,299 FP8 TFLOPS"),
    ("trainium1", "bf16_tflops", 190, "AWS Neuron Trainium doc: 190 FP16/BF16/cFP8/TF32 TFLOPS per chip"),
    ("trainium1", "mem_bw_gb_per_s", 880.47, "AWS Neuron Trainium doc: 820 GiB/sec = 880.47 GB/s"),
    ("trainium1-neuroncore", "bf16_tflops", 190 / 2, "AWS Neuron Trainium doc: 2 NeuronCore-v2 per chip"),
    ("max-1550-tile", "bf16_tflops", round(128 / 2 * 8 * 512 * 1.6 / 1000, 2),
     "Intel Max 1550 spec: 128 Xe-cores x 8 XMX (512 bf16 FLOP/clk each) at 1600 MHz, 2 tiles"),
    ("max-1550-tile", "mem_gb", 128 / 2, "Intel Max 1550 spec: 128 GB HBM2e, 2 tiles"),
    ("tpu-v3", "bf16_tflops", 123, "Google Cloud TPU v3 doc: 123 TFLOPS per chip"),
    ("tpu-v3", "mem_bw_gb_per_s", 900, "Google Cloud TPU v3 doc: 900 GBps HBM per chip"),
])
def test_added_entries_match_their_datasheets(key, field, expected, document):
    assert getattr(get(key), field) == pytest.approx(expected, abs=1e-9), document


def test_missing_values_are_absent_not_zero():
    a100 = get("a100-sxm4-40gb")
    assert a100.fp8_tflops is None and "fp8_tflops" not in a100.unknown   # Ampere has no fp8
    gaudi2 = get("gaudi2")
    assert gaudi2.fp16_tflops is None and "fp16_tflops" in gaudi2.unknown  # supported, unpublished
    assert get("gaudi3").is_uncertain("fp32_tflops")
    assert not get("h100-sxm").uncertain


def test_catalog_is_shipped_as_package_data_and_parsed_once():
    from importlib.resources import files

    assert files("tensorpilot.hardware").joinpath("accelerators.toml").is_file()
    assert catalog._catalog() is catalog._catalog()


def test_import_is_light():
    code = ("import sys, tensorpilot.hardware.catalog as c; "
            "assert 'torch' not in sys.modules and 'tomllib' not in sys.modules; "
            "c.get('t4'); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_docstring_examples():
    result = doctest.testmod(catalog)
    assert result.attempted >= 5 and result.failed == 0


# ------------------------------------------------------------------------------ loader checks

def _raw(**entry):
    base = {"name": "X", "vendor": "V", "year": 2024, "source": "s", "bf16_tflops": 1.0, "mem_gb": 16}
    return {"schema_version": 1, "accelerator": {"x-1": {**base, **entry}}}


@pytest.mark.parametrize("entry, message", [
    ({"bf16_tflops": 0}, "positive"),                       # missing must be absent, never 0
    ({"bf16_flops": 1.0}, "unknown field"),                 # unit typo in a field name
    ({"uncertain": ["fp8_tflops"]}, "uncertain"),           # uncertain value that is not there
    ({"unknown": ["bf16_tflops"]}, "unknown names"),        # "unknown" value that is there
    ({"price_usd_per_gpu_hour": 2.0}, "price"),             # an undated, unsourced price
    ({"internode_gbit_per_s": 400.0}, "internode"),         # a network figure without a source
])
def test_loader_rejects_malformed_entries(entry, message):
    with pytest.raises(ValueError, match=message):
        catalog._build(_raw(**entry))


def test_loader_rejects_an_alias_claimed_by_two_entries():
    raw = _raw(aliases=["Foo 1"])
    raw["accelerator"]["y-1"] = {**raw["accelerator"]["x-1"], "aliases": ["foo-1"]}
    with pytest.raises(ValueError, match="already belongs to 'x-1'"):
        catalog._build(raw)


# ------------------------------------------------------------------------------ name handling

@pytest.mark.parametrize("device_name, key", [
    # what torch.cuda.get_device_name() / rocm / JAX report
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200-sxm"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100-SXM-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("NVIDIA GeForce RTX 3090", "rtx-3090"),
    ("AMD Instinct MI300X", "mi300x"),
    ("AMD Instinct MI250X", "mi250x-gcd"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
    ("Tesla T4", "t4"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA B200", "b200"),
    ("TPU v5 lite", "tpu-v5e"),
    ("GAUDI2", "gaudi2"),
    # siblings that used to stay unmatched now have entries of their own (not the sibling's)
    ("NVIDIA L40", "l40"),
    ("NVIDIA H200 NVL", "h200-nvl"),
    ("AMD Instinct MI300A", "mi300a"),
    ("NVIDIA GH200 480GB", "gh200-96gb"),
    ("NVIDIA GH200 144G HBM3e", "gh200-144gb"),
    ("NVIDIA B300 SXM6 AC", "b300"),
    ("NVIDIA GeForce RTX 5090", "rtx-5090"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
    ("NVIDIA A800-SXM4-80GB", "a800-sxm4-80gb"),
    ("TPU v6 lite", "tpu-v6e"),
    ("TPU7x", "tpu7x"),
    ("Intel(R) Data Center GPU Max 1550", "max-1550-tile"),
    ("TPU v3", "tpu-v3"),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx-3090-ti"),
    ("NVIDIA GeForce RTX 3080 Ti", "rtx-3080-ti"),
    ("NVIDIA GeForce RTX 3080 Ti Laptop GPU", "rtx-3080-ti-laptop"),
    ("NVIDIA GeForce RTX 2060 SUPER", "rtx-2060-super"),
    ("Quadro RTX 8000", "quadro-rtx-8000"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000-blackwell"),
])
def test_normalize_real_device_names(device_name, key):
    assert normalize_device_name(device_name) == key


@pytest.mark.parametrize("device_name", [
    "NVIDIA GeForce GTX 1080",            # not catalogued
    "NVIDIA A10G",                        # AWS variant, different clocks: not the A10
    "NVIDIA L40G",                        # China L40 variant: neither the L40 nor the L40S
    "NVIDIA H800 PCIe",                   # not the H800 SXM
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",   # 300 W: not the catalogued 600 W card
    "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "GH200",                              # ambiguous: 96 GB HBM3 or 144 GB HBM3e
    "TPU7",                               # a different libtpu chip version than TPU7x
    "NVIDIA H100 80GB HBM3 MIG 1g.10gb",  # a MIG slice has a fraction of the peak
    "NVIDIA GeForce RTX 4090 D",          # cut-down China variant
    "NVIDIA GeForce RTX 4090 Laptop GPU",
    "NVIDIA GeForce RTX 2060",            # the 6 GB card: not the 2060 SUPER
    "NVIDIA TITAN Xp",                    # Pascal: no half-precision training rate (fp16 at 1/64 of fp32)
    "Tesla V100-SXM2-16GB",               # 16 GB sibling of the catalogued 32 GB part
    "Tesla V100-PCIE-32GB",
    "AMD Instinct MI250X/MI250",          # ambiguous: MI250 has fewer compute units
    "NVIDIA GeForce RTX 5090 D",          # cut-down China variant
    "NVIDIA",
    "cpu",
    "cuda:0",
    "",
])
def test_normalize_never_guesses(device_name):
    assert normalize_device_name(device_name) is None


@pytest.mark.parametrize("spelling", [
    "h100-sxm", "H100-SXM", "h100 sxm", "H100_SXM", "H100SXM", "  H100 SXM  ",
    "nvidia h100 80gb hbm3", "H100 SXM5 80GB",
])
def test_get_is_case_and_format_tolerant(spelling):
    assert get(spelling).key == "h100-sxm"


def test_get_unknown_name_is_a_user_error_with_suggestions():
    with pytest.raises(UnknownAcceleratorError, match="did you mean h100-sxm") as info:
        get("h100-sxn")
    assert isinstance(info.value, ConfigError) and isinstance(info.value, LookupError)


def test_closest_suggests_for_typos():
    assert "h100-sxm" in closest("h100-sxn")
    assert closest("h100")[:3] == ["h100-sxm", "h100-nvl", "h100-pcie"]   # prefix first, not h200
    assert set(closest("a100", n=4)) == {"a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-80gb", "a100-pcie-40gb"}
    assert len(closest("h100", n=2)) == 2
    assert closest("zzzz") == []


def test_peak_tflops():
    assert peak_tflops("H100 SXM", "bf16") == 989.4
    assert peak_tflops("h100-sxm", "bfloat16") == 989.4
    assert peak_tflops("h100-sxm", "torch.float16") == 989.4
    assert peak_tflops("a100-sxm4-80gb", "fp8") is None      # unpublished -> None, not 0
    assert peak_tflops("tpu-v4", "fp32") is None
    assert peak_tflops("rtx-4090", "int8") == 660.6          # TOPS for int8
    assert get("a100-sxm4-80gb").peak_flops_per_s("tf32") == pytest.approx(156e12)
    with pytest.raises(ValueError, match="fp64"):
        peak_tflops("h100-sxm", "fp64")
    with pytest.raises(UnknownAcceleratorError):
        peak_tflops("gtx-1080", "fp32")


# ------------------------------------------------------------------------------- CPU estimate

SPR = {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_int8",
       "amx_tile"}                                  # a Sapphire Rapids Xeon's /proc/cpuinfo flags (subset)


def test_cpu_estimate_avx512_fp32():
    # Xeon Platinum 8480+: 56 cores x 2.0e9 Hz x (2 FMA units x 16 lanes x 2 FLOP = 64) = 7.168e12 FLOP/s
    est = cpu_peak_flops(56, 2.0e9, SPR, "fp32")
    assert est.flops_per_s == pytest.approx(7.168e12)
    assert est.flops_per_cycle_per_core == 64
    assert est.source.startswith("estimate:")


def test_cpu_estimate_amx_bf16():
    # 56 cores x 2.0e9 Hz x 1024 bf16 FLOP/cycle (AMX) = 114.688e12 FLOP/s
    assert cpu_peak_flops(56, 2.0e9, SPR, "bf16").flops_per_s == pytest.approx(114.688e12)
    # same chip, int8 on AMX: 56 x 2.0e9 x 2048 = 229.376e12 ops/s
    assert cpu_peak_flops(56, 2.0e9, SPR, "int8").flops_per_s == pytest.approx(229.376e12)


def test_cpu_estimate_avx512_bf16_and_avx2():
    # Zen 4-like flags without AMX, one effective 512-bit FMA unit:
    # 16 cores x 3.0e9 x (1 x 16 x 2 = 32) x 2 (vdpbf16ps) = 3.072e12 FLOP/s
    zen4 = {"avx2", "fma", "avx512f", "avx512_bf16"}
    assert cpu_peak_flops(16, 3.0e9, zen4, "bf16", fma_units=1).flops_per_s == pytest.approx(3.072e12)
    # Haswell-style AVX2: 8 cores x 3.5e9 x (2 x 8 x 2 = 32) = 896e9 FLOP/s
    assert cpu_peak_flops(8, 3.5e9, {"avx", "avx2", "fma"}, "fp32").flops_per_s == pytest.approx(896e9)
    # no bf16 instructions: the fp32 rate, and the source says why
    est = cpu_peak_flops(8, 3.5e9, ["AVX2", "FMA"], "bf16")
    assert est.flops_per_s == pytest.approx(896e9) and "fp32 rate" in est.source


def test_cpu_estimate_unknowns():
    assert cpu_peak_flops(4, 2e9, set(), "fp32").flops_per_s is None
    assert cpu_peak_flops(4, 2e9, {"avx2", "fma"}, "int8").flops_per_s is None   # no VNNI/AMX
    with pytest.raises(ValueError):
        cpu_peak_flops(0, 2e9, {"avx2"}, "fp32")
    with pytest.raises(ValueError):
        cpu_peak_flops(4, 2e9, {"avx2"}, "fp64")
