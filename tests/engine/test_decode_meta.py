"""Decode metadata built on the host and shipped in one copy equals the per-request layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashrec.engine.meta import BLOCK_M, make_decode_meta, make_prefill_meta


def test_decode_meta_layout_and_packed_kernel_metadata():
    depth = 4
    reqs = [  # rows, prompt slots, step, position
        (np.array([5, 2, 9]), np.array([10, 11, 12, 13]), 0, 4),
        (np.array([0]), np.array([20, 21]), 2, 4),
        (np.arange(70, 70 + 40), np.arange(100, 107), 1, 8),
    ]
    groups_in = [(r, s, torch.from_numpy(s), st, p) for r, s, st, p in reqs]
    meta = make_decode_meta(groups_in, depth, "cpu", packed=True, group_size=2)
    assert meta.positions.tolist() == [4] * 3 + [4] + [8] * 40
    assert meta.rows.tolist() == [5, 2, 9, 0] + list(range(70, 110))
    assert meta.out_loc.tolist() == [5 * 4, 2 * 4, 9 * 4, 0 * 4 + 2] + [
        r * 4 + 1 for r in range(70, 110)
    ]
    assert [(g.start, g.end, g.step) for g in meta.groups] == [(0, 3, 0), (3, 4, 2), (4, 44, 1)]
    pk = meta.packed
    assert pk.slots.dtype == torch.int32
    assert pk.slots.tolist() == [10, 11, 12, 13, 20, 21] + list(range(100, 107))
    assert pk.row_start.tolist() == [0, 3, 4] and pk.n.tolist() == [3, 1, 40]
    assert pk.slot_start.tolist() == [0, 4, 6] and pk.length.tolist() == [4, 2, 7]
    assert pk.step.tolist() == [0, 2, 1]
    blocks = [(2 * n + BLOCK_M - 1) // BLOCK_M for n in (3, 1, 40)]
    assert pk.work.tolist() == [[i, b, 0] for i, k in enumerate(blocks) for b in range(k)]
    assert pk.splits == 1 and pk.ctrl.tolist() == [1, len(blocks) + 1]
    # the host copies a backend that plans on the host (FlashInfer) reads
    ns, lens, slots = meta.host
    assert ns.tolist() == [3, 1, 40] and lens.tolist() == [4, 2, 7]
    assert slots.tolist() == pk.slots.tolist()


def test_decode_meta_splits_the_prompt_when_the_batch_is_narrow():
    """One request, few blocks, long prompt, many SMs: the work list carries every block once
    per split; wide batches (> SPLIT_MAX_ROWS rows, e.g. a padded graph bucket) never split."""
    from flashrec.kernels.beam_attention import MAX_SPLITS, SPLIT_MAX_ROWS

    slots = np.arange(1000)
    g = [(np.arange(256), slots, torch.from_numpy(slots), 0, 1000)]
    meta = make_decode_meta(g, 4, "cpu", packed=True, group_size=2, num_kv_heads=8, sms=132)
    pk = meta.packed
    blocks = (2 * 256) // BLOCK_M  # 8 blocks x 8 kv heads = 64 programs for 132 SMs
    # the "wave" rule: as many splits as keep 64 programs each in one wave of 2 x 132
    assert pk.splits == min(MAX_SPLITS, 264 // 64, 1000 // 128) == 4
    assert pk.work.tolist() == [[0, b, s] for b in range(blocks) for s in range(4)]
    assert pk.ctrl.tolist() == [4, blocks * 4]
    wide = make_decode_meta(
        g, 4, "cpu", packed=True, group_size=2, num_kv_heads=8, sms=132,
        split_rows=SPLIT_MAX_ROWS + 1,
    )  # fmt: skip
    assert wide.packed.splits == 1 and wide.packed.work.shape[0] == blocks
    short = [(np.arange(256), slots[:200], torch.from_numpy(slots[:200]), 0, 200)]
    assert make_decode_meta(short, 4, "cpu", True, 2, 8, 132).packed.splits == 1  # 200 // 128


def test_split_rules():
    """The "wave" rule keeps a one-request batch's programs in one wave of two per SM (the
    split counts that timed fastest for 128-512 beams over 500-5,000 tokens); "fill" (the
    rule before) asks for at least two programs per SM, a partial second wave."""
    from flashrec.kernels.beam_attention import choose_splits

    # (blocks of 64 query rows, prompt tokens) -> (wave, fill) on 132 SMs with 8 kv heads
    cases = {(8, 1026): (4, 5), (16, 2465): (2, 3), (4, 1026): (8, 8), (8, 500): (3, 3),
             (32, 1026): (1, 2), (20, 5000): (1, 2)}  # fmt: skip
    for (blocks, length), (wave, fill) in cases.items():
        assert choose_splits(blocks, 8, 64 * blocks // 2, length, 132, rule="wave") == wave
        assert choose_splits(blocks, 8, 64 * blocks // 2, length, 132, rule="fill") == fill
    assert choose_splits(8, 8, 2048, 5000, 132, rule="wave") == 1  # wide: never split


def test_prefill_meta():
    meta = make_prefill_meta([(0, [7, 8, 9], [7, 8, 9]), (2, [3], [1, 2, 3])], "cpu")
    assert meta.positions.tolist() == [0, 1, 2, 2]
    assert meta.out_loc.tolist() == [7, 8, 9, 3]
    assert meta.last_index.tolist() == [2, 3]
    assert [s.tolist() for s in meta.seq_slots] == [[7, 8, 9], [1, 2, 3]]
    assert meta.input_ids is None
    meta = make_prefill_meta([(0, [7, 8], [7, 8]), (1, [3], [1, 3])], "cpu", ids=[11, 12, 13])
    assert meta.input_ids.tolist() == [11, 12, 13] and meta.input_ids.dtype == torch.long
    assert meta.out_loc.tolist() == [7, 8, 3] and meta.positions.tolist() == [0, 1, 1]


def test_decode_max_splits_caps_the_split_count():
    from flashrec.config import EngineConfig

    slots = np.arange(1000)
    g = [(np.arange(256), slots, torch.from_numpy(slots), 0, 1000)]
    for cap, want in ((1, 1), (2, 2), (8, 4)):
        meta = make_decode_meta(g, 4, "cpu", True, 2, 8, 132, max_splits=cap)
        assert meta.packed.splits == want
    with pytest.raises(ValueError, match="decode-max-splits"):
        EngineConfig(model_path="x", decode_max_splits=9)


def test_flashinfer_decode_prompt_needs_the_flashinfer_backend(tiny_model):
    """--decode-prompt-attention flashinfer on an engine whose attention backend is not
    FlashInfer (here the CPU's torch backend) is refused at start, naming both flags; auto
    resolves to triton there and says so in the server info."""
    import dataclasses

    from flashrec.config import EngineConfig
    from flashrec.engine.engine import Engine

    cfg = EngineConfig(
        model_path=str(tiny_model), sid_vocab_file=str(tiny_model / "catalog.json"),
        device="cpu", decode_prompt_attention="flashinfer",
    )  # fmt: skip
    with pytest.raises(ValueError, match="needs --attention-backend flashinfer.*runs torch"):
        Engine(cfg)
    # auto (the default) takes the Triton kernel's place only where FlashInfer runs
    auto = Engine(dataclasses.replace(cfg, decode_prompt_attention="auto"))
    assert auto.runner.decode_prompt_attention == "triton"
    assert not hasattr(auto.runner.attn, "decode_prompt")
    assert auto.server_info()["decode_prompt_attention"] == "triton"
    with pytest.raises(ValueError, match="decode-prompt-attention"):
        EngineConfig(model_path="x", decode_prompt_attention="cudnn")
    # the kernel depends on the batch's width: not under --deterministic
    with pytest.raises(ValueError, match="--deterministic.*leave it at auto or triton"):
        EngineConfig(model_path="x", decode_prompt_attention="flashinfer", deterministic=True)


def test_decode_prompt_auto_takes_flashinfer_where_it_was_measured_to_win():
    """auto: the flashinfer backend on Hopper, a BF16 pool at any beam width, an FP8 pool from
    256 beams (the served A/Bs: n=256 and 512 won, n=50 lost); never deterministic, never
    another backend, GPU or KV dtype."""
    from flashrec.engine.attention_choice import FP8_DECODE_PROMPT_MIN_BEAMS, decode_prompt_auto

    bf, f8 = torch.bfloat16, torch.float8_e4m3fn
    wide = FP8_DECODE_PROMPT_MIN_BEAMS
    assert wide == 256
    assert decode_prompt_auto("flashinfer", bf, True, False, 50) == "flashinfer"
    assert decode_prompt_auto("flashinfer", f8, True, False, wide) == "flashinfer"
    assert decode_prompt_auto("flashinfer", f8, True, False, 512) == "flashinfer"
    assert decode_prompt_auto("flashinfer", f8, True, False, wide - 1) == "triton"
    assert decode_prompt_auto("flashinfer", f8, True, False, 50) == "triton"
    for args in (
        ("flashinfer", bf, False, False, 512),  # not Hopper: fa2, not measured to win
        ("flashinfer", bf, True, True, 512),  # --deterministic
        ("flashinfer", f8, True, True, 512),
        ("triton", bf, True, False, 512),
        ("torch", bf, False, False, 512),
        ("flashinfer", torch.float16, True, False, 512),
    ):
        assert decode_prompt_auto(*args) == "triton", args


def test_an_auto_sized_pool_leaves_room_for_the_fp8_staging_buffer(monkeypatch):
    """The FP8 staging buffer of --decode-prompt-attention flashinfer (K and V of every pool
    token as bfloat16) is counted per pool token when the pool is sized from free memory; no
    other mode or KV dtype keeps one."""
    from types import SimpleNamespace

    from flashrec.engine.attention_choice import staging_bytes_per_token

    mc = SimpleNamespace(num_key_value_heads=8, head_dim=128)  # OneRec-1.7B's KV heads
    f8, bf = torch.float8_e4m3fn, torch.bfloat16
    assert staging_bytes_per_token("flashinfer", f8, mc) == 2 * 8 * 128 * 2
    # the runner's sizing from free memory (a GPU's numbers, faked): the pool plus the staging
    # buffer fit the budget the pool alone had
    from flashrec.engine.runner import ModelRunner

    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * gib, 140 * gib))
    cfg = SimpleNamespace(kv_pool_tokens=None, mem_fraction_static=0.9, resolved_batch_slots=512)
    runner = SimpleNamespace(config=cfg, device=torch.device("cuda"), depth=3)
    one = SimpleNamespace(kv_bytes_per_token=lambda size: 2 * 8 * 128 * 28 * size)
    per_token, staging = one.kv_bytes_per_token(1), staging_bytes_per_token("flashinfer", f8, mc)
    plain = ModelRunner._pool_tokens(runner, one, f8)
    staged = ModelRunner._pool_tokens(runner, one, f8, staging)
    budget = 100 * gib - 0.1 * 140 * gib - 2 * 512 * 3 * per_token
    assert plain == int(budget // per_token)
    assert staged * (per_token + staging) <= budget < (staged + 1) * (per_token + staging)
    assert staged < plain
    assert staging_bytes_per_token("flashinfer", bf, mc) == 0
    assert staging_bytes_per_token("triton", f8, mc) == 0


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(1, 128), min_size=1, max_size=40),  # beams of each running request
    st.lists(st.integers(1, 3000), min_size=40, max_size=40),  # their prompt lengths
    st.sampled_from([(2, 8), (4, 2), (1, 4)]),  # (q heads per kv head, kv heads)
    st.sampled_from([512, 2048]),  # largest bucket: split-capable / not
)
def test_graph_buffers_hold_every_batch_that_fits_a_bucket(beams, lens, heads, max_bs):
    """The decode graph's static buffers (work list, prompt slots) are sized per bucket; any
    batch whose rows fit the bucket must fit them, whatever the mix of beam widths, prompt
    lengths (shared prefixes repeat slots) and split counts."""
    from types import SimpleNamespace

    from flashrec.engine.graph import DecodeGraphRunner

    group, hkv = heads
    cfg = SimpleNamespace(beam_width=16, cuda_graph_max_bs=max_bs, max_seq_len=3000)
    kv = SimpleNamespace(row_slots=max_bs, depth=4, pool_tokens=1000, scratch_row=max_bs)
    mc = SimpleNamespace(num_attention_heads=group * hkv, num_key_value_heads=hkv)
    runner = SimpleNamespace(
        config=cfg, kv=kv, model_config=mc, device=torch.device("cpu"), step=None
    )
    gr = DecodeGraphRunner(runner, BLOCK_M)
    rows, groups = 0, []
    for n, length in zip(beams, lens):
        if rows + n > gr.sizes[-1]:
            break
        slots = np.arange(length) % kv.pool_tokens  # shared prefixes: slots repeat
        groups.append((np.arange(rows, rows + n), slots, torch.from_numpy(slots), 1, length))
        rows += n
    size = gr.bucket(rows)
    meta = make_decode_meta(
        groups, kv.depth, "cpu", packed=True, group_size=group, num_kv_heads=hkv, sms=132,
        split_rows=size,
    )  # fmt: skip
    pk = meta.packed
    assert pk.work.shape[0] <= gr._num_work(size)  # noqa: SLF001
    assert pk.slots.shape[0] <= gr.slots.shape[0]
    assert pk.n.shape[0] <= gr.head.shape[1]


def _offsets_aligned(tensors) -> bool:
    """Every view starts at a 16-byte offset of the one buffer they share."""
    base = min(t.untyped_storage().data_ptr() for t in tensors)
    return all((t.data_ptr() - base) % 16 == 0 for t in tensors)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
)  # cuda: filled in page-locked memory, copied asynchronously
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32])
def test_host_to_device_views_start_on_16_byte_boundaries(dtype, device):
    """Triton specializes kernels on pointer alignment: a view whose alignment depended on the
    batch (an odd token count before it) switched the fused q/k norm + RoPE + KV-write kernel
    between two compiled variants, and the first batch of the unseen kind compiled mid-run.
    The padding between views is zero, never left over from an earlier use."""
    from flashrec.engine.meta import host_to_device

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    arrays = [np.arange(n, dtype=dtype) + 10 * n for n in (3, 0, 1, 5, 2, 7)]
    for _ in range(3):  # the pinned blocks are reused: every fill is whole
        views = host_to_device([a * 0 - 1 for a in arrays], device, dtype)
        views = host_to_device(arrays, device, dtype)
    assert [v.tolist() for v in views] == [a.tolist() for a in arrays]
    assert all(v.dtype == torch.from_numpy(arrays[0]).dtype for v in views)
    assert all(v.device.type == device for v in views)
    assert len({v.untyped_storage().data_ptr() for v in views}) == 1  # one buffer, one copy
    assert _offsets_aligned([v for v in views if v.numel()])
    whole = torch.tensor([], dtype=views[0].dtype, device=device).set_(views[0].untyped_storage())
    covered = sum(v.numel() for v in views)
    assert int((whole != 0).sum()) <= covered  # only the arrays' own values are nonzero
    assert whole.numel() > covered  # there is padding (3 + 0 + 1 + 5 + 2 + 7 is not aligned)


def test_prefill_and_decode_meta_fields_are_aligned_for_odd_sizes():
    seqs = [(0, [7, 8, 9], [7, 8, 9]), (2, [1, 2], [5, 6, 1, 2])]  # 5 new tokens: odd
    meta = make_prefill_meta(seqs, "cpu", ids=[11, 12, 13, 14, 15])
    fields = [meta.positions, meta.out_loc, meta.last_index, meta.input_ids, *meta.seq_slots]
    assert _offsets_aligned(fields)
    assert meta.out_loc.tolist() == [7, 8, 9, 1, 2] and meta.positions.tolist() == [0, 1, 2, 2, 3]
    reqs = [(np.array([5, 2, 9]), np.array([10, 11, 12])), (np.array([0]), np.arange(20, 25))]
    groups_in = [(r, s, torch.from_numpy(s), 1, len(s)) for r, s in reqs]
    dm = make_decode_meta(groups_in, 4, "cpu", packed=True, group_size=2)
    pk = dm.packed
    assert _offsets_aligned([dm.positions, dm.rows, dm.out_loc])
    assert _offsets_aligned([pk.slots, pk.row_start, pk.n, pk.slot_start, pk.length, pk.step,
                             pk.work, pk.ctrl])  # fmt: skip
