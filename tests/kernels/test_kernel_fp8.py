"""FP8 quantization and FP8 linear: references against plain math; Triton / _scaled_mm vs ref."""

from __future__ import annotations

import pytest
import torch

from flashrec.kernels.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    SCALE_FLOOR,
    dequantize,
    fp8_linear,
    fp8_linear_ref,
    fp8_linear_scaled_mm,
    per_token_quant_fp8,
    per_token_quant_fp8_ref,
    per_token_quant_fp8_triton,
    quantize_weight_per_channel,
)

HAS_CUDA = torch.cuda.is_available()


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_quant_round_trip(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    w = (torch.randn(64, 96) * torch.rand(64, 1) * 3).to(dtype)
    w_fp8, scale = quantize_weight_per_channel(w)
    assert w_fp8.dtype == FP8_DTYPE and w_fp8.shape == (64, 96) and w_fp8.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == (64, 1)
    wf = w.float()
    torch.testing.assert_close(scale, wf.abs().amax(1, keepdim=True) / FP8_MAX)
    # The row max maps to +-448 exactly; every value is within half an e4m3 step
    # (2**-4 relative for normals, 2**-10 * scale for subnormals).
    assert (w_fp8.float().abs().amax(1) == FP8_MAX).all()
    err = (dequantize(w_fp8, scale) - wf).abs()
    assert (err <= wf.abs() * 2**-4 + scale * 2**-10 + 1e-12).all()


def test_zero_rows_get_floor_scale() -> None:
    x = torch.randn(4, 32)
    x[1] = 0
    for codes, scale in (quantize_weight_per_channel(x), per_token_quant_fp8_ref(x)):
        assert scale[1].item() == pytest.approx(SCALE_FLOOR)
        assert (codes[1].float() == 0).all()
        assert torch.isfinite(codes.float()).all() and torch.isfinite(scale).all()


def test_per_token_quant_saturates_not_nan() -> None:
    x = torch.tensor([[1.0, -2.0, 3.0, 1e30]], dtype=torch.float32)
    codes, scale = per_token_quant_fp8(x)
    assert torch.isfinite(codes.float()).all()
    assert codes.float().abs().max().item() == FP8_MAX


def test_dequantize_dtype() -> None:
    codes, scale = quantize_weight_per_channel(torch.randn(16, 16))
    assert dequantize(codes, scale, torch.bfloat16).dtype == torch.bfloat16


def test_fp8_linear_ref_matches_float_matmul() -> None:
    torch.manual_seed(0)
    x = torch.randn(33, 256, dtype=torch.bfloat16)
    w = torch.randn(128, 256, dtype=torch.bfloat16) * 0.05
    bias = torch.randn(128, dtype=torch.bfloat16)
    x_fp8, x_scale = per_token_quant_fp8(x)
    w_fp8, w_scale = quantize_weight_per_channel(w)
    out = fp8_linear(x_fp8, x_scale, w_fp8, w_scale, bias=bias)
    assert out.shape == (33, 128) and out.dtype == torch.bfloat16
    # Exactly the dequantized product (float32 accumulate, then bf16, then + bias).
    exact = (dequantize(x_fp8, x_scale) @ dequantize(w_fp8, w_scale).t()).bfloat16() + bias
    torch.testing.assert_close(out, exact, rtol=0, atol=0)
    # Close to the unquantized layer: e4m3 keeps ~3 mantissa bits on each operand.
    full = (x.float() @ w.float().t()) + bias.float()
    assert _rel_err(out, full) < 0.05
    out32 = fp8_linear_ref(x_fp8, x_scale, w_fp8, w_scale, out_dtype=torch.float32)
    assert out32.dtype == torch.float32


def test_scaled_mm_rejects_unaligned_shapes() -> None:
    x_fp8, x_scale = per_token_quant_fp8(torch.randn(4, 24))
    w_fp8, w_scale = quantize_weight_per_channel(torch.randn(32, 24))
    with pytest.raises(ValueError, match="multiples of 16"):
        fp8_linear_scaled_mm(x_fp8, x_scale, w_fp8, w_scale)


@pytest.mark.parametrize("m,k", [(1, 64), (7, 100), (33, 256), (300, 2048)])
def test_per_token_quant_triton_matches_ref(triton_backend, assert_fp8_close, m, k) -> None:
    if triton_backend.device == "cpu" and m * k > 100_000:
        pytest.skip("large shape: GPU only")
    torch.manual_seed(m)
    x = (torch.randn(m, k + 8) * 4).to(torch.bfloat16).to(triton_backend.device)[:, :k]
    # Pure elementwise + max: no rounding can differ.
    assert_fp8_close(per_token_quant_fp8_triton(x), per_token_quant_fp8_ref(x), exact=True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 7, 16, 33, 300])
@pytest.mark.parametrize("n,k", [(256, 128), (4096, 2048)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp8_linear_scaled_mm_matches_ref(m: int, n: int, k: int, with_bias: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if with_bias else None
    x_fp8, x_scale = per_token_quant_fp8(x)
    w_fp8, w_scale = quantize_weight_per_channel(w)
    out = fp8_linear(x_fp8, x_scale, w_fp8, w_scale, bias=bias)
    ref = fp8_linear_ref(x_fp8, x_scale, w_fp8, w_scale, bias=bias)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert _rel_err(out, ref) < 5e-3
    # Through a non-contiguous activation (a column slice) too.
    wide = torch.zeros(m, 2 * k, device="cuda", dtype=FP8_DTYPE)
    wide[:, :k] = x_fp8
    torch.testing.assert_close(fp8_linear(wide[:, :k], x_scale, w_fp8, w_scale, bias=bias), out)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_fp8_linear_other_out_dtypes(out_dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x_fp8, x_scale = per_token_quant_fp8(torch.randn(5, 128, device="cuda"))
    w_fp8, w_scale = quantize_weight_per_channel(torch.randn(64, 128, device="cuda"))
    out = fp8_linear(x_fp8, x_scale, w_fp8, w_scale, out_dtype=out_dtype)
    ref = fp8_linear_ref(x_fp8, x_scale, w_fp8, w_scale, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    assert _rel_err(out, ref) < 5e-3


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_fp8_linear_is_graph_capturable() -> None:
    x_fp8, x_scale = per_token_quant_fp8(torch.randn(8, 128, device="cuda"))
    w_fp8, w_scale = quantize_weight_per_channel(torch.randn(64, 128, device="cuda"))
    expected = fp8_linear(x_fp8, x_scale, w_fp8, w_scale)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_linear(x_fp8, x_scale, w_fp8, w_scale)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("hw", [False, True])
def test_to_fp8_rounds_like_torch_bit_for_bit(triton_backend, hw: bool) -> None:
    """The kernels' shared e4m3 conversion (``to_fp8``) gives PyTorch's codes on every probe
    value: ties, their neighbours, subnormals, saturation, and -0 for negative values that round
    to zero (an emulation that negates with ``-y`` gives +0: Triton lowers it to ``0 - y``).
    ``hw`` (GPU only) takes the hardware conversion instead of the emulation."""
    if hw and triton_backend.device == "cpu":
        pytest.skip("the hardware conversion needs a GPU")
    from flashrec.kernels.fp8 import e4m3_probe_values, to_fp8_triton

    x = e4m3_probe_values(200_000 if triton_backend.device == "cuda" else 4_000, seed=1)
    assert (x.view(torch.int32) < 0).any() and (x.abs() < 2**-10).any()
    want = x.to(FP8_DTYPE).view(torch.uint8)
    got = to_fp8_triton(x.to(triton_backend.device), emulate=True, hw=hw)
    got = got.view(torch.uint8).cpu()
    assert (want == 0x80).any()  # some values round to -0
    assert torch.equal(got, want)


DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")]
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_out_receives_the_result(device: str, fp8: bool, with_bias: bool) -> None:
    """``Linear(x, out=)``: the same values as without ``out``, written into ``out`` (a row
    slice of a larger buffer, as the piecewise graphs pass their static QKV rows)."""
    from flashrec.layers.linear import Linear

    torch.manual_seed(4)
    lin = Linear(128, 64, bias=with_bias)
    w = torch.randn(64, 128) * 0.05
    lin.load(w, quantize_fp8=fp8, dtype=torch.bfloat16)
    if with_bias:
        lin.bias = torch.nn.Parameter(torch.randn(64).to(torch.bfloat16), requires_grad=False)
    lin = lin.to(device)
    x = torch.randn(9, 128, dtype=torch.bfloat16, device=device)
    want = lin(x)
    buf = torch.full((16, 64), float("nan"), dtype=torch.bfloat16, device=device)
    got = lin(x, out=buf[:9])
    assert got.data_ptr() == buf.data_ptr()
    assert torch.equal(buf[:9], want)
    assert torch.isnan(buf[9:].float()).all()  # nothing past the rows asked for
    if fp8:
        x8, s = per_token_quant_fp8(x)
        buf.fill_(float("nan"))
        lin.forward_fp8(x8, s, torch.bfloat16, out=buf[:9])
        assert torch.equal(buf[:9], lin.forward_fp8(x8, s, torch.bfloat16))
