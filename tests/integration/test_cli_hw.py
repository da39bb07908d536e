"""`tensorpilot hw`: detection, probe, JSON shape, catalog look-ups."""

from __future__ import annotations

import json

from conftest import run_cli


def test_hw_probe_json_has_the_documented_fields(tmp_path):
    import os
    env_cache = os.environ["TENSORPILOT_CACHE"]
    os.environ["TENSORPILOT_CACHE"] = str(tmp_path)          # a fresh cache: really measure
    try:
        out = run_cli("hw", "--probe", "--quick", "--json", check=True).stdout
        again = run_cli("hw", "--json", check=True).stdout    # no --probe: read from the cache
    finally:
        os.environ["TENSORPILOT_CACHE"] = env_cache
    data = json.loads(out)
    cpu = data["devices"][0]
    assert cpu["name"] and cpu["kind"] == "cpu" and cpu["cores"] >= 1
    assert cpu["peak_kind"] == "estimate"
    assert cpu["measured_flops"]["fp32"] > 1e9 and cpu["memory_bandwidth_bytes_per_s"] > 1e8
    assert set(cpu["peak_flops"]) >= {"fp32", "bf16"}
    # ridge point = peak / bandwidth
    assert cpu["ridge_point_flop_per_byte"]["fp32"] == cpu["peak_flops"]["fp32"] / cpu["memory_bandwidth_bytes_per_s"]
    assert data["allreduce"]["backend"] == "gloo" and data["allreduce"]["bus_bytes_per_s"] > 0
    assert json.loads(again)["devices"][0]["measured_flops"] == cpu["measured_flops"]


def test_hw_gpu_lookup_is_format_tolerant_and_unknown_names_get_suggestions():
    for name in ("h100-sxm", "H100 SXM", "NVIDIA H100 80GB HBM3"):
        entry = json.loads(run_cli("hw", "--gpu", name, "--json", check=True).stdout)
        assert entry["key"] == "h100-sxm" and entry["bf16_tflops"] == 989.4
        assert round(entry["ridge_point_flop_per_byte"]["bf16"], 1) == 295.3      # 989.4e12 / 3.35e12
    proc = run_cli("hw", "--gpu", "h100-sxn")
    assert proc.returncode == 2 and "did you mean" in proc.stderr and "h100-sxm" in proc.stderr
    assert "Traceback" not in proc.stderr
    text = run_cli("hw", "--gpu", "mi300x", check=True).stdout
    assert "MI300X" in text
