"""Beam-decode attention over a shared prompt: one program per (work item, kv head).

    work item = (request r, block b of its query rows)
    query rows of request r: i in [0, G * n_r), beam = i // G, q head = kv_head * G + i % G

Each program streams request r's prompt KV (gathered by pool slot, no per-beam copies) ONCE
for all G*BLOCK_M query rows it holds, then folds in each beam's own decode KV (<= depth
keys, by decode-buffer row) with the same online softmax: an exact merge, no padding of
prompts to the longest. All metadata lives in tensors, so the launch is CUDA-graph safe:
unused work items carry r = -1 and exit at once.

Split-K: when a batch has too few (request, block, kv head) programs to fill the GPU (one
request with a few hundred beams), each work item also carries a split index and the prompt
is cut into ``splits`` chunks; the programs of one block write unnormalised partial results
(acc, running max, running sum) and a second kernel merges them with a log-sum-exp rescale.
One split (the last under the default split rule, else split 0) also folds in the per-beam
decode KV.

Launch: a fixed grid of (programs, kv heads) walks the work list in a strided loop up to the
item count, so a captured graph's launch size does not grow with the work list's capacity.
The split count and the item count of a forward live in a device pair ``ctrl`` = (splits,
items), so a captured graph replays with any count up to its capacity.

The reference (``beam_decode_attention_ref``) is the math the torch backend implements.
"""

from __future__ import annotations

import functools

import torch

from flashrec.config.flags import env_choice
from flashrec.kernels.backend import next_pow2

MAX_SPLITS = 8
SPLIT_MAX_ROWS = 1024  # batches wider than this never split (they fill the GPU anyway)
MIN_SPLIT_TOKENS = 128  # a split covers at least this many prompt tokens
RESIDENT_PER_SM = 2  # programs of the engine's launches resident per SM (registers, shared memory)
# how a one-request batch's prompt is split: "wave" (the most splits whose programs all fit one
# wave of RESIDENT_PER_SM per SM, each beam's decode keys in the last split, the shortest) or
# "fill" (at least two programs per SM, decode keys in split 0); for same-run A/Bs on a GPU
SPLIT_RULE = env_choice("FLASHREC_DECODE_SPLITS", "wave", ("wave", "fill"))


def build_work(
    req_n: list[int], group: int, block_m: int, splits: int = 1
) -> list[tuple[int, int, int]]:
    """(request, block, split) triples covering every request's G*n query rows."""
    out = []
    for r, n in enumerate(req_n):
        for b in range((group * n + block_m - 1) // block_m):
            for sp in range(splits):
                out.append((r, b, sp))
    return out


PROGRAMS_PER_SM = 8  # resident programs per SM the grid aims at (per kv head: / Hkv)


def grid_programs(items: int, num_kv_heads: int, sms: int) -> int:
    """Programs per kv head of a launch over a work list of ``items`` entries (capacity)."""
    return max(1, min(items, -(-PROGRAMS_PER_SM * sms // num_kv_heads)))


def choose_splits(
    blocks: int,
    num_kv_heads: int,
    rows: int,
    min_len: int,
    sms: int,
    max_splits: int = MAX_SPLITS,
    rule: str | None = None,
) -> int:
    """Prompt splits for a forward, each split at least ``MIN_SPLIT_TOKENS`` long; 1 for wide
    batches. ``rule`` (default ``SPLIT_RULE``): "wave", the most splits whose programs fit one
    wave of ``RESIDENT_PER_SM`` per multiprocessor (a second, partial wave costs a whole
    program's time); "fill", enough for at least two programs per multiprocessor."""
    if rows > SPLIT_MAX_ROWS or blocks == 0:
        return 1
    programs = blocks * num_kv_heads
    if (rule or SPLIT_RULE) == "wave":
        want = RESIDENT_PER_SM * sms // programs
    else:
        want = -(-2 * sms // programs)
    return max(1, min(MAX_SPLITS, max_splits, want, min_len // MIN_SPLIT_TOKENS))


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


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def one_item(
        w, kvh, nsplit, q_ptr, kp_ptr, vp_ptr, slots_ptr, work_ptr, row_start_ptr, n_ptr,
        slot_start_ptr, len_ptr, step_ptr, dk_ptr, dv_ptr, rows_ptr, out_ptr, part_o_ptr,
        part_ml_ptr, part_rows, scale, s_qr, s_qh, s_kp, s_kh, s_dk, s_dh, s_or, s_oh,
        G: tl.constexpr, HQ: tl.constexpr, D: tl.constexpr, DEPTH: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
        I64_POOL: tl.constexpr, I64_DEC: tl.constexpr, F16_DOT: tl.constexpr,
        LIVE_ONLY: tl.constexpr, DEC_LAST: tl.constexpr,
    ):  # fmt: skip
        r = tl.load(work_ptr + 3 * w)
        if r >= 0:
            blk = tl.load(work_ptr + 3 * w + 1)
            split = tl.load(work_ptr + 3 * w + 2)
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
            if F16_DOT:  # FP8 KV: e4m3 -> f16 is one conversion, e4m3 -> bf16 is not
                q = q.to(tl.float16)
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, D], tl.float32)
            chunk = tl.cdiv(tl.cdiv(L, nsplit), BLOCK_N) * BLOCK_N
            lo = split * chunk
            hi = tl.minimum(L, lo + chunk)
            for start in range(lo, hi, BLOCK_N):
                offs_n = start + tl.arange(0, BLOCK_N)
                n_mask = offs_n < hi
                slot = tl.load(slots_ptr + s0 + offs_n, mask=n_mask, other=0)
                if I64_POOL:  # int32 offsets otherwise: [BLOCK_N, D] int64 tiles spill
                    slot = slot.to(tl.int64)
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
            # each row's own decode keys (<= DEPTH) as extra key blocks of the same online
            # softmax: block j holds row m's key at step j in row m, so a diagonal mask picks
            # q[m] . k_j[m]; the products run on the tensor cores like the prompt part and
            # everything stays in the MMA layouts (no per-row elementwise tiles to spill)
            drow = tl.load(rows_ptr + row0 + beam, mask=m_mask, other=0)
            if I64_DEC:
                drow = drow.to(tl.int64)
            else:
                drow = drow.to(tl.int32)
            offs_r = tl.arange(0, BLOCK_M)
            # the split that folds in the decode keys: the first, or (DEC_LAST) the last, whose
            # prompt chunk is the remainder (the shortest): the slowest program does less
            dec = (split == nsplit - 1) if DEC_LAST else (split == 0)
            if LIVE_ONLY:  # blocks holding a key this forward: that split, positions <= step
                nlive = tl.where(dec, step + 1, 0)
            else:
                nlive = DEPTH
            for j in tl.static_range(DEPTH):
                # LIVE_ONLY: a block past this forward's step, or in another split,
                # holds no key: branch around it (products, loads and the rescale) instead of
                # computing it masked. At 3 levels that is 2 of 3 blocks at step 0, 1 at step 1,
                # and all 3 in every split > 0 (the one-request, wide-beam launches)
                if j < nlive:
                    ok = m_mask & (j <= step) & dec
                    d_off = (drow * DEPTH + j)[:, None] * s_dk + kvh * s_dh + offs_d[None, :]
                    kj = tl.load(dk_ptr + d_off, mask=ok[:, None], other=0.0).to(q.dtype)
                    sj = tl.dot(q, tl.trans(kj), input_precision=PREC) * scale
                    diag = (offs_r[:, None] == offs_r[None, :]) & ok[None, :]
                    sj = tl.where(diag, sj, float("-inf"))
                    m_new = tl.maximum(m_i, tl.max(sj, 1))
                    alpha = tl.where(m_new > float("-inf"), tl.exp(m_i - m_new), 1.0)
                    pj = tl.where(diag, tl.exp(sj - m_new[:, None]), 0.0)
                    l_i = l_i * alpha + tl.sum(pj, 1)
                    vj = tl.load(dv_ptr + d_off, mask=ok[:, None], other=0.0).to(q.dtype)
                    acc = acc * alpha[:, None] + tl.dot(pj.to(vj.dtype), vj, input_precision=PREC)
                    m_i = m_new
            if nsplit == 1:
                o = acc / l_i[:, None]
                tl.store(
                    out_ptr + qrow[:, None] * s_or + head[:, None] * s_oh + offs_d[None, :],
                    o.to(out_ptr.dtype.element_ty),
                    mask=m_mask[:, None],
                )
            else:  # unnormalised partials; an empty split leaves m = -inf, l = 0, acc = 0
                pidx = (split * part_rows + qrow) * HQ + head
                tl.store(
                    part_o_ptr + pidx[:, None] * D + offs_d[None, :], acc, mask=m_mask[:, None]
                )
                tl.store(part_ml_ptr + 2 * pidx, m_i, mask=m_mask)
                tl.store(part_ml_ptr + 2 * pidx + 1, l_i, mask=m_mask)

    # the names are what profiler traces show (harness.trace counts them as attention)
    @triton.jit
    def beam_decode_attention_kernel(
        q_ptr, kp_ptr, vp_ptr, slots_ptr, work_ptr, row_start_ptr, n_ptr, slot_start_ptr,
        len_ptr, step_ptr, dk_ptr, dv_ptr, rows_ptr, out_ptr, part_o_ptr, part_ml_ptr, ctrl_ptr,
        part_rows, scale, s_qr, s_qh, s_kp, s_kh, s_dk, s_dh, s_or, s_oh,
        G: tl.constexpr, HQ: tl.constexpr, D: tl.constexpr, DEPTH: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
        I64_POOL: tl.constexpr, I64_DEC: tl.constexpr, F16_DOT: tl.constexpr,
        LIVE_ONLY: tl.constexpr, DEC_LAST: tl.constexpr,
    ):  # fmt: skip
        kvh = tl.program_id(1)
        nsplit = tl.load(ctrl_ptr)
        nwork = tl.load(ctrl_ptr + 1)
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        for it in range(0, tl.cdiv(nwork - pid, nprog)):  # items pid, pid + nprog, ...
            w = pid + it * nprog
            one_item(
                w, kvh, nsplit, q_ptr, kp_ptr, vp_ptr, slots_ptr, work_ptr, row_start_ptr,
                n_ptr, slot_start_ptr, len_ptr, step_ptr, dk_ptr, dv_ptr, rows_ptr, out_ptr,
                part_o_ptr, part_ml_ptr, part_rows, scale, s_qr, s_qh, s_kp, s_kh, s_dk, s_dh,
                s_or, s_oh, G, HQ, D, DEPTH, BLOCK_M, BLOCK_N, PREC, I64_POOL, I64_DEC, F16_DOT,
                LIVE_ONLY, DEC_LAST,
            )  # fmt: skip

    @triton.jit
    def beam_decode_merge_kernel(
        part_o_ptr, part_ml_ptr, ctrl_ptr, out_ptr, part_rows, rows, s_or, s_oh,
        HQ: tl.constexpr, D: tl.constexpr, MAX_S: tl.constexpr,
    ):  # fmt: skip
        """One program per (row, q head): out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s."""
        row = tl.program_id(0)
        head = tl.program_id(1)
        nsplit = tl.load(ctrl_ptr)
        if nsplit > 1 and row < rows:
            offs_d = tl.arange(0, D)
            sp = tl.arange(0, MAX_S)
            ok = sp < nsplit
            pidx = (sp * part_rows + row) * HQ + head
            m = tl.load(part_ml_ptr + 2 * pidx, mask=ok, other=float("-inf"))
            lsum = tl.load(part_ml_ptr + 2 * pidx + 1, mask=ok, other=0.0)
            m_max = tl.max(m, 0)
            wgt = tl.where(ok & (m > float("-inf")), tl.exp(m - m_max), 0.0)
            acc = tl.load(
                part_o_ptr + pidx[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0
            )
            o = tl.sum(acc * wgt[:, None], 0) / tl.sum(lsum * wgt, 0)
            tl.store(
                out_ptr + row.to(tl.int64) * s_or + head * s_oh + offs_d,
                o.to(out_ptr.dtype.element_ty),
            )

    return (beam_decode_attention_kernel, beam_decode_merge_kernel)


def launch_settings(kv_dtype: torch.dtype, q_dtype: torch.dtype, head_dim: int = 128) -> dict:
    """The engine's launch of the beam-decode kernel (64-row blocks, runner.BLOCK_M) per KV
    cache dtype, the fastest in ``bench_kernels.py --attn-sweep`` (docs/baselines.md):

    - FP8 KV with bf16 / f16 queries: 128-key blocks and float16 products (e4m3 -> f16 is a
      single conversion; e4m3 -> bf16 is not).
    - BF16 KV: 64-key blocks, 3 pipeline stages (128-key blocks spill registers).
    - anything else (float32 models): the plain 64 x 64 launch.

    float16 products round q to f16 (exact for |q| < 65,504; q is RMS-normed per head, so far
    below that) and the probabilities to f16 (more mantissa than bf16), so they stay within
    the output's own bf16 rounding of a float64 reference, where bf16 products do not.
    128-key blocks with FP8 KV fault (illegal memory access, Triton 3.6) at head_dim 16, so
    heads under 64 keep 64-key blocks."""
    fp8 = kv_dtype == torch.float8_e4m3fn and q_dtype in (torch.bfloat16, torch.float16)
    if fp8:  # 128-key blocks only from head_dim 64: at head_dim 16 they fault
        return {"block_n": 128 if head_dim >= 64 else 64, "num_warps": 4, "num_stages": 2,
                "f16_dot": True}  # fmt: skip
    if kv_dtype == torch.bfloat16 and q_dtype == torch.bfloat16:
        return {"block_n": 64, "num_warps": 4, "num_stages": 3, "f16_dot": False}
    return {"block_n": 64, "num_warps": 4, "num_stages": 2, "f16_dot": False}


def alloc_partials(rows: int, hq: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K scratch for up to ``rows`` query rows (capped at ``SPLIT_MAX_ROWS``: wider
    batches never split). Contents need no initialisation."""
    rows = max(1, min(rows, SPLIT_MAX_ROWS))
    return (
        torch.empty(MAX_SPLITS * rows * hq * d, dtype=torch.float32, device=device),
        torch.empty(MAX_SPLITS * rows * hq * 2, dtype=torch.float32, device=device),
    )


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
    block_n: int | None = None,
    ctrl: torch.Tensor | None = None,
    partials: tuple[torch.Tensor, torch.Tensor] | None = None,
    sms: int | None = None,
    splits: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    f16_dot: bool | None = None,
    live_only: bool = True,
    decode_split: str | None = None,
):
    """Triton launch. ``work``: int32 [W, 3] of (request, block, split) (request -1 = unused
    entry). ``ctrl``: int32 device pair (splits, items); None = (1, W). With splits > 1 the
    caller guarantees R <= SPLIT_MAX_ROWS; ``partials`` (from :func:`alloc_partials`) is
    allocated here when None. ``splits``: the host's copy of ctrl[0]; 1 skips the merge
    launch, None (a graph capture) launches it (it exits when the replayed count is 1).
    ``num_warps`` / ``num_stages``: launch settings (``bench_kernels.py --attn-sweep`` times
    them); ``block_m`` must match the block size ``work`` was built with. ``f16_dot``: with an
    FP8 KV cache and bf16 queries, run the products in float16 (q rounded to f16, keys and
    values converted e4m3 -> f16 exactly, float32 accumulation). Each of these left None takes
    :func:`launch_settings`' value for the KV and query dtypes. ``live_only`` (default):
    branch around the per-beam decode-key blocks that hold no key this forward (False
    computes them masked; ``bench_kernels.py --attn-sweep`` times both). ``decode_split``:
    the prompt split whose programs fold in each beam's decode keys, ``"first"`` or
    ``"last"`` (the remainder chunk, the shortest; the sweep times both); None: "last" under
    ``SPLIT_RULE`` "wave", else "first".

    The engine launches live_only for every KV dtype: the masked form crashed served FP8
    runs at n=512 (cause not found; docs/baselines.md) and stays as the sweep's comparison."""
    if decode_split is None:
        decode_split = "last" if SPLIT_RULE == "wave" else "first"
    if decode_split not in ("first", "last"):
        raise ValueError(f"decode_split must be 'first' or 'last', got {decode_split!r}")
    auto = launch_settings(k_pool.dtype, q.dtype, q.shape[-1])
    block_n = auto["block_n"] if block_n is None else block_n
    num_warps = auto["num_warps"] if num_warps is None else num_warps
    num_stages = auto["num_stages"] if num_stages is None else num_stages
    f16_dot = auto["f16_dot"] if f16_dot is None else f16_dot
    R, hq, d = q.shape
    hkv = k_pool.shape[1]
    assert d == next_pow2(d), "head_dim must be a power of two"
    if out is None:  # contiguous whatever q's strides (q may be a view into the QKV row)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if ctrl is None:
        ctrl = torch.tensor([1, work.shape[0]], dtype=torch.int32, device=q.device)
        splits = 1
    if partials is None:
        partials = alloc_partials(R, hq, d, q.device)
    part_o, part_ml = partials
    part_rows = part_o.numel() // (MAX_SPLITS * hq * d)
    if sms is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    kernel, merge = _kernel()
    grid = (grid_programs(work.shape[0], hkv, sms), hkv)
    kernel[grid](
        q, k_pool, v_pool, slots, work, req_row_start, req_n, req_slot_start, req_len,
        req_step, dk, dv, rows, out, part_o, part_ml, ctrl, part_rows, scale,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), dk.stride(0),
        dk.stride(1), out.stride(0), out.stride(1),
        G=hq // hkv, HQ=hq, D=d, DEPTH=depth, BLOCK_M=block_m, BLOCK_N=block_n,
        PREC="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 models: no TF32 shortcut
        I64_POOL=k_pool.numel() >= 2**31, I64_DEC=dk.numel() >= 2**31, F16_DOT=f16_dot,
        LIVE_ONLY=live_only, DEC_LAST=decode_split == "last", num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    m_rows = min(R, part_rows)
    if m_rows > 0 and splits != 1:
        merge[(m_rows, hq)](
            part_o, part_ml, ctrl, out, part_rows, m_rows, out.stride(0), out.stride(1),
            HQ=hq, D=d, MAX_S=MAX_SPLITS, num_warps=1,
        )  # fmt: skip
    return out
