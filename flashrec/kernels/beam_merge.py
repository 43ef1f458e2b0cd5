"""The prompt part of beam-decode attention computed elsewhere, merged with each beam's own keys.

A decode row's attention over its request's prompt plus its own <= depth decode keys equals two
attention states merged by their log-sum-exps: the prompt part (any kernel that returns an LSE,
e.g. FlashInfer's prefill over the request's prompt, the beams as query rows) and the row's
decode keys. ``beam_suffix_merge_triton`` folds the second into the first in one graph-safe
launch; ``stage_prompt_kv_triton`` copies a batch's prompt rows out of an FP8 pool as BF16 for
a prefill kernel that reads only BF16 keys. The ``*_ref`` functions are the same math in torch.
"""

from __future__ import annotations

import functools
import math

import torch

from flashrec.kernels.backend import next_pow2


def attention_state_ref(q, k, v, scale, base2=True):
    """softmax(q k^T * scale) v and its LSE over one key set: q [N, Hq, D], k/v [L, Hkv, D]
    -> (o [N, Hq, D] in q.dtype, lse [N, Hq] float32)."""
    n, hq, d = q.shape
    g = hq // k.shape[1]
    s = torch.einsum("nhd,lhd->nhl", q.float(), k.float().repeat_interleave(g, 1)) * scale
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("nhl,lhd->nhd", s.softmax(-1), v.float().repeat_interleave(g, 1))
    return o.to(q.dtype), lse / math.log(2) if base2 else lse


def beam_suffix_state(q, dk, dv, rows, row_steps, depth, scale, base2=True):
    """Each beam's own decode keys as an attention state: row i attends to its decode-buffer
    row ``rows[i]``'s keys at steps 0..``row_steps[i]`` (q [R, Hq, D]; dk/dv [S*depth, Hkv,
    D]). Returns (o [R, Hq, D] in q.dtype, lse [R, Hq] float32). Graph-safe: no host sync."""
    r, hq, d = q.shape
    hkv = dk.shape[1]
    g = hq // hkv
    ks = dk.view(-1, depth, hkv, d)[rows.long()].float()  # [R, depth, Hkv, D]
    vs = dv.view(-1, depth, hkv, d)[rows.long()].float()
    s = torch.einsum("rkgd,rtkd->rkgt", q.float().view(r, hkv, g, d), ks) * scale
    live = torch.arange(depth, device=q.device)[None, :] <= row_steps.view(-1, 1)  # [R, depth]
    s = s.masked_fill(~live[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1).reshape(r, hq)
    o = torch.einsum("rkgt,rtkd->rkgd", s.softmax(-1), vs).reshape(r, hq, d)
    return o.to(q.dtype), lse / math.log(2) if base2 else lse


def merge_attention_states(o_a, lse_a, o_b, lse_b, base2=True):
    """Attention over key sets A and B from each one's (o, lse) (what ``flashinfer.merge_state``
    computes, in float32): (o [N, Hq, D] in o_a.dtype, lse [N, Hq] float32)."""
    ln = math.log(2) if base2 else 1.0
    m = torch.maximum(lse_a, lse_b)
    wa, wb = torch.exp((lse_a - m) * ln), torch.exp((lse_b - m) * ln)
    o = (o_a.float() * wa[..., None] + o_b.float() * wb[..., None]) / (wa + wb)[..., None]
    return o.to(o_a.dtype), m + torch.log(wa + wb) / ln


def beam_suffix_merge_ref(q, o_p, lse_p, dk, dv, rows, out_loc, depth, scale):
    """What :func:`beam_suffix_merge_triton` computes, in float32 torch: each row's prompt
    state (``o_p``, base-2 ``lse_p``) merged with its own decode keys at steps 0..``out_loc -
    rows * depth``."""
    steps = out_loc.long() - rows.long() * depth
    o_s, lse_s = beam_suffix_state(q, dk, dv, rows, steps, depth, scale)
    return merge_attention_states(o_p.to(q.dtype), lse_p, o_s, lse_s)[0]


@functools.cache
def _merge_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def beam_suffix_merge_kernel(
        q_ptr, po_ptr, plse_ptr, dk_ptr, dv_ptr, rows_ptr, out_loc_ptr, out_ptr,
        scale_log2, lse_scale, s_qr, s_qh, s_pr, s_ph, s_lr, s_lh, s_dk, s_dh, s_or, s_oh,
        G: tl.constexpr, NH: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr,
        DEPTH: tl.constexpr,
    ):  # fmt: skip
        """One program per (row, block of NH q heads: one kv head's G, or all of them): the
        heads' prompt state and the row's own decode keys up to its step, merged in base 2
        (``lse_scale`` converts the prompt's LSE to it)."""
        row = tl.program_id(0).to(tl.int64)
        h = tl.arange(0, BLOCK_H)
        hm = h < NH
        head = tl.program_id(1) * NH + h
        kvh = head // G
        offs_d = tl.arange(0, D)
        q = tl.load(q_ptr + row * s_qr + head[:, None] * s_qh + offs_d[None, :], mask=hm[:, None],
                    other=0.0).to(tl.float32)  # fmt: skip
        m = tl.load(plse_ptr + row * s_lr + head * s_lh, mask=hm, other=0.0) * lse_scale
        acc = tl.load(po_ptr + row * s_pr + head[:, None] * s_ph + offs_d[None, :],
                      mask=hm[:, None], other=0.0).to(tl.float32)  # fmt: skip
        l_i = tl.full([BLOCK_H], 1.0, tl.float32)  # the prompt state's weight, 2^(lse - m)
        drow = tl.load(rows_ptr + row)
        step = tl.load(out_loc_ptr + row) - drow * DEPTH
        for j in tl.static_range(DEPTH):
            if j <= step:  # each head reads its kv head's key (G heads share one: cached)
                d_off = (drow * DEPTH + j) * s_dk + kvh[:, None] * s_dh + offs_d[None, :]
                k = tl.load(dk_ptr + d_off, mask=hm[:, None], other=0.0).to(tl.float32)
                s = tl.sum(q * k, 1) * scale_log2
                m_new = tl.maximum(m, s)
                alpha = tl.exp2(m - m_new)
                p = tl.exp2(s - m_new)
                v = tl.load(dv_ptr + d_off, mask=hm[:, None], other=0.0).to(tl.float32)
                acc = acc * alpha[:, None] + p[:, None] * v
                l_i = l_i * alpha + p
                m = m_new
        o = acc / l_i[:, None]
        tl.store(out_ptr + row * s_or + head[:, None] * s_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=hm[:, None])  # fmt: skip

    return beam_suffix_merge_kernel


def beam_suffix_merge_triton(
    q, o_p, lse_p, dk, dv, rows, out_loc, depth, scale, lse_base2=True, out=None,
    all_heads: bool = False,
):  # fmt: skip
    """Beam-decode attention from its prompt part computed elsewhere (``o_p [R, Hq, D]``,
    ``lse_p [R, Hq]`` base 2: FlashInfer's prefill with ``return_lse``): each row's own
    decode keys (decode-buffer row ``rows``, steps 0..``out_loc - rows * depth``) folded in
    with a log-sum-exp merge, in one launch; graph-safe (the steps are read on the device).
    ``lse_base2`` False: ``lse_p`` is a natural logarithm. ``all_heads``: one program per row
    for every head (else one per row and kv head; ``bench_kernels.py --attn-sweep`` times
    both). Returns ``out`` [R, Hq, D] in q's dtype."""
    r, hq, d = q.shape
    hkv = dk.shape[1]
    g = hq // hkv
    assert d == next_pow2(d), "head_dim must be a power of two"
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if r == 0:
        return out
    nh = hq if all_heads else g
    warps = max(1, min(8, nh * d // 128))
    _merge_kernel()[(r, hq // nh)](
        q, o_p, lse_p, dk, dv, rows, out_loc, out, scale * math.log2(math.e),
        1.0 if lse_base2 else math.log2(math.e),
        q.stride(0), q.stride(1), o_p.stride(0), o_p.stride(1), lse_p.stride(0),
        lse_p.stride(1), dk.stride(0), dk.stride(1), out.stride(0), out.stride(1),
        G=g, NH=nh, BLOCK_H=next_pow2(nh), D=d, DEPTH=depth,
        num_warps=warps if all_heads else (1 if d <= 64 else 2),
    )  # fmt: skip
    return out


STAGE_TAIL = 256  # zeroed rows after the staged ones: at least a prefill kernel's key tile


def stage_prompt_kv_ref(k_pool, v_pool, slots, n, dtype=torch.bfloat16):
    """What :func:`stage_prompt_kv_triton` writes: the pool's rows at ``slots[:n]``, in
    order, converted to ``dtype``."""
    idx = slots[:n].long()
    return k_pool[idx].to(dtype), v_pool[idx].to(dtype)


@functools.cache
def _stage_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def stage_prompt_kv_kernel(
        kp_ptr, vp_ptr, slots_ptr, n_ptr, ok_ptr, ov_ptr, cap, tail, s_p, s_o,
        HD: tl.constexpr, BLOCK_HD: tl.constexpr, BLOCK_T: tl.constexpr,
    ):  # fmt: skip
        """Rows ``slots[0..n)`` of the pool -> rows 0..n of the staging buffers, converted,
        and zeros in rows n..n + tail; a grid-stride loop bounded by the capacity (an
        argument), each trip past them (``n`` read on the device: graph-safe) skipped."""
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        n = tl.load(n_ptr)
        offs = tl.arange(0, BLOCK_HD)
        hm = offs < HD
        for t0 in range(pid * BLOCK_T, cap, nprog * BLOCK_T):
            if t0 < n + tail:
                t = t0 + tl.arange(0, BLOCK_T)
                m = t < n
                slot = tl.load(slots_ptr + t, mask=m, other=0).to(tl.int64)
                src = slot[:, None] * s_p + offs[None, :]
                dst = t.to(tl.int64)[:, None] * s_o + offs[None, :]
                mm = m[:, None] & hm[None, :]
                mw = ((t < n + tail) & (t < cap))[:, None] & hm[None, :]  # rows + the tail
                k = tl.load(kp_ptr + src, mask=mm, other=0.0)
                tl.store(ok_ptr + dst, k.to(ok_ptr.dtype.element_ty), mask=mw)
                v = tl.load(vp_ptr + src, mask=mm, other=0.0)
                tl.store(ov_ptr + dst, v.to(ov_ptr.dtype.element_ty), mask=mw)

    return stage_prompt_kv_kernel


def stage_prompt_kv_triton(
    k_pool, v_pool, slots, n, out_k, out_v, sms: int = 132, tail: int = STAGE_TAIL
):
    """Copy the pool's rows at ``slots[:n]`` (``n``: int32 device scalar) into ``out_k`` /
    ``out_v`` ``[cap, Hkv, D]`` rows 0..n, converted to their dtype (FP8 -> BF16: exact), and
    zero rows n..n + ``tail`` (within the capacity), in one launch whose grid does not depend
    on ``n`` (CUDA-graph safe). The caller keeps ``n <= cap``.

    The zeros are for the prefill kernel that reads the staged rows: its last key tile runs
    past the last request's keys into the rows after them, masked by score, and a masked key
    still multiplies its value by zero: a NaN left in a reused buffer there would turn that
    request's output into NaN (seen with FlashInfer's fa3 over a ``torch.empty`` buffer)."""
    cap, hkv, d = out_k.shape
    for t in (k_pool, v_pool, out_k, out_v):
        assert t.stride(2) == 1 and t.stride(1) == d, "rows of Hkv x D contiguous elements"
    block_t = 8
    grid = (max(1, min(-(-cap // block_t), 4 * sms)),)
    _stage_kernel()[grid](
        k_pool, v_pool, slots, n, out_k, out_v, cap, tail, k_pool.stride(0), out_k.stride(0),
        HD=hkv * d, BLOCK_HD=next_pow2(hkv * d), BLOCK_T=block_t, num_warps=4,
    )  # fmt: skip
    return out_k, out_v
