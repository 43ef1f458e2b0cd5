"""The SDPA prefill shared by every backend (grouped equal-length prompts, cached prefixes)
equals the explicit-softmax reference."""

from __future__ import annotations

import torch

from flashrec.config import ModelConfig
from flashrec.engine.meta import make_prefill_meta
from flashrec.kvcache.pool import KVCache
from flashrec.layers.attention import TorchAttention, prefill_reference

# (prefix_len, new_len): equal-length plain prompts are batched, prefixed ones go alone
SHAPES = [(0, 7), (0, 7), (5, 3), (0, 11), (9, 1)]


def _seqs(shapes) -> list[tuple[int, list[int], list[int]]]:
    """(prefix_len, new slots, all slots) per prompt, the prompts' slots side by side."""
    seqs, nxt = [], 0
    for pre, new in shapes:
        slots = list(range(nxt, nxt + pre + new))
        nxt += pre + new
        seqs.append((pre, slots[pre:], slots))
    return seqs


def test_prefill_matches_reference():
    torch.manual_seed(0)
    cfg = ModelConfig("Qwen3ForCausalLM", 64, 1, 4, 2, 16, 128, 100, 1e-6, 1e6, 4096, True)
    kv = KVCache(cfg, 512, 8, 3, torch.float32, "cpu")
    seqs = _seqs(SHAPES)
    meta = make_prefill_meta(seqs, "cpu")
    t = sum(n for _, n in SHAPES)
    q, k, v = (torch.randn(t, h, 16) for h in (4, 2, 2))
    for pre, _, slots in seqs:  # cached prefixes already in the pool
        if pre:
            kv.k[0][slots[:pre]] = torch.randn(pre, 2, 16)
            kv.v[0][slots[:pre]] = torch.randn(pre, 2, 16)
    backend = TorchAttention(kv, 4, 2, 16)
    got = backend.forward(q, k, v, 0, meta)  # stores the new K/V, then attends
    ref = prefill_reference(backend, q, 0, meta)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_prefill_takes_row_strided_views():
    """The model hands the SDPA prefill q / k / v as views into the fused QKV rows (no
    contiguous copy of q first: ``takes_strided_q``); the result equals the one from
    contiguous inputs, on every path (batched equal lengths, lone prompts, cached prefixes)."""
    torch.manual_seed(1)
    cfg = ModelConfig("Qwen3ForCausalLM", 64, 1, 4, 2, 16, 128, 100, 1e-6, 1e6, 4096, True)
    seqs = _seqs(SHAPES)
    t = sum(n for _, n in SHAPES)
    qkv = torch.randn(t, (4 + 2 + 2) * 16 + 8)  # padded row, like a GEMM output slice
    q = qkv[:, :64].view(t, 4, 16)
    k = qkv[:, 64:96].view(t, 2, 16)
    v = qkv[:, 96:128].view(t, 2, 16)
    assert not q.is_contiguous()
    outs = []
    for strided in (True, False):
        kv = KVCache(cfg, 512, 8, 3, torch.float32, "cpu")
        torch.manual_seed(2)
        for pre, _, slots in seqs:
            if pre:
                kv.k[0][slots[:pre]] = torch.randn(pre, 2, 16)
                kv.v[0][slots[:pre]] = torch.randn(pre, 2, 16)
        backend = TorchAttention(kv, 4, 2, 16)
        meta = make_prefill_meta(seqs, "cpu")
        assert backend.takes_strided_q(meta)
        args = (q, k, v) if strided else (q.contiguous(), k.contiguous(), v.contiguous())
        outs.append(backend.forward(*args, 0, meta))
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)


def test_equal_length_prefill_reads_the_rows_without_copies():
    """Prompts all new and of one length (one prompt, or a batch of them: a prefill graph's
    bucket) go through one SDPA call over head-major views of the QKV rows, kv heads shared
    through ``enable_gqa``: the result equals the reference and the attention makes no copy
    (no contiguous q, no kv heads repeated, no output copied back to token rows)."""
    from torch.profiler import profile

    cfg = ModelConfig("Qwen3ForCausalLM", 64, 1, 4, 2, 16, 128, 100, 1e-6, 1e6, 4096, True)
    for shapes in ([(0, 9)], [(0, 6)] * 3):
        torch.manual_seed(3)
        seqs = _seqs(shapes)
        t = sum(n for _, n in shapes)
        qkv = torch.randn(t, (4 + 2 + 2) * 16 + 8)  # padded row, like a GEMM output slice
        q = qkv[:, :64].view(t, 4, 16)
        k = qkv[:, 64:96].view(t, 2, 16)
        v = qkv[:, 96:128].view(t, 2, 16)
        kv = KVCache(cfg, 512, 8, 3, torch.float32, "cpu")
        backend = TorchAttention(kv, 4, 2, 16)
        meta = make_prefill_meta(seqs, "cpu")
        backend.store(k, v, 0, meta)
        with profile() as prof:
            got = backend.prefill(q, k, v, 0, meta)
        ops = [e.name for e in prof.events()]
        copies = [o for o in ops if o in ("aten::copy_", "aten::clone", "aten::repeat_interleave")]
        assert copies == [], copies
        assert got.shape == (t, 64)
        torch.testing.assert_close(
            got, prefill_reference(backend, q, 0, meta), atol=1e-5, rtol=1e-5
        )
