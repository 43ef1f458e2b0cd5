"""Triton kernel: (residual add +) RMSNorm, optionally quantized per token to e4m3."""

from __future__ import annotations

import triton
import triton.language as tl

from flashrec.kernels.tl.common import quant_store, to_act


@triton.jit
def rms_norm_kernel(
    x_ptr, stride_x, res_ptr, stride_res, w_ptr, y_ptr, res_out_ptr, scale_ptr,
    H, eps,
    BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, QUANT: tl.constexpr,
    EMULATE: tl.constexpr,
):  # fmt: skip
    """One program per row (BLOCK >= H). ``y``, ``res_out`` and ``scale`` are contiguous.

    Rounds to the activation dtype where ``rms_norm_ref`` does: after the residual add, after
    the normalisation, after the weight multiply.
    """
    DT: tl.constexpr = x_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    s = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + offs, mask=mask, other=0.0).to(tl.float32)
        s = to_act(s + r, DT, EMULATE)
        tl.store(res_out_ptr + row * H + offs, s.to(DT), mask=mask)
    var = tl.math.div_rn(tl.sum(s * s, axis=0), H * 1.0)
    rstd = tl.math.div_rn(1.0, tl.sqrt_rn(var + eps))
    normed = to_act(s * rstd, DT, EMULATE)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = to_act(normed * w, DT, EMULATE)
    if QUANT:
        quant_store(y, mask, y_ptr + row * H + offs, scale_ptr + row, EMULATE)
    else:
        tl.store(y_ptr + row * H + offs, y.to(DT), mask=mask)
