"""Beam-decode attention over a shared prompt: one program per (work item, kv head).

    work item = (request r, block b of its query rows)
    query rows of request r: i in [0, G * n_r), beam = i // G, q head = kv_head * G + i % G

Each program streams request r's prompt KV (gathered by pool slot, no per-beam copies) ONCE
for all G*BLOCK_M query rows it holds, then folds in each beam's own decode KV (<= depth
keys, by decode-buffer row) with the same online softmax: an exact merge, no padding of
prompts to the longest. All metadata lives in tensors, so the launch is CUDA-graph safe:
unused work items carry r = -1 and exit at once.

The reference (``beam_decode_attention_ref``) is the math the torch backend implements.
"""

from __future__ import annotations

import torch

from flashrec.kernels.backend import next_pow2


def build_work(req_n: list[int], group: int, block_m: int) -> list[tuple[int, int]]:
    """(request, block) pairs covering every request's G*n query rows."""
    out = []
    for r, n in enumerate(req_n):
        for b in range((group * n + block_m - 1) // block_m):
            out.append((r, b))
    return out


def beam_decode_attention_ref(
    q,
    k_pool,
    v_pool,
    slots,
    req_row_start,
    req_n,
    req_slot_start,
    req_len,
    req_step,
    dk,
    dv,
    rows,
    depth,
    scale,
):
    """Plain PyTorch: q [R, Hq, D]; k/v_pool [P, Hkv, D]; dk/dv [S*depth, Hkv, D]."""
    R, hq, d = q.shape
    hkv = k_pool.shape[1]
    g = hq // hkv
    out = torch.zeros(R, hq, d, dtype=q.dtype, device=q.device)
    for r in range(len(req_n)):
        a, n = int(req_row_start[r]), int(req_n[r])
        s0, L, step = int(req_slot_start[r]), int(req_len[r]), int(req_step[r])
        sl = slots[s0 : s0 + L].long()
        kp = k_pool[sl].float()  # [L, Hkv, D]
        vp = v_pool[sl].float()
        br = rows[a : a + n].long()
        ks = dk.view(-1, depth, hkv, d)[br, : step + 1].float()  # [n, t, Hkv, D]
        vs = dv.view(-1, depth, hkv, d)[br, : step + 1].float()
        qq = q[a : a + n].float().view(n, hkv, g, d)
        sp = torch.einsum("nhgd,lhd->nhgl", qq, kp)
        ss = torch.einsum("nhgd,nthd->nhgt", qq, ks)
        p = torch.softmax(torch.cat([sp, ss], -1) * scale, -1)
        o = torch.einsum("nhgl,lhd->nhgd", p[..., :L], vp) + torch.einsum(
            "nhgt,nthd->nhgd", p[..., L:], vs
        )
        out[a : a + n] = o.reshape(n, hq, d).to(q.dtype)
    return out


_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(
        q_ptr,
        kp_ptr,
        vp_ptr,
        slots_ptr,
        work_ptr,
        row_start_ptr,
        n_ptr,
        slot_start_ptr,
        len_ptr,
        step_ptr,
        dk_ptr,
        dv_ptr,
        rows_ptr,
        out_ptr,
        scale,
        s_qr,
        s_qh,
        s_kp,
        s_kh,
        s_dk,
        s_dh,
        s_or,
        s_oh,
        G: tl.constexpr,
        D: tl.constexpr,
        DEPTH: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        PREC: tl.constexpr,
    ):
        w = tl.program_id(0)
        kvh = tl.program_id(1)
        r = tl.load(work_ptr + 2 * w)
        if r < 0:
            return
        blk = tl.load(work_ptr + 2 * w + 1)
        nr = tl.load(n_ptr + r)
        row0 = tl.load(row_start_ptr + r)
        L = tl.load(len_ptr + r)
        s0 = tl.load(slot_start_ptr + r)
        step = tl.load(step_ptr + r)
        offs_m = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        m_mask = offs_m < G * nr
        beam = offs_m // G
        head = kvh * G + offs_m % G
        offs_d = tl.arange(0, D)
        qrow = (row0 + beam).to(tl.int64)
        q = tl.load(
            q_ptr + qrow[:, None] * s_qr + head[:, None] * s_qh + offs_d[None, :],
            mask=m_mask[:, None],
            other=0.0,
        )
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for start in range(0, L, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_mask = offs_n < L
            slot = tl.load(slots_ptr + s0 + offs_n, mask=n_mask, other=0).to(tl.int64)
            kv_off = slot[:, None] * s_kp + kvh * s_kh + offs_d[None, :]
            k = tl.load(kp_ptr + kv_off, mask=n_mask[:, None], other=0.0).to(q.dtype)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
            s = tl.where(n_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(vp_ptr + kv_off, mask=n_mask[:, None], other=0.0).to(q.dtype)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m_i = m_new
        drow = tl.load(rows_ptr + row0 + beam, mask=m_mask, other=0).to(tl.int64)
        qf = q.to(tl.float32)
        for j in tl.static_range(DEPTH):
            ok = m_mask & (j <= step)
            d_off = (drow * DEPTH + j)[:, None] * s_dk + kvh * s_dh + offs_d[None, :]
            kj = tl.load(dk_ptr + d_off, mask=ok[:, None], other=0.0).to(tl.float32)
            sj = tl.sum(qf * kj, 1) * scale
            sj = tl.where(ok, sj, float("-inf"))
            m_new = tl.maximum(m_i, sj)
            alpha = tl.exp(m_i - m_new)
            pj = tl.where(ok, tl.exp(sj - m_new), 0.0)
            l_i = l_i * alpha + pj
            vj = tl.load(dv_ptr + d_off, mask=ok[:, None], other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + pj[:, None] * vj
            m_i = m_new
        o = acc / l_i[:, None]
        tl.store(
            out_ptr + qrow[:, None] * s_or + head[:, None] * s_oh + offs_d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=m_mask[:, None],
        )

    _KERNEL = kernel
    return kernel


def beam_decode_attention_triton(
    q,
    k_pool,
    v_pool,
    slots,
    work,
    req_row_start,
    req_n,
    req_slot_start,
    req_len,
    req_step,
    dk,
    dv,
    rows,
    depth,
    scale,
    out=None,
    block_m: int = 64,
    block_n: int = 64,
):
    """Triton launch. ``work`` is an int32 [W, 2] tensor of (request, block) (-1 = unused)."""
    R, hq, d = q.shape
    hkv = k_pool.shape[1]
    assert d == next_pow2(d), "head_dim must be a power of two"
    if out is None:
        out = torch.empty_like(q)
    grid = (work.shape[0], hkv)
    _kernel()[grid](
        q,
        k_pool,
        v_pool,
        slots,
        work,
        req_row_start,
        req_n,
        req_slot_start,
        req_len,
        req_step,
        dk,
        dv,
        rows,
        out,
        scale,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        dk.stride(0),
        dk.stride(1),
        out.stride(0),
        out.stride(1),
        G=hq // hkv,
        D=d,
        DEPTH=depth,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        PREC="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 models: no TF32 shortcut
        num_warps=4,
        num_stages=2,
    )
    return out
