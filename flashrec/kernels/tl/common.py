"""Triton helpers shared by the kernels: rounding to the activation dtype and FP8 conversion.

NOTE (division): Triton's ``/`` on fp32 is the approximate ``div.full``; where the reference
divides (a mean, 1/sqrt, 1/scale) the kernels use ``tl.math.div_rn`` / ``tl.sqrt_rn``.

Every kernel computes in fp32 and rounds to the activation dtype exactly where the PyTorch
reference (and HF transformers) round, so that kernel and reference agree bit for bit up to
reduction order and fp32 ``exp``/``sqrt`` differences.

NOTE (interpreter): Triton's CPU interpreter truncates fp32 -> bf16 and mis-rounds
fp32 -> e4m3 (the mantissa carry is lost), so the ``EMULATE`` paths below round with integer
and fp32 arithmetic first; the final cast is then exact. On a GPU ``EMULATE`` is False and the
hardware conversions (round-to-nearest-even, satfinite for e4m3) are used.
"""

from __future__ import annotations

import triton
import triton.language as tl

FP8_MAX: tl.constexpr = tl.constexpr(448.0)
INV_FP8_MAX: tl.constexpr = tl.constexpr(1.0 / 448.0)
SCALE_FLOOR: tl.constexpr = tl.constexpr(1e-12)


@triton.jit
def rn_bf16(x):
    """fp32 ``x`` rounded to bf16 (to nearest, ties to even), returned as fp32: the hardware
    conversion (``cvt.rn.bf16x2.f32``, two values per instruction) in inline PTX, which the
    compiler cannot see through, so it can neither drop the round trip nor contract a product
    across it into an FMA (it does both to ``x.to(bf16).to(fp32)``, see ``to_act``). The same
    value as ``to_act(x, tl.bfloat16, True)`` in ~1.5 instructions instead of ~5 integer ones.
    GPU only: the CPU interpreter runs no PTX."""
    return tl.inline_asm_elementwise(
        asm="{ .reg .b32 t; cvt.rn.bf16x2.f32 t, $3, $2; shl.b32 $0, t, 16; "
        "and.b32 $1, t, 0xffff0000; }",
        constraints="=r,=r,f,f",
        args=[x],
        dtype=tl.uint32,
        is_pure=True,
        pack=2,
    ).to(tl.float32, bitcast=True)


@triton.jit
def to_act(x, DT: tl.constexpr, EMULATE: tl.constexpr, HW: tl.constexpr = False):
    """Round fp32 ``x`` to dtype ``DT`` (round-to-nearest-even) and return it as fp32. HW
    (GPU only): bf16 through ``rn_bf16``, the hardware rounding the compiler cannot fold, in
    place of the integer emulation; the same bits."""
    if DT == tl.float32:
        y = x
    elif DT == tl.bfloat16:
        if HW:
            y = rn_bf16(x)
        elif EMULATE:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            y = bits.to(tl.float32, bitcast=True)
        else:
            y = x.to(tl.bfloat16).to(tl.float32)
    else:
        y = x.to(DT).to(tl.float32)
    return y


@triton.jit
def to_fp8(x, EMULATE: tl.constexpr, HW: tl.constexpr = False):
    """Clamp fp32 ``x`` to +-448 and convert to float8_e4m3fn (round-to-nearest-even). HW (GPU
    only): the hardware conversion even where EMULATE is set (the same codes).

    NOTE (sign of zero): a negative value that rounds to zero must give -0 (code 0x80), as
    PyTorch's conversion and the hardware's do. The subnormal branch takes the sign from ``x``'s
    bits: Triton lowers ``-y`` to ``0 - y``, which is +0 (not -0) for y = +0."""
    x = tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)
    if EMULATE and not HW:
        # Normal e4m3 range: keep 3 of fp32's 23 mantissa bits, rounding half to even.
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000
        normal = rounded.to(tl.float32, bitcast=True)
        # Subnormal range (|x| < 2**-6): multiples of 2**-9; fp32 addition rounds to even.
        sub = (tl.abs(x) + 16384.0) - 16384.0
        sub = (sub.to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)
        x = tl.where(tl.abs(x) < 0.015625, sub, normal)
    return x.to(tl.float8e4nv)


@triton.jit
def quant_store(y, mask, out_ptrs, scale_ptr, EMULATE: tl.constexpr):
    """Quantize one token's values ``y`` (fp32, masked lanes ignored) to e4m3 with a per-token
    absmax scale; store the codes at ``out_ptrs`` and the fp32 scale at ``scale_ptr``."""
    amax = tl.max(tl.where(mask, tl.abs(y), 0.0), axis=0)
    scale = tl.maximum(amax * INV_FP8_MAX, SCALE_FLOOR)
    tl.store(out_ptrs, to_fp8(y * tl.math.div_rn(1.0, scale), EMULATE), mask=mask)
    tl.store(scale_ptr, scale)
