"""Triton kernel: silu(gate) * up over a fused [M, 2I] gate/up row, optionally to e4m3."""

from __future__ import annotations

import triton
import triton.language as tl

from flashrec.kernels.tl.common import INV_FP8_MAX, SCALE_FLOOR, to_act, to_fp8


@triton.jit
def _silu_mul_tile(row_ptr, offs, mask, inter, DT: tl.constexpr, EMULATE: tl.constexpr):
    """``dt(dt(silu(gate)) * up)`` for one column tile, as fp32 (0 on masked lanes)."""
    gate = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row_ptr + inter + offs, mask=mask, other=0.0).to(tl.float32)
    act = to_act(gate / (1.0 + tl.exp(-gate)), DT, EMULATE)
    return to_act(act * up, DT, EMULATE)


@triton.jit
def silu_mul_kernel(
    gu_ptr, stride_gu, y_ptr, scale_ptr, inter,
    BLOCK: tl.constexpr, NUM_TILES: tl.constexpr, QUANT: tl.constexpr,
    EMULATE: tl.constexpr,
):  # fmt: skip
    """One program per row, NUM_TILES = cdiv(inter, BLOCK); ``y`` [M, inter] and ``scale`` [M]
    are contiguous.

    Quantizing walks the row twice: the first pass finds the absmax, the second recomputes
    the (cheap) tile values and stores the codes; the second read of the row hits L2.
    """
    DT: tl.constexpr = gu_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    row_ptr = gu_ptr + row * stride_gu
    out_ptr = y_ptr + row * inter
    cols = tl.arange(0, BLOCK)
    if QUANT and NUM_TILES == 1:  # the whole row in registers: one read, one write
        mask = cols < inter
        y = _silu_mul_tile(row_ptr, cols, mask, inter, DT, EMULATE)
        scale = tl.maximum(tl.max(tl.abs(y), axis=0) * INV_FP8_MAX, SCALE_FLOOR)
        inv_scale = tl.math.div_rn(1.0, scale)
        tl.store(out_ptr + cols, to_fp8(y * inv_scale, EMULATE), mask=mask)
        tl.store(scale_ptr + row, scale)
    elif QUANT:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for tile in range(NUM_TILES):
            offs = tile * BLOCK + cols
            mask = offs < inter
            y = _silu_mul_tile(row_ptr, offs, mask, inter, DT, EMULATE)
            amax = tl.maximum(amax, tl.abs(y))
        scale = tl.maximum(tl.max(amax, axis=0) * INV_FP8_MAX, SCALE_FLOOR)
        inv_scale = tl.math.div_rn(1.0, scale)
        for tile in range(NUM_TILES):
            offs = tile * BLOCK + cols
            mask = offs < inter
            y = _silu_mul_tile(row_ptr, offs, mask, inter, DT, EMULATE)
            tl.store(out_ptr + offs, to_fp8(y * inv_scale, EMULATE), mask=mask)
        tl.store(scale_ptr + row, scale)
    else:
        for tile in range(NUM_TILES):
            offs = tile * BLOCK + cols
            mask = offs < inter
            y = _silu_mul_tile(row_ptr, offs, mask, inter, DT, EMULATE)
            tl.store(out_ptr + offs, y.to(DT), mask=mask)
