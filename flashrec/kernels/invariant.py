"""Batch-invariant GEMMs (``--deterministic``): a row of ``x @ w.T`` comes out bit for bit the
same whatever other rows share the call, how many there are and where the row sits.

Library GEMMs pick their kernel (tile shape, split-K, the gemv path of a few rows) from the
shape, so a beam's logits change with the batch it decodes in. Inside :func:`batch_invariant`
the linear layers and the LM head go through :func:`linear`, :func:`fp8_linear_batch_invariant`
and :func:`matmul_nt` instead:

- CUDA (Triton): one kernel binary per weight shape (``tl/matmul.py``: a fixed tile, one
  sequential K loop, no split-K), whatever M is; FP8 W8A8 applies both row scales to the fp32
  accumulator in the same kernel;
- elsewhere: the rows are cut into chunks of exactly ``CPU_ROWS`` rows (the last one padded),
  each one library GEMM of the same shape on the same buffers.

The switch is thread-local and read when a layer runs (or is captured into a CUDA graph).
"""

from __future__ import annotations

import contextlib
import threading

import torch

from flashrec.kernels.backend import use_triton
from flashrec.kernels.fp8 import fp8_gemm_supported, fp8_linear_ref

__all__ = [
    "CPU_ROWS",
    "active",
    "batch_invariant",
    "fp8_linear_batch_invariant",
    "linear",
    "matmul_nt",
]

CPU_ROWS = 16
"""Rows per library GEMM on the chunked path: every call has this shape (a multiple of the
row tile of common CPU GEMM kernels, above the few-row gemv paths)."""

_state = threading.local()


def active() -> bool:
    """Whether GEMMs on this thread run batch-invariant now."""
    return getattr(_state, "on", False)


@contextlib.contextmanager
def batch_invariant(on: bool = True):
    """GEMMs on this thread run batch-invariant inside (``on``), as before after."""
    old = active()
    _state.on = on
    try:
        yield
    finally:
        _state.on = old


def _tiles(dtype: torch.dtype, n: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) from the operand dtype and the weight's N only:
    never from M, so one compiled kernel serves every batch."""
    if dtype == torch.float8_e4m3fn:
        return 128, 128, 128, 8, 3
    if dtype == torch.float32:
        return 64, 64, 32, 4, 3
    return 128, 128 if n >= 4096 else 64, 64, 8 if n >= 4096 else 4, 3


def _triton(x, w, bias, x_scale, w_scale, out_dtype) -> torch.Tensor:
    from flashrec.kernels.gemm_choice import triton_linear

    tile = _tiles(w.dtype, w.shape[0])
    return triton_linear(x, w, tile, x_scale, w_scale, out_dtype, bias=bias)


def _chunked(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` as library GEMMs of exactly ``CPU_ROWS`` rows each, every one reading and
    writing the same two fresh buffers (a CPU BLAS may take another path for another
    alignment or stride)."""
    m, k = x.shape
    dtype = torch.result_type(x, w)
    out = torch.empty((m, w.shape[0]), dtype=dtype, device=x.device)
    buf = torch.zeros((CPU_ROWS, k), dtype=x.dtype, device=x.device)
    res = torch.empty((CPU_ROWS, w.shape[0]), dtype=dtype, device=x.device)
    wt = w.t()
    for a in range(0, m, CPU_ROWS):
        b = min(a + CPU_ROWS, m)
        buf[: b - a] = x[a:b]
        if b - a < CPU_ROWS:
            buf[b - a :] = 0
        torch.mm(buf, wt, out=res)
        out[a:b] = res[: b - a]
    return out


def matmul_nt(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ w [N, K].T`` -> ``[M, N]`` in ``x``'s dtype, batch-invariant."""
    return linear(x, w, None)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` batch-invariant (the bias added after the product, in the output dtype)."""
    if use_triton(x, w) and x.dtype == w.dtype:
        return _triton(x, w, bias, None, None, x.dtype)
    out = _chunked(x, w)
    return out if bias is None else out + bias.to(out.dtype)


def fp8_linear_batch_invariant(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`flashrec.kernels.fp8.fp8_linear` (W8A8, per-token x per-channel scales) with a
    fixed reduction order per row: the Triton kernel on FP8-capable GPUs, else the float32
    reference product, chunked. ``out``: the [M, N] result is copied there."""
    if use_triton(x_fp8, w_fp8) and fp8_gemm_supported(x_fp8.device.index):
        res = _triton(x_fp8, w_fp8, bias, x_scale.float(), w_scale.float(), out_dtype)
    else:
        res = fp8_linear_ref(x_fp8, x_scale, w_fp8, w_scale, bias, out_dtype, matmul_nt=_chunked)
    return res if out is None else out.copy_(res)
