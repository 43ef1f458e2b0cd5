"""Triton kernel: dynamic per-token FP8 quantization of a [M, K] activation."""

from __future__ import annotations

import triton
import triton.language as tl

from flashrec.kernels.tl.common import quant_store


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
