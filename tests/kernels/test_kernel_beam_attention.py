"""Shared-prompt beam-decode attention (Triton) vs the reference, with prompt splits (split-K
+ log-sum-exp merge), a persistent grid smaller than the work list, and idle work entries."""

from __future__ import annotations

import pytest
import torch

from flashrec.kernels.beam_attention import (
    beam_decode_attention_ref,
    beam_decode_attention_triton,
    build_work,
)


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
    for sms in (64, 1):  # 1: two programs per kv head walk every item
        out = beam_decode_attention_triton(
            q, kp, vp, slots, work, starts, *args, dk, dv, rows, depth, d**-0.5,
            block_m=16, block_n=16, ctrl=i32([splits, len(items) + 3]), sms=sms, splits=splits,
        )  # fmt: skip
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
