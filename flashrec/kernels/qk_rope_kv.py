"""Per-head q/k RMSNorm + NeoX rotary embedding on the fused QKV output, + KV-cache write.

Layout of one token's row of ``qkv`` (row stride may exceed the width)::

    | q head 0 .. Hq-1 | k head 0 .. Hkv-1 | v head 0 .. Hkv-1 |     each head: D values

q and k are normalised and rotated IN PLACE; the returned q/k/v are views into ``qkv``.

Math, matching HF transformers' Qwen3 attention (``dt`` = ``qkv.dtype``, each ``dt(...)`` one
rounding; the norm is skipped, not replaced, when its weight is None)::

    n      = dt(x * rsqrt(mean(x**2) + eps))        # fp32, per head over D
    x      = dt(weight * n)
    c, s   = dt(cos[pos]), dt(sin[pos])             # the fp32 table rounded, as HF does
    x1, x2 = x[:D/2], x[D/2:]                       # NeoX pairs (i, i + D/2)
    out    = [dt(dt(x1*c) - dt(x2*s)), dt(dt(x2*c) + dt(x1*s))]

The cache write stores k (after norm and rope) and v at rows ``out_loc`` of
``k_cache``/``v_cache`` [S, Hkv, D]; an e4m3 cache gets ``clamp(value * (1/scale), +-448)``
(the reciprocal taken in double, then fp32: the same number in reference and kernel).
"""

from __future__ import annotations

import torch

from flashrec.kernels.backend import interpreting, next_pow2, use_triton

__all__ = [
    "build_cos_sin",
    "qk_norm_rope_store",
    "qk_norm_rope_store_ref",
    "qk_norm_rope_store_triton",
]

_FP8_MAX = 448.0


def build_cos_sin(
    max_pos: int, head_dim: int, theta: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """Rotary table [max_pos, head_dim] float32: cos in the first D/2 columns, sin in the last.

    Default (unscaled) RoPE as in HF: ``inv_freq = 1 / theta ** (arange(0, D, 2) / D)``,
    angle = position * inv_freq, computed in float32.
    """
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)
    pos = torch.arange(max_pos, dtype=torch.int64, device=device).float()
    angles = pos[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).contiguous()


def _split_qkv(
    qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if qkv.dim() != 2 or qkv.stride(-1) != 1:
        raise ValueError("qkv must be 2-D [T, (Hq + 2*Hkv) * D] with a unit last-dim stride")
    qd, kd = num_q_heads * head_dim, num_kv_heads * head_dim
    if qkv.shape[1] != qd + 2 * kd:
        raise ValueError(f"qkv width {qkv.shape[1]} != (Hq + 2*Hkv) * D = {qd + 2 * kd}")
    t = qkv.shape[0]
    q = qkv[:, :qd].view(t, num_q_heads, head_dim)
    k = qkv[:, qd : qd + kd].view(t, num_kv_heads, head_dim)
    v = qkv[:, qd + kd :].view(t, num_kv_heads, head_dim)
    return q, k, v


def _head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return (normed.float() * weight.float()).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _store(cache: torch.Tensor, loc: torch.Tensor, x: torch.Tensor, scale: float) -> None:
    if cache.dtype == torch.float8_e4m3fn:
        x = (x.float() * (1.0 / scale)).clamp(-_FP8_MAX, _FP8_MAX)
    cache[loc] = x.to(cache.dtype)


def qk_norm_rope_store_ref(
    qkv: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    out_loc: torch.Tensor | None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    skip_store: bool = False,
    round_kv: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference (and CPU path) of :func:`qk_norm_rope_store`; vectorised over tokens/heads."""
    q, k, v = _split_qkv(qkv, num_q_heads, num_kv_heads, head_dim)
    half = head_dim // 2
    table = cos_sin.index_select(0, positions.long())[:, None, :].to(qkv.dtype)  # [T, 1, D]
    cos, sin = table[..., :half], table[..., half:]
    for x, w in ((q, q_norm_weight), (k, k_norm_weight)):
        normed = x if w is None else _head_rms_norm(x, w, eps)
        x.copy_(_rope(normed, cos, sin))
    if not skip_store and out_loc is not None and k_cache is not None and v_cache is not None:
        loc = out_loc.long()
        _store(k_cache, loc, k, k_scale)
        _store(v_cache, loc, v, v_scale)
        if round_kv and k_cache.dtype == torch.float8_e4m3fn:
            k.copy_(k_cache[loc].float() * k_scale)
            v.copy_(v_cache[loc].float() * v_scale)
    return q, k, v


def qk_norm_rope_store_triton(
    qkv: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    out_loc: torch.Tensor | None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    skip_store: bool = False,
    round_kv: bool = False,
    block_h: int | None = None,
    num_warps: int = 2,
    hw_round: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Triton kernel for :func:`qk_norm_rope_store_ref`.

    Grid: (tokens, head blocks); the first ``cdiv(Hq, BLOCK_H)`` blocks of a token take q
    heads, the rest take k heads and also copy the matching v heads into the cache.
    ``block_h`` (heads per program, a power of two; default: the fewer of the q and kv heads,
    at most 2,048 elements) and ``num_warps`` are launch settings, for tuning sweeps
    (``tests/kernels/bench_kernels.py --qk-sweep``). Every setting computes the reference's
    values within rounding, but the per-head reductions run in a different order, so the last
    bit can differ between settings. The default, 2 warps, was the fastest in that sweep.

    ``hw_round`` (GPU only; ``--qk-rope-rounding hardware``, the default): each bf16 rounding
    through the hardware conversion in inline PTX (``rn_bf16``) instead of ~5 integer
    instructions, which makes the kernel faster (docs/baselines.md). It rounds to nearest even
    at every step HF rounds, so the bits are the same (``tests/kernels`` checks it on a GPU).
    The e4m3 cache codes keep the integer rounding: with the hardware e4m3 conversion in this
    kernel the GPU bit-equality test fails, although the two conversions agree on their own;
    not yet explained.
    """
    from flashrec.kernels.tl.qk_rope import qk_norm_rope_store_kernel

    q, k, v = _split_qkv(qkv, num_q_heads, num_kv_heads, head_dim)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    if cos_sin.dim() != 2 or cos_sin.shape[1] != head_dim or cos_sin.stride(-1) != 1:
        raise ValueError(f"cos_sin must be [max_pos, {head_dim}] with a unit last-dim stride")
    store = not skip_store and out_loc is not None and k_cache is not None
    store = store and v_cache is not None
    if store:
        assert k_cache is not None and v_cache is not None and out_loc is not None
        for cache in (k_cache, v_cache):
            if cache.dim() != 3 or cache.shape[1:] != (num_kv_heads, head_dim):
                raise ValueError(f"cache must be [S, {num_kv_heads}, {head_dim}]")
            if cache.stride(-1) != 1:
                raise ValueError("cache needs a unit last-dim stride")
    t = qkv.shape[0]
    if t == 0:
        return q, k, v
    if block_h is None:
        block_h = min(next_pow2(min(num_q_heads, num_kv_heads)), max(1, 2048 // head_dim))
    elif block_h < 1 or block_h != next_pow2(block_h):
        raise ValueError(f"block_h must be a power of two, got {block_h}")
    if hw_round and interpreting():
        raise ValueError("hw_round needs a GPU: the CPU interpreter runs no inline PTX")
    q_blocks = -(-num_q_heads // block_h)
    k_blocks = -(-num_kv_heads // block_h)
    half = head_dim // 2
    # Absent weights / caches get ``qkv`` as a placeholder pointer; it is never dereferenced.
    kc = k_cache if store else qkv
    vc = v_cache if store else qkv
    assert kc is not None and vc is not None
    qw = qkv if q_norm_weight is None else q_norm_weight.contiguous()
    kw = qkv if k_norm_weight is None else k_norm_weight.contiguous()
    positions = positions.contiguous()
    qk_norm_rope_store_kernel[(t, q_blocks + k_blocks)](
        qkv, qkv.stride(0), positions, cos_sin, cos_sin.stride(0), qw, kw, eps,
        kc, kc.stride(0) if store else 0, kc.stride(1) if store else 0,
        vc, vc.stride(0) if store else 0, vc.stride(1) if store else 0,
        out_loc.contiguous() if store else positions,
        1.0 / k_scale, 1.0 / v_scale, k_scale, v_scale,
        num_q_heads, num_kv_heads, q_blocks,
        HEAD_DIM=head_dim, HALF=half, HALF_P2=next_pow2(half), BLOCK_H=block_h,
        HAS_Q_NORM=q_norm_weight is not None, HAS_K_NORM=k_norm_weight is not None,
        # NOTE: on the GPU the compiler folds x.to(bf16).to(fp32) round trips and contracts the
        # products into FMAs (one rounding instead of HF's three: some bf16 outputs 1 ulp off). The
        # integer-rounding path (EMULATE) and the inline-PTX hardware rounding (HW,
        # ``hw_round``) both keep every rounding HF does.
        STORE=store, ROUND_BACK=store and round_kv and kc.dtype == torch.float8_e4m3fn,
        EMULATE=True, HW=bool(hw_round), num_warps=num_warps,
    )  # fmt: skip
    return q, k, v


def qk_norm_rope_store(
    qkv: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    out_loc: torch.Tensor | None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    skip_store: bool = False,
    round_kv: bool = False,
    hw_round: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q/k RMSNorm + NeoX RoPE in place on ``qkv``, then k/v into the cache at ``out_loc``.

    Args:
        qkv: [T, (Hq + 2*Hkv) * D] fused QKV projection output, modified in place.
        positions: [T] int positions into ``cos_sin``.
        cos_sin: [max_pos, D] float32 table from :func:`build_cos_sin`.
        q_norm_weight, k_norm_weight: [D] per-head RMSNorm weights, or None (no norm).
        k_cache, v_cache: [S, Hkv, D] caches (bf16/fp16/fp32 or float8_e4m3fn), or None.
        out_loc: [T] cache rows to write (all valid, in [0, S)), or None for no write.
        k_scale, v_scale: e4m3 cache scales (stored value ~= k / k_scale); unused otherwise.
        skip_store: skip the cache write even when caches and ``out_loc`` are given.
        round_kv: with an e4m3 cache, also write the stored k/v back into ``qkv``, dequantized
            (``code * scale``): attention that reads k/v from ``qkv`` then sees exactly what a
            later reader of the cache sees (a cold prefill equals a warm radix hit) without
            gathering and converting the cache.
        hw_round: the Triton kernel rounds with the hardware conversions (see
            :func:`qk_norm_rope_store_triton`); ignored where the reference runs.

    Returns:
        Views ``q`` [T, Hq, D], ``k`` [T, Hkv, D], ``v`` [T, Hkv, D] into ``qkv``.
    """
    # fp16 activations take the reference: the GPU folds fp32->fp16->fp32 round trips, and only
    # bf16 rounding is emulated bit-exactly in the kernel (FlashRec runs bf16 or fp32).
    fast = use_triton(qkv) and qkv.dtype != torch.float16
    args = (
        qkv, num_q_heads, num_kv_heads, head_dim, positions, cos_sin,
        q_norm_weight, k_norm_weight, eps, k_cache, v_cache, out_loc,
        k_scale, v_scale, skip_store, round_kv,
    )  # fmt: skip
    if fast:
        return qk_norm_rope_store_triton(*args, hw_round=hw_round and not interpreting())
    return qk_norm_rope_store_ref(*args)
