"""RMSNorm (+ residual) and its fused FP8 variant: ref vs HF Qwen3RMSNorm; Triton vs ref."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from flashrec.kernels.fp8 import per_token_quant_fp8_ref
from flashrec.kernels.rms_fp8 import (
    rms_norm,
    rms_norm_quant_fp8,
    rms_norm_quant_fp8_ref,
    rms_norm_quant_fp8_triton,
    rms_norm_ref,
    rms_norm_triton,
)

EPS = 1e-6


def _hf_norm(h: int, weight: torch.Tensor) -> Qwen3RMSNorm:
    norm = Qwen3RMSNorm(h, eps=EPS).to(weight.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_ref_matches_hf(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = (torch.randn(9, 192) * 3).to(dtype)
    res = torch.randn(9, 192).to(dtype)
    weight = (1 + 0.2 * torch.randn(192)).to(dtype)
    hf = _hf_norm(192, weight)
    with torch.no_grad():
        y, res_out = rms_norm_ref(x, weight, EPS)
        assert res_out is x
        torch.testing.assert_close(y, hf(x), rtol=0, atol=0)
        # HF decoder layer: hidden = residual + hidden (in the activation dtype), then norm.
        summed = res + x
        y, res_out = rms_norm_ref(x, weight, EPS, residual=res)
        torch.testing.assert_close(res_out, summed, rtol=0, atol=0)
        torch.testing.assert_close(y, hf(summed), rtol=0, atol=0)


def test_quant_variant_is_norm_then_quant() -> None:
    torch.manual_seed(1)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    res = torch.randn(5, 64, dtype=torch.bfloat16)
    weight = torch.rand(64, dtype=torch.bfloat16) + 0.5
    y_fp8, scale, res_out = rms_norm_quant_fp8(x, weight, EPS, residual=res)
    y, res_ref = rms_norm(x, weight, EPS, residual=res)
    q_ref, s_ref = per_token_quant_fp8_ref(y)
    assert y_fp8.shape == (5, 64) and scale.shape == (5, 1)
    torch.testing.assert_close(y_fp8.float(), q_ref.float(), rtol=0, atol=0)
    torch.testing.assert_close(scale, s_ref, rtol=0, atol=0)
    torch.testing.assert_close(res_out, res_ref, rtol=0, atol=0)


def test_leading_dims() -> None:
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    y, _ = rms_norm(x, torch.ones(32, dtype=torch.bfloat16), EPS)
    assert y.shape == (2, 3, 32)


@pytest.mark.parametrize("alias", [False, True])
def test_res_out_receives_the_new_residual(alias: bool) -> None:
    """``res_out``: the new residual lands there, also when it is the residual itself (the
    piecewise graphs update their static residual in place); y is unchanged."""
    torch.manual_seed(2)
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    res = torch.randn(6, 64, dtype=torch.bfloat16)
    weight = torch.rand(64, dtype=torch.bfloat16) + 0.5
    y_ref, res_ref = rms_norm_ref(x, weight, EPS, res.clone())
    q_ref, s_ref, _ = rms_norm_quant_fp8_ref(x, weight, EPS, res.clone())
    for quant in (False, True):
        r = res.clone()
        dst = r if alias else torch.full_like(r, float("nan"))
        if quant:
            q, s, got = rms_norm_quant_fp8(x, weight, EPS, r, dst)
            assert torch.equal(q.float(), q_ref.float()) and torch.equal(s, s_ref)
        else:
            y, got = rms_norm(x, weight, EPS, r, dst)
            assert torch.equal(y, y_ref)
        assert got.data_ptr() == dst.data_ptr()
        assert torch.equal(dst, res_ref)
    with pytest.raises(ValueError, match="contiguous"):
        rms_norm(x, weight, EPS, res, torch.empty(6, 128, dtype=torch.bfloat16)[:, :64])


def test_layer_norm_res_out_in_place() -> None:
    """RMSNorm's unfused path (CPU) writes the residual sum in place too."""
    from flashrec.layers.norm import RMSNorm

    torch.manual_seed(3)
    norm = RMSNorm(32, EPS)
    x, res = torch.randn(4, 32), torch.randn(4, 32)
    y_ref, res_ref = norm(x, res.clone())
    r = res.clone()
    y, got = norm(x, r, res_out=r)
    assert got.data_ptr() == r.data_ptr()
    assert torch.equal(y, y_ref) and torch.equal(r, res_ref)


SHAPES = [(1, 64), (7, 100), (16, 256), (33, 2048), (300, 4096)]


@pytest.mark.parametrize("m,h", SHAPES)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_matches_ref(
    triton_backend, assert_act_close, assert_fp8_close, m, h, with_residual, dtype
) -> None:
    if triton_backend.device == "cpu" and m * h > 100_000:
        pytest.skip("large shape: GPU only")
    dev = triton_backend.device
    torch.manual_seed(m + h)
    x = (torch.randn(m, h + 16) * 2).to(dtype).to(dev)[:, :h]  # row stride > width
    res = torch.randn(m, h).to(dtype).to(dev) if with_residual else None
    weight = (1 + 0.2 * torch.randn(h)).to(dtype).to(dev)
    frac = triton_backend.max_frac

    y, res_out = rms_norm_triton(x, weight, EPS, res)
    y_ref, res_ref = rms_norm_ref(x, weight, EPS, res)
    assert_act_close(y, y_ref, max_frac=frac)
    assert_act_close(res_out, res_ref, exact=True)  # a single rounded add: always exact
    if res is None:
        assert res_out is x

    q, s, res_out = rms_norm_quant_fp8_triton(x, weight, EPS, res)
    q_ref, s_ref, _ = rms_norm_quant_fp8_ref(x, weight, EPS, res)
    assert_fp8_close((q, s), (q_ref, s_ref), max_frac=frac)
    assert_act_close(res_out, res_ref, exact=True)
    if res is not None:  # the new residual written over the old one, in place
        for quant in (False, True):
            r = res.clone()
            launch = rms_norm_quant_fp8_triton if quant else rms_norm_triton
            got = launch(x, weight, EPS, r, r)[-1]
            assert got.data_ptr() == r.data_ptr()
            assert_act_close(r, res_ref, exact=True)
