"""scripts/probes/elementwise_floor.py on the CPU: the bytes it charges each kernel, the share
arithmetic, its refusals, and the script itself at the small M it runs without a GPU."""

from __future__ import annotations

import pytest
from probe_helpers import load_probe, run_probe


def _probe():
    return load_probe("elementwise_floor")


def test_kernel_bytes_per_token_follow_the_layer_shapes():
    p = _probe()
    fp8 = dict(p.kernel_bytes(1, "fp8"))
    # residual + x in (2 x 4 KiB), residual out (4 KiB), codes (2 KiB) and a float32 scale
    assert fp8["input norm -> e4m3"] == 2048 * 7 + 4
    assert fp8["SiLU-and-mul -> e4m3"] == 6144 * 5 + 4
    assert fp8["o_proj input -> e4m3"] == 2048 * 3 + 4
    assert fp8["q/k norm + RoPE + KV write"] == 4096 * 4 + 2 * 1024
    assert sum(dict(p.kernel_bytes(1000, "fp8")).values()) == 1000 * sum(fp8.values())
    bf = dict(p.kernel_bytes(3, "bf16"))
    assert len(bf) == 4 and bf["SiLU-and-mul"] == 3 * 6144 * 6
    with pytest.raises(ValueError, match="fp8 or bf16"):
        p.kernel_bytes(1, "fp16")


def test_floor_share_rescales_one_class_and_keeps_the_rest():
    p = _probe()
    shares = p.parse_shares(["gemm=60", "attention=20", "elementwise=20"])
    assert p.floor_share(shares, 1.0) == pytest.approx(20.0)
    # halving 20 of 100: 10 of 90
    assert p.floor_share(shares, 0.5) == pytest.approx(100 * 10 / 90)
    assert p.floor_share(shares, 0.0) == 0.0
    with pytest.raises(ValueError, match="no 'elementwise' class"):
        p.floor_share({"gemm": 1.0}, 1.0)
    for bad in ("gemm", "=3", "gemm=x"):
        with pytest.raises(ValueError, match="CLASS=PERCENT"):
            p.parse_shares([bad])


def _run(*args: str):
    return run_probe("elementwise_floor", *args, timeout=300, cpu=True)


def test_probe_runs_both_forms_on_cpu_and_refuses_shares_without_the_class():
    out = _run("--dtype", "fp8", "bf16", "--shares", "gemm=55", "elementwise=20", "other=25")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    kernels = [ln for ln in lines if " TB/s floor " in ln]
    assert len(kernels) == 5 + 4  # every kernel of both forms timed
    assert sum(" GEMM " in ln for ln in lines) == 8
    layer = [ln for ln in lines if " layer: element-wise " in ln]
    assert [ln.split()[0] for ln in layer] == ["fp8", "bf16"]
    assert sum("with --shares" in ln for ln in lines) == 2
    bad = _run("--shares", "gemm=55")
    assert bad.returncode == 2 and "no 'elementwise' class" in bad.stderr
