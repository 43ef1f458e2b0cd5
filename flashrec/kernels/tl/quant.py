"""Triton kernels: dynamic per-token FP8 quantization of a [M, K] activation, and the plain
elementwise e4m3 conversion the kernels share (``to_fp8``), exposed for checks."""

from __future__ import annotations

import triton
import triton.language as tl

from flashrec.kernels.tl.common import quant_store, to_fp8


@triton.jit
def per_token_quant_kernel(
    x_ptr, stride_x, out_ptr, scale_ptr, K,
    BLOCK: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    """One program per row: absmax over the row, then e4m3 codes into ``out`` (contiguous)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    quant_store(x, mask, out_ptr + row * K + offs, scale_ptr + row, EMULATE)


@triton.jit
def to_fp8_kernel(x_ptr, out_ptr, n, EMULATE: tl.constexpr, HW: tl.constexpr, BLOCK: tl.constexpr):
    """``out = to_fp8(x)`` elementwise over ``n`` fp32 values (contiguous)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, to_fp8(x, EMULATE, HW), mask=mask)
