"""Shared-prompt beam-decode attention (Triton) vs the reference, with prompt splits (split-K
+ log-sum-exp merge), a persistent grid smaller than the work list, and idle work entries."""

from __future__ import annotations

import math

import pytest
import torch

from flashrec.kernels.beam_attention import (
    beam_decode_attention_ref,
    beam_decode_attention_triton,
    build_work,
)

SMS_LIVE = ((64, True), (1, True), (64, False))


@pytest.mark.parametrize("splits", [1, 3, 8])
def test_beam_attention_matches_reference(triton_backend, splits):
    if triton_backend.device == "cpu":  # loops bounded by loaded values (every prompt loop)
        pytest.skip("Triton 3.6's interpreter cannot take a loaded scalar as a loop bound")
    dev = triton_backend.device
    torch.manual_seed(splits)
    hq, hkv, d, depth, pool, nrows = 4, 2, 16, 3, 600, 40
    kp = torch.randn(pool, hkv, d).to(torch.bfloat16).to(dev)
    vp = torch.randn(pool, hkv, d).to(torch.bfloat16).to(dev)
    dk = torch.randn((nrows + 1) * depth, hkv, d).to(torch.bfloat16).to(dev)
    dv = torch.randn((nrows + 1) * depth, hkv, d).to(torch.bfloat16).to(dev)
    req_n, lens, steps = [5, 20, 1], [17, 300, 5], [0, 2, 1]  # 5 tokens: empty splits
    q = torch.randn(sum(req_n), hq, d).to(torch.bfloat16).to(dev)
    slots = torch.randperm(pool)[: sum(lens)].int().to(dev)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    starts, sstart = i32([0, 5, 25]), i32([0, 17, 317])
    rows = torch.randperm(nrows)[: sum(req_n)].to(dev)
    args = (i32(req_n), sstart, i32(lens), i32(steps))
    ref = beam_decode_attention_ref(q, kp, vp, slots, starts, *args, dk, dv, rows, depth, d**-0.5)
    items = build_work(req_n, hq // hkv, 16, splits)
    work = i32(items + [(-1, 0, 0)] * 3)
    # live_only: the decode-key blocks past a request's step / outside the split that folds
    # them in (the first, or the last: decode_split) are branched around (the engine's
    # launch) or computed masked; every form must equal the reference
    # (sms, live_only, decode_split); sms 1: 2 programs walk every item
    forms = [(sms, live, dec) for dec in ("first", "last") for sms, live in SMS_LIVE]
    for sms, live, dec in forms:
        out = beam_decode_attention_triton(
            q, kp, vp, slots, work, starts, *args, dk, dv, rows, depth, d**-0.5,
            block_m=16, block_n=16, ctrl=i32([splits, len(items) + 3]), sms=sms, splits=splits,
            live_only=live, decode_split=dec,
        )  # fmt: skip
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["fp8", "bf16"])
def test_engine_launch_settings_match_reference(kv):
    """The engine's launch (``launch_settings``: FP8 KV takes 128-key blocks and float16
    products, BF16 KV 3 pipeline stages) at OneRec-1.7B head shapes, with prompts longer than
    one key block and ragged, against the reference; for FP8 KV, the float16 products also
    against the bfloat16 ones."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = "cuda"
    torch.manual_seed(7)
    dt = torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
    hq, hkv, d, depth = 16, 8, 128, 3
    req_n, lens, steps = [64, 7, 130], [300, 129, 1000], [2, 0, 1]
    pool, nrows = sum(lens) + 50, sum(req_n) + 5
    kp = torch.randn(pool, hkv, d, device=dev).to(dt)
    vp = torch.randn(pool, hkv, d, device=dev).to(dt)
    dk = torch.randn(nrows * depth, hkv, d, device=dev).to(dt)
    dv = torch.randn(nrows * depth, hkv, d, device=dev).to(dt)
    q = torch.randn(sum(req_n), hq, d, device=dev, dtype=torch.bfloat16)
    slots = torch.randperm(pool, device=dev)[: sum(lens)].int()
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    starts = i32([0, 64, 71])
    args = (i32(req_n), i32([0, 300, 429]), i32(lens), i32(steps))
    rows = torch.randperm(nrows, device=dev)[: sum(req_n)]
    ref = beam_decode_attention_ref(q, kp, vp, slots, starts, *args, dk, dv, rows, depth, d**-0.5)
    work = i32(build_work(req_n, hq // hkv, 64))
    outs = {}
    for f16 in (None, False):  # None: the engine's launch for this KV dtype
        outs[f16] = beam_decode_attention_triton(
            q, kp, vp, slots, work, starts, *args, dk, dv, rows, depth, d**-0.5, f16_dot=f16
        )
        torch.testing.assert_close(outs[f16].float(), ref.float(), atol=2e-2, rtol=2e-2)
    if kv == "fp8":  # the two product precisions agree to bf16 rounding
        torch.testing.assert_close(outs[None].float(), outs[False].float(), atol=8e-3, rtol=8e-3)


@pytest.mark.gpu
def test_strided_q_equals_contiguous_q():
    """The engine's decode passes q as the view into the fused QKV output (row stride q + k +
    v widths, no copy): the kernel reads it through its strides, and the output is bit-equal
    to the one from a contiguous copy, with FP8 and BF16 KV."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = "cuda"
    torch.manual_seed(11)
    hq, hkv, d, depth = 16, 8, 128, 3
    req_n, lens, steps = [50, 50, 7], [300, 310, 129], [1, 2, 0]
    pool, nrows = sum(lens) + 20, sum(req_n) + 3
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    qkv = torch.randn(sum(req_n), (hq + 2 * hkv) * d, device=dev, dtype=torch.bfloat16)
    q = qkv[:, : hq * d].view(-1, hq, d)
    assert not q.is_contiguous()
    slots = torch.randperm(pool, device=dev)[: sum(lens)].int()
    args = (i32([0, 50, 100]), i32(req_n), i32([0, 300, 610]), i32(lens), i32(steps))
    rows = torch.randperm(nrows, device=dev)[: sum(req_n)]
    work = i32(build_work(req_n, hq // hkv, 64))
    for dt in (torch.float8_e4m3fn, torch.bfloat16):
        kp, vp = (torch.randn(pool, hkv, d, device=dev).to(dt) for _ in range(2))
        dk, dv = (torch.randn(nrows * depth, hkv, d, device=dev).to(dt) for _ in range(2))
        rest = (dk, dv, rows, depth, d**-0.5)
        strided = beam_decode_attention_triton(q, kp, vp, slots, work, *args, *rest)
        dense = beam_decode_attention_triton(q.contiguous(), kp, vp, slots, work, *args, *rest)
        assert strided.is_contiguous()
        assert torch.equal(strided, dense)


@pytest.mark.parametrize("base2", [True, False])
def test_prompt_and_suffix_states_merge_to_the_reference(base2):
    """The decode attention as two attention states (each request's prompt part, each beam's
    own decode keys up to its request's step) merged by their log-sum-exps equals the
    reference; a row's keys past its step are left out, and a merge over any split of one key
    set equals attention over the whole."""
    from flashrec.kernels.beam_merge import (
        attention_state_ref,
        beam_suffix_state,
        merge_attention_states,
    )

    torch.manual_seed(3)
    hq, hkv, d, depth, pool, nrows = 4, 2, 16, 3, 400, 30
    kp, vp = torch.randn(pool, hkv, d), torch.randn(pool, hkv, d)
    dk, dv = torch.randn(nrows * depth, hkv, d), torch.randn(nrows * depth, hkv, d)
    req_n, lens, steps = [5, 12, 3], [17, 200, 6], [0, 2, 1]
    q = torch.randn(sum(req_n), hq, d)
    slots = torch.randperm(pool)[: sum(lens)].int()
    rows = torch.randperm(nrows)[: sum(req_n)]
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    starts, sstart = [0, 5, 17], [0, 17, 217]
    args = (i32(req_n), i32(sstart), i32(lens), i32(steps))
    scale = d**-0.5
    ref = beam_decode_attention_ref(
        q, kp, vp, slots, i32(starts), *args, dk, dv, rows, depth, scale
    )
    o_p, lse_p = torch.empty_like(q), torch.empty(q.shape[:2])
    for a, n, s0, length in zip(starts, req_n, sstart, lens):
        sl = slots[s0 : s0 + length].long()
        o_p[a : a + n], lse_p[a : a + n] = attention_state_ref(
            q[a : a + n], kp[sl], vp[sl], scale, base2
        )
    row_steps = torch.repeat_interleave(torch.tensor(steps), torch.tensor(req_n))
    o_s, lse_s = beam_suffix_state(q, dk, dv, rows, row_steps, depth, scale, base2)
    o, _ = merge_attention_states(o_p, lse_p, o_s, lse_s, base2)
    torch.testing.assert_close(o, ref, atol=1e-5, rtol=1e-5)
    # every key live (step depth - 1 for all) is another answer: the step mask is read
    o_all, _ = beam_suffix_state(
        q, dk, dv, rows, torch.full_like(row_steps, depth - 1), depth, scale
    )
    assert (o_all - o_s)[:5].abs().max() > 1e-3  # request 0 is at step 0
    # merging two halves of one key set is attention over all of it
    k, v = kp[:50], vp[:50]
    whole, lse_w = attention_state_ref(q, k, v, scale, base2)
    a, b = (
        attention_state_ref(q, k[:20], v[:20], scale, base2),
        attention_state_ref(q, k[20:], v[20:], scale, base2),
    )
    merged, lse_m = merge_attention_states(*a, *b, base2)
    torch.testing.assert_close(merged, whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse_m, lse_w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_suffix_merge_kernel_completes_a_prompt_state(triton_backend, kv):
    """The suffix + merge kernel, given each request's prompt state (o, base-2 LSE) as
    FlashInfer's prefill returns it, gives the whole beam-decode attention (the reference),
    with q a strided view into the QKV row and FP8 or BF16 decode KV, one program per kv head
    or per row; a natural-log LSE converts when told."""
    from flashrec.kernels.beam_merge import (
        attention_state_ref,
        beam_suffix_merge_ref,
        beam_suffix_merge_triton,
    )

    dev = triton_backend.device
    torch.manual_seed(5)
    dt = torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
    hq, hkv, d, depth, pool, nrows = 4, 2, 16, 3, 300, 40
    kp = torch.randn(pool, hkv, d).to(dt)
    vp = torch.randn(pool, hkv, d).to(dt)
    dk = torch.randn(nrows * depth, hkv, d).to(dt)
    dv = torch.randn(nrows * depth, hkv, d).to(dt)
    req_n, lens, steps = [5, 12, 3], [17, 200, 6], [0, 2, 1]
    qkv = torch.randn(sum(req_n), (hq + 2 * hkv) * d).to(torch.bfloat16)
    q = qkv[:, : hq * d].view(-1, hq, d)
    slots = torch.randperm(pool)[: sum(lens)].int()
    rows = torch.randperm(nrows)[: sum(req_n)]
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    starts, sstart = [0, 5, 17], [0, 17, 217]
    scale = d**-0.5
    row_steps = torch.repeat_interleave(torch.tensor(steps), torch.tensor(req_n))
    out_loc = rows * depth + row_steps
    o_p, lse_p = torch.empty(q.shape), torch.empty(q.shape[:2])
    for a, n, s0, length in zip(starts, req_n, sstart, lens):
        sl = slots[s0 : s0 + length].long()
        o_p[a : a + n], lse_p[a : a + n] = attention_state_ref(q[a : a + n], kp[sl], vp[sl], scale)
    o_p = o_p.to(torch.bfloat16)
    ref = beam_decode_attention_ref(
        q, kp, vp, slots, i32(starts), i32(req_n), i32(sstart), i32(lens), i32(steps),
        dk, dv, rows, depth, scale,
    )  # fmt: skip
    want = beam_suffix_merge_ref(q, o_p, lse_p, dk, dv, rows, out_loc, depth, scale)
    torch.testing.assert_close(want.float(), ref.float(), atol=2e-2, rtol=2e-2)
    to = lambda x: x.to(dev)  # noqa: E731
    args = (to(dk), to(dv), to(rows), to(out_loc), depth, scale)
    got = beam_suffix_merge_triton(to(q), to(o_p), to(lse_p), *args)
    assert got.is_contiguous()
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got.cpu().float(), ref.float(), atol=2e-2, rtol=2e-2)
    # one program per row for all heads: the same values (same math, other grouping)
    every = beam_suffix_merge_triton(to(q), to(o_p), to(lse_p), *args, all_heads=True)
    torch.testing.assert_close(every.cpu().float(), got.cpu().float(), atol=1e-2, rtol=1e-2)
    ln = beam_suffix_merge_triton(to(q), to(o_p), to(lse_p * math.log(2)), *args, lse_base2=False)
    torch.testing.assert_close(ln.cpu().float(), got.cpu().float(), atol=1e-2, rtol=1e-2)


def test_stage_prompt_kv_copies_the_listed_rows(triton_backend):
    """The staging kernel (FP8 pool -> BF16 rows in batch order) equals the reference bit for
    bit (e4m3 -> bf16 is exact), zeroes the ``tail`` rows after them (clipped at the
    capacity) and writes nothing else (the count read on the device), and a grid smaller
    than the rows walks them all."""
    from flashrec.kernels.beam_merge import stage_prompt_kv_ref, stage_prompt_kv_triton

    dev = triton_backend.device
    torch.manual_seed(8)
    pool, hkv, d, cap = 500, 2, 16, 300
    kp = torch.randn(pool, hkv, d).to(torch.float8_e4m3fn).to(dev)
    vp = torch.randn(pool, hkv, d).to(torch.float8_e4m3fn).to(dev)
    slots = torch.randint(0, pool, (cap,), dtype=torch.int32).to(dev)  # repeats allowed
    for n, sms, tail in ((217, 132, 13), (300, 1, 13), (0, 4, 13), (290, 2, 40), (100, 3, 0)):
        ok = torch.full((cap, hkv, d), float("nan"), dtype=torch.bfloat16, device=dev)
        ov = torch.full_like(ok, 7.0)
        nt = torch.tensor([n], dtype=torch.int32, device=dev)
        stage_prompt_kv_triton(kp, vp, slots, nt, ok, ov, sms=sms, tail=tail)
        rk, rv = stage_prompt_kv_ref(kp, vp, slots, n)
        assert torch.equal(ok[:n].cpu(), rk.cpu()) and torch.equal(ov[:n].cpu(), rv.cpu())
        end = min(cap, n + tail)
        assert bool((ok[n:end] == 0).all()) and bool((ov[n:end] == 0).all())
        assert bool(ok[end:].isnan().all()) and bool((ov[end:] == 7.0).all())


def test_decode_split_names_its_choices():
    with pytest.raises(ValueError, match="decode_split must be 'first' or 'last', got 'middle'"):
        beam_decode_attention_triton(*[None] * 15, decode_split="middle")
