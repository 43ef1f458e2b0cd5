"""The tuned decode GEMM's Triton path (``kernels/gemm_choice.py``): ``triton_linear`` at every
tile against the library's product, and a linear layer routed through a chosen tile (BF16 and
FP8 W8A8), on rows that fill no tile exactly."""

from __future__ import annotations

import pytest
import torch

from flashrec.kernels import fp8 as fp8k
from flashrec.kernels import gemm_choice
from flashrec.layers.linear import Linear

M, N, K = 70, 192, 256  # 70 rows: a partial tile in every BLOCK_M


@pytest.mark.parametrize("tile", gemm_choice.TILES, ids=lambda t: "x".join(map(str, t[:3])))
def test_triton_linear_equals_the_product_at_every_tile(triton_backend, tile) -> None:
    dev = triton_backend.device
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(M, K, device=dev, dtype=dtype)
    w = torch.randn(N, K, device=dev, dtype=dtype) * 0.05
    ref = (x.float() @ w.float().t()).to(dtype)
    out = torch.empty(M, N, device=dev, dtype=dtype)
    got = gemm_choice.triton_linear(x, w, tile, out=out)
    assert got is out
    err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert err < (1e-5 if dtype == torch.float32 else 1e-2), err
    lin = Linear(K, N).to(dev)
    lin.load(w)
    gemm_choice._table[(M, N, K, dtype)] = tile
    try:
        routed = lin(x)
    finally:
        gemm_choice.clear()
    assert torch.equal(routed, got)  # the layer took the chosen tile


@pytest.mark.parametrize("tile", gemm_choice.TILES, ids=lambda t: "x".join(map(str, t[:3])))
def test_an_fp8_layer_routed_to_a_tile_matches_the_reference(triton_backend, tile) -> None:
    dev = triton_backend.device
    torch.manual_seed(1)
    w = torch.randn(N, K) * 0.05
    lin = Linear(K, N)
    lin.load(w, quantize_fp8=True)
    lin = lin.to(dev)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    xq, xs = fp8k.per_token_quant_fp8_ref(x)
    ref = fp8k.fp8_linear_ref(xq, xs, lin.weight, lin.weight_scale, None, torch.bfloat16)
    gemm_choice._table[(M, N, K, fp8k.FP8_DTYPE)] = tile
    try:
        got = lin.forward_fp8(xq, xs, torch.bfloat16)
    finally:
        gemm_choice.clear()
    err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert err < 1e-2, err  # the BF16 output's rounding
