"""SiLU-and-multiply (+ FP8 quant): ref vs HF's act_fn(gate) * up; Triton vs ref."""

from __future__ import annotations

import pytest
import torch
from transformers.activations import ACT2FN

from flashrec.kernels.fp8 import per_token_quant_fp8_ref
from flashrec.kernels.silu_fp8 import (
    silu_mul,
    silu_mul_quant_fp8,
    silu_mul_quant_fp8_ref,
    silu_mul_quant_fp8_triton,
    silu_mul_ref,
    silu_mul_triton,
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_ref_matches_hf(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    gate_up = (torch.randn(7, 2 * 96) * 3).to(dtype)
    gate, up = gate_up[:, :96], gate_up[:, 96:]
    expected = ACT2FN["silu"](gate) * up
    torch.testing.assert_close(silu_mul_ref(gate_up), expected, rtol=0, atol=0)
    torch.testing.assert_close(silu_mul(gate_up), expected, rtol=0, atol=0)


def test_quant_variant_is_silu_then_quant() -> None:
    gate_up = torch.randn(3, 2, 64, dtype=torch.bfloat16)  # leading dims are kept
    y_fp8, scale = silu_mul_quant_fp8(gate_up)
    assert y_fp8.shape == (3, 2, 32) and scale.shape == (3, 2, 1)
    q_ref, s_ref = per_token_quant_fp8_ref(silu_mul_ref(gate_up).reshape(6, 32))
    torch.testing.assert_close(y_fp8.reshape(6, 32).float(), q_ref.float(), rtol=0, atol=0)
    torch.testing.assert_close(scale.reshape(6, 1), s_ref, rtol=0, atol=0)


# (M, I): up to 16384 one tile (one pass); I = 20000 takes two tiles (two passes when quantizing);
# 100 is not a power of two.
SHAPES = [(1, 64), (7, 100), (3, 5000), (17, 6144), (300, 3072), (2, 20000)]


@pytest.mark.parametrize("m,inter", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_matches_ref(
    triton_backend, assert_act_close, assert_fp8_close, m, inter, dtype
) -> None:
    if triton_backend.device == "cpu" and m * inter > 30_000:
        pytest.skip("large shape: GPU only")
    dev = triton_backend.device
    torch.manual_seed(m + inter)
    gate_up = (torch.randn(m, 2 * inter + 8) * 3).to(dtype).to(dev)[:, : 2 * inter]
    frac = triton_backend.max_frac
    assert_act_close(silu_mul_triton(gate_up), silu_mul_ref(gate_up), max_frac=frac)
    assert_fp8_close(
        silu_mul_quant_fp8_triton(gate_up), silu_mul_quant_fp8_ref(gate_up), max_frac=frac
    )


@pytest.mark.parametrize("num_warps", [1, 4, 8, 16, 32])
def test_quant_launch_warps_compute_the_reference(triton_backend, assert_fp8_close, num_warps):
    """silu_mul -> e4m3's warps are a launch setting (``bench_kernels.py --silu-sweep``): at
    OneRec-1.7B's 6,144-wide intermediate every setting matches the reference."""
    dev = triton_backend.device
    m = 5 if dev == "cpu" else 300
    torch.manual_seed(11)
    gate_up = (torch.randn(m, 2 * 6144) * 3).to(torch.bfloat16).to(dev)
    assert_fp8_close(
        silu_mul_quant_fp8_triton(gate_up, num_warps=num_warps),
        silu_mul_quant_fp8_ref(gate_up),
        max_frac=triton_backend.max_frac,
    )


@pytest.mark.parametrize("block", [1024, 2048, 8192])
def test_quant_column_tiles_compute_the_reference(triton_backend, assert_fp8_close, block):
    """The column tile is a launch setting too: 6,144 columns as one padded tile of 8,192, or
    as 3 or 6 exact tiles (two passes over the row: absmax, then codes). Each matches the
    reference, and a tile that is not a power of two is refused."""
    dev = triton_backend.device
    m = 5 if dev == "cpu" else 300
    torch.manual_seed(12)
    gate_up = (torch.randn(m, 2 * 6144) * 3).to(torch.bfloat16).to(dev)
    assert_fp8_close(
        silu_mul_quant_fp8_triton(gate_up, block=block),
        silu_mul_quant_fp8_ref(gate_up),
        max_frac=triton_backend.max_frac,
    )
    with pytest.raises(ValueError, match="power of two"):
        silu_mul_quant_fp8_triton(gate_up, block=3 * 1024)
