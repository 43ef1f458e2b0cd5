"""The batch-invariant GEMMs of ``--deterministic``: every row of ``x @ w.T`` is bit for bit the
same whatever rows share the call (how many, which, where the row sits), and the product is
the product (close to the library GEMM)."""

from __future__ import annotations

import pytest
import torch

from flashrec.kernels import fp8 as fp8k
from flashrec.kernels import invariant

# (start, rows): slices of a 300-row batch, from one row (a gemv in a library GEMM) to most
SLICES = [(0, 1), (5, 1), (0, 3), (7, 5), (0, 16), (3, 17), (40, 64), (1, 250), (0, 300)]


def _rows_invariant(fn, x: torch.Tensor) -> None:
    full = fn(x)
    for start, rows in SLICES:
        part = fn(x[start : start + rows])
        assert torch.equal(part, full[start : start + rows]), (start, rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k,n", [(64, 192), (128, 455), (256, 1024)])
def test_chunked_rows_do_not_depend_on_the_batch(dtype, k, n) -> None:
    g = torch.Generator().manual_seed(k + n)
    w = torch.randn(n, k, generator=g).to(dtype)
    x = torch.randn(300, k, generator=g).to(dtype)
    _rows_invariant(lambda t: invariant.matmul_nt(t, w), x)
    ref = x.float() @ w.float().t()
    torch.testing.assert_close(invariant.matmul_nt(x, w).float(), ref, rtol=2e-2, atol=2e-2)


def test_the_library_gemm_alone_is_not_row_invariant() -> None:
    """Why the chunking exists: a few-row library GEMM takes another path than a wide one,
    so one row's bits change with the batch (if this starts to pass, the CPU BLAS changed and
    the chunked path needs a new look, not a removal)."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(1024, 256, generator=g), torch.randn(300, 256, generator=g)
    full = torch.nn.functional.linear(x, w)
    assert any(not torch.equal(torch.nn.functional.linear(x[:m], w), full[:m]) for m in (1, 2, 3))


def test_linear_and_fp8_linear_match_their_references() -> None:
    g = torch.Generator().manual_seed(1)
    w, x, b = (torch.randn(96, 64, generator=g), torch.randn(40, 64, generator=g),
               torch.randn(96, generator=g))  # fmt: skip
    torch.testing.assert_close(invariant.linear(x, w, b), torch.nn.functional.linear(x, w, b))
    w8, ws = fp8k.quantize_weight_per_channel(w)
    x8, xs = fp8k.per_token_quant_fp8_ref(x)
    fp8_linear = invariant.fp8_linear_batch_invariant
    got = fp8_linear(x8, xs, w8, ws, b, torch.float32)
    torch.testing.assert_close(got, fp8k.fp8_linear_ref(x8, xs, w8, ws, b, torch.float32))
    for start, rows in SLICES[:7]:
        sl = slice(start, start + rows)
        assert torch.equal(fp8_linear(x8[sl], xs[sl], w8, ws, b, torch.float32), got[sl])
    out = torch.empty_like(got)
    assert fp8_linear(x8, xs, w8, ws, b, torch.float32, out=out) is out
    assert torch.equal(out, got)


def test_switch_is_scoped_and_thread_local() -> None:
    import threading

    assert not invariant.active()
    seen = []
    with invariant.batch_invariant():
        assert invariant.active()
        t = threading.Thread(target=lambda: seen.append(invariant.active()))
        t.start()
        t.join()
        with invariant.batch_invariant(False):
            assert not invariant.active()
        assert invariant.active()
    assert not invariant.active() and seen == [False]


def test_triton_kernel_rows_invariant(triton_backend) -> None:
    """The Triton kernel itself (compiled on the GPU, or in the interpreter): fp32 / bf16."""
    dev = triton_backend.device
    dtypes = [torch.float32] if dev == "cpu" else [torch.float32, torch.bfloat16]
    k, n = (40, 70) if dev == "cpu" else (2048, 4096)
    for dtype in dtypes:
        g = torch.Generator().manual_seed(3)
        w = torch.randn(n, k, generator=g).to(dtype).to(dev)
        x = torch.randn(300, k, generator=g).to(dtype).to(dev)
        b = torch.randn(n, generator=g).to(dtype).to(dev)

        def gemm(t, w=w, b=b, dtype=dtype):
            return invariant._triton(t, w, b, None, None, dtype)  # noqa: SLF001

        _rows_invariant(gemm, x)
        ref = torch.nn.functional.linear(x.float(), w.float(), b.float())
        torch.testing.assert_close(gemm(x).float(), ref, rtol=2e-2, atol=5e-2 * k**0.5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("k,n", [(2048, 4096), (2048, 12288), (6144, 2048)])
def test_fp8_triton_rows_invariant_and_close_to_scaled_mm(k, n) -> None:
    if not fp8k.fp8_gemm_supported(0):
        pytest.skip("needs an FP8 GPU (sm_89+)")
    g = torch.Generator().manual_seed(4)
    w8, ws = fp8k.quantize_weight_per_channel(torch.randn(n, k, generator=g) / k**0.5)
    w8, ws = w8.cuda(), ws.cuda()
    x8, xs = fp8k.per_token_quant_fp8(torch.randn(1600, k, generator=g).cuda())
    bias = torch.randn(n, generator=g).to(torch.bfloat16).cuda()

    full = invariant.fp8_linear_batch_invariant(x8, xs, w8, ws, bias)
    for start, rows in SLICES + [(100, 1500)]:
        sl = slice(start, start + rows)
        part = invariant.fp8_linear_batch_invariant(x8[sl], xs[sl], w8, ws, bias)
        assert torch.equal(part, full[sl]), (start, rows)
    lib = fp8k.fp8_linear_scaled_mm(x8, xs, w8, ws, bias)
    torch.testing.assert_close(full.float(), lib.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_dispatch_takes_the_triton_kernel() -> None:
    """On CUDA the public functions run the fixed-tile kernel: equal to calling it directly
    (the chunked fallback would differ in the low bits at this size)."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(4096, 2048, generator=g).to(torch.bfloat16).cuda()
    x = torch.randn(777, 2048, generator=g).to(torch.bfloat16).cuda()
    direct = invariant._triton(x, w, None, None, None, torch.bfloat16)  # noqa: SLF001
    assert torch.equal(invariant.matmul_nt(x, w), direct)
    assert torch.equal(invariant.linear(x, w, None), direct)
