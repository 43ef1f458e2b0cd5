"""Triton kernel: per-head q/k RMSNorm + NeoX RoPE in place on the QKV row, + KV-cache write.

Each program takes one token and BLOCK_H heads. A head is handled as its two halves
``x1 = x[:HALF]`` and ``x2 = x[HALF:]`` (NeoX pairs), each a [BLOCK_H, HALF_P2] tile.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashrec.kernels.tl.common import to_act, to_fp8


@triton.jit
def _norm_rope_heads(
    base_ptr, h, hmask, d, dmask, cos, sin, w_ptr, eps,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, HAS_NORM: tl.constexpr, DT: tl.constexpr,
    EMULATE: tl.constexpr, HW: tl.constexpr,
):  # fmt: skip
    """Norm (optional) + rope heads ``h`` at ``base_ptr``; store in place, return both halves."""
    mask = hmask[:, None] & dmask[None, :]
    ptr1 = base_ptr + h[:, None] * HEAD_DIM + d[None, :]
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr1 + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        var = tl.math.div_rn(tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1), HEAD_DIM * 1.0)
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(var + eps))[:, None]
        w1 = tl.load(w_ptr + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
        x1 = to_act(to_act(x1 * rstd, DT, EMULATE, HW) * w1, DT, EMULATE, HW)
        x2 = to_act(to_act(x2 * rstd, DT, EMULATE, HW) * w2, DT, EMULATE, HW)
    c = cos[None, :]
    s = sin[None, :]
    o1 = to_act(to_act(x1 * c, DT, EMULATE, HW) - to_act(x2 * s, DT, EMULATE, HW), DT, EMULATE, HW)
    o2 = to_act(to_act(x2 * c, DT, EMULATE, HW) + to_act(x1 * s, DT, EMULATE, HW), DT, EMULATE, HW)
    tl.store(ptr1, o1.to(DT), mask=mask)
    tl.store(ptr1 + HALF, o2.to(DT), mask=mask)
    return o1, o2


@triton.jit
def _cache_value(x, inv_scale, CDT: tl.constexpr, EMULATE: tl.constexpr):
    """Value as stored in a cache of dtype CDT: e4m3 caches hold clamp(x * inv_scale, +-448),
    rounded in integer arithmetic with EMULATE in both rounding forms (the kernel's HW changes
    the bf16 roundings only, see qk_norm_rope_store_triton)."""
    if CDT == tl.float8e4nv:
        y = to_fp8(x * inv_scale, EMULATE)
    else:
        y = x.to(CDT)
    return y


@triton.jit
def _store_heads(
    x1, x2, row_ptr, cache_ptr, mask, inv_scale, scale,
    HALF: tl.constexpr, CDT: tl.constexpr, DT: tl.constexpr, ROUND_BACK: tl.constexpr,
    EMULATE: tl.constexpr, HW: tl.constexpr,
):  # fmt: skip
    """Both halves of k or v heads into the cache at ``cache_ptr`` (see ``_cache_value``);
    ROUND_BACK: the stored codes, dequantized (``code * scale``), also back at ``row_ptr``."""
    c1 = _cache_value(x1, inv_scale, CDT, EMULATE)
    c2 = _cache_value(x2, inv_scale, CDT, EMULATE)
    tl.store(cache_ptr, c1, mask=mask)
    tl.store(cache_ptr + HALF, c2, mask=mask)
    if ROUND_BACK:
        tl.store(row_ptr, to_act(c1.to(tl.float32) * scale, DT, EMULATE, HW).to(DT), mask=mask)
        r2 = to_act(c2.to(tl.float32) * scale, DT, EMULATE, HW)
        tl.store(row_ptr + HALF, r2.to(DT), mask=mask)


@triton.jit
def qk_norm_rope_store_kernel(
    qkv_ptr, stride_t, pos_ptr, cs_ptr, stride_cs, qw_ptr, kw_ptr, eps,
    kc_ptr, stride_kc_s, stride_kc_h, vc_ptr, stride_vc_s, stride_vc_h, loc_ptr,
    k_inv_scale, v_inv_scale, k_scale, v_scale,
    HQ, HKV, Q_BLOCKS,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, HALF_P2: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_Q_NORM: tl.constexpr, HAS_K_NORM: tl.constexpr, STORE: tl.constexpr,
    ROUND_BACK: tl.constexpr, EMULATE: tl.constexpr, HW: tl.constexpr,
):  # fmt: skip
    """Grid (T, Q_BLOCKS + cdiv(HKV, BLOCK_H)): head blocks [0, Q_BLOCKS) are q heads, the
    rest k heads (whose programs also copy the same v heads into the cache when STORE).
    ROUND_BACK (e4m3 caches): the stored k/v also go back into the QKV row, dequantized."""
    DT: tl.constexpr = qkv_ptr.dtype.element_ty
    KC: tl.constexpr = kc_ptr.dtype.element_ty
    VC: tl.constexpr = vc_ptr.dtype.element_ty
    tok = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    row_ptr = qkv_ptr + tok * stride_t
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    d = tl.arange(0, HALF_P2)
    dmask = d < HALF
    cs_row = cs_ptr + pos * stride_cs
    cos = to_act(tl.load(cs_row + d, mask=dmask, other=0.0).to(tl.float32), DT, EMULATE, HW)
    sin = to_act(tl.load(cs_row + HALF + d, mask=dmask, other=0.0).to(tl.float32), DT, EMULATE, HW)
    hh = tl.arange(0, BLOCK_H)
    if hb < Q_BLOCKS:
        h = hb * BLOCK_H + hh
        _norm_rope_heads(
            row_ptr, h, h < HQ, d, dmask, cos, sin, qw_ptr, eps,
            HEAD_DIM, HALF, HAS_Q_NORM, DT, EMULATE, HW,
        )  # fmt: skip
    else:
        h = (hb - Q_BLOCKS) * BLOCK_H + hh
        hmask = h < HKV
        k1, k2 = _norm_rope_heads(
            row_ptr + HQ * HEAD_DIM, h, hmask, d, dmask, cos, sin, kw_ptr, eps,
            HEAD_DIM, HALF, HAS_K_NORM, DT, EMULATE, HW,
        )  # fmt: skip
        if STORE:
            mask = hmask[:, None] & dmask[None, :]
            loc = tl.load(loc_ptr + tok).to(tl.int64)
            ksrc = row_ptr + HQ * HEAD_DIM + h[:, None] * HEAD_DIM + d[None, :]
            kp = kc_ptr + loc * stride_kc_s + h[:, None] * stride_kc_h + d[None, :]
            _store_heads(
                k1, k2, ksrc, kp, mask, k_inv_scale, k_scale,
                HALF, KC, DT, ROUND_BACK, EMULATE, HW,
            )  # fmt: skip
            vsrc = row_ptr + (HQ + HKV) * HEAD_DIM + h[:, None] * HEAD_DIM + d[None, :]
            v1 = tl.load(vsrc, mask=mask, other=0.0).to(tl.float32)
            v2 = tl.load(vsrc + HALF, mask=mask, other=0.0).to(tl.float32)
            vp = vc_ptr + loc * stride_vc_s + h[:, None] * stride_vc_h + d[None, :]
            _store_heads(
                v1, v2, vsrc, vp, mask, v_inv_scale, v_scale,
                HALF, VC, DT, ROUND_BACK, EMULATE, HW,
            )  # fmt: skip
