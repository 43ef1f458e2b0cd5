"""scripts/probes/decode_gemm_probe.py on the CPU: its tile parser, and the script itself at the
tiny shapes it runs without a GPU (every form's output checked against the first)."""

from __future__ import annotations

import pytest
from probe_helpers import load_probe, run_probe


def _probe():
    return load_probe("decode_gemm_probe")


def test_parse_tile_reads_every_field_and_refuses_malformed_specs():
    probe = _probe()
    assert probe.parse_tile("64x128x32w4s3") == (64, 128, 32, 4, 3)
    assert [probe.parse_tile(t)[:3] for t in probe.TILES][0] == (128, 128, 64)
    for bad in ("64x128", "64x128x32w4", "axbxcw4s3", "64x128x32s3w4"):
        with pytest.raises(ValueError, match="BMxBNxBKwWsS"):
            probe.parse_tile(bad)


def _run(*args: str):
    return run_probe("decode_gemm_probe", *args)


def test_probe_runs_every_shape_on_cpu_and_refuses_a_bad_tile():
    out = _run("--dtype", "bf16", "fp8")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    shapes = [ln.split()[1] for ln in lines if ln.startswith("bf16 ")]
    assert shapes == ["qkv", "o_proj", "gate_up", "down"]
    assert all("linear ok" in ln and "mm_t ok" in ln for ln in lines if ln.startswith("bf16 "))
    assert "fp8: needs a GPU" in out.stdout
    bad = _run("--tiles", "64x64")
    assert bad.returncode == 2 and "BMxBNxBKwWsS" in bad.stderr
