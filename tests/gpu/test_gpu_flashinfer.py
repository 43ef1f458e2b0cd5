"""GPU checks of the FlashInfer backend (skipped where flashinfer is not installed): ragged
prefill against the reference, plans made ahead of the GPU, the whole engine against the torch
backend, FP8 KV cold against warm."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import (
    HD128,
    PROMPTS,
    bf16_knobs,
    flashinfer_or_skip,
    make_engine,
    median_gap,
    run_all,
    similar_results,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_flashinfer_prefill_matches_reference_with_cached_prefixes(kv_dtype):
    """Ragged prefill of mixed sequences (no prefix, short and long cached prefixes, unequal
    lengths) equals the explicit-softmax reference over the same pool."""
    flashinfer_or_skip()
    from types import SimpleNamespace

    from flashrec.engine.runner import make_prefill_meta
    from flashrec.layers.attention import TorchAttention, prefill_reference
    from flashrec.layers.attention_flashinfer import FlashInferAttention

    torch.manual_seed(0)
    hq, hkv, d, pool = 16, 8, 128, 12000
    kv = SimpleNamespace(
        k=[torch.zeros(pool, hkv, d, device="cuda", dtype=kv_dtype)],
        v=[torch.zeros(pool, hkv, d, device="cuda", dtype=kv_dtype)],
        dtype=kv_dtype,
        depth=3,
    )
    perm = torch.randperm(pool).tolist()
    seqs, used = [], 0
    for pre, new in [(0, 2465), (0, 700), (512, 300), (0, 1), (2000, 37), (64, 2465)]:
        slots = perm[used : used + pre + new]
        used += pre + new
        seqs.append((pre, slots[pre:], slots))
    for pre, _, slots in seqs:  # cached prefixes already in the pool
        if pre:
            idx = torch.tensor(slots[:pre], device="cuda")
            kv.k[0][idx] = torch.randn(pre, hkv, d, device="cuda").to(kv_dtype)
            kv.v[0][idx] = torch.randn(pre, hkv, d, device="cuda").to(kv_dtype)
    meta = make_prefill_meta(seqs, "cuda")
    t = meta.out_loc.shape[0]
    # q/k/v as row-strided views of one fused QKV buffer, as the model hands them over
    qkv = torch.randn(t, (hq + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    fi = FlashInferAttention(kv, hq, hkv, d)
    out = fi.forward(q, k, v, 0, meta)  # stores the new K/V, then attends
    ref = prefill_reference(TorchAttention(kv, hq, hkv, d), q, 0, meta)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    # and the base class's SDPA path (the triton backend's prefill) agrees on the same inputs
    base = TorchAttention(kv, hq, hkv, d).prefill(q, k, v, 0, meta)
    torch.testing.assert_close(out.float(), base.float(), atol=2e-2, rtol=2e-2)


def test_flashinfer_forwards_planned_ahead_of_the_gpu_each_run_their_own_plan():
    """The engine's host plans prefill forwards while the GPU is still behind (nothing syncs per
    step). Here a sleep kernel holds the stream while four forwards of different lengths are
    planned and queued; each output must equal the same forward run alone. With one wrapper
    replanned each forward, a later plan rewrote the page-locked plan buffer before the earlier
    forward's copy ran (the n=512 crashes of sessions 11-12); the plan ring keeps them apart and
    waits once the host is a ring ahead (the fourth plan here)."""
    flashinfer_or_skip()
    from types import SimpleNamespace

    from flashrec.engine.runner import make_prefill_meta
    from flashrec.layers.attention_flashinfer import PLAN_RING, FlashInferAttention

    torch.manual_seed(0)
    hq, hkv, d, pool = 16, 8, 128, 16000
    kv = SimpleNamespace(
        k=[torch.zeros(pool, hkv, d, device="cuda", dtype=torch.bfloat16)],
        v=[torch.zeros(pool, hkv, d, device="cuda", dtype=torch.bfloat16)],
        dtype=torch.bfloat16,
        depth=3,
    )
    fi = FlashInferAttention(kv, hq, hkv, d)
    batches, used = [], 0
    for lens in ([2465, 700], [37], [1200, 1200, 64], [5, 900, 2000]):
        seqs = []
        for n in lens:
            slots = list(range(used, used + n))
            used += n
            seqs.append((0, slots, slots))
        t = sum(lens)
        qkv = torch.randn(t, (hq + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
        batches.append((seqs, qkv))
    assert len(batches) > PLAN_RING  # the last plan finds its wrapper's plan still queued

    def forward(seqs, qkv):
        meta = make_prefill_meta(seqs, "cuda")  # a new meta: the forward plans again
        t = qkv.shape[0]
        q = qkv[:, : hq * d].view(t, hq, d)
        k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
        v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
        return fi.forward(q, k, v, 0, meta)

    alone = []
    for b in batches:
        alone.append(forward(*b).clone())
        torch.cuda.synchronize()
    waits = fi._ring.waits
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time: every plan below runs ahead of it
    ahead = [forward(*b) for b in batches]
    torch.cuda.synchronize()
    for got, want in zip(ahead, alone):  # a forward run on another's plan is far off (or faults)
        torch.testing.assert_close(got, want)
    assert fi._ring.waits > waits


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama", "tiny-qwen2"])
def test_flashinfer_backend_equals_torch_backend(synth_model, preset):
    """Whole engine, bf16: flashinfer backend (with graphs) vs torch backend (eager), cold
    cache and then a warm radix hit on every prompt (the cached-prefix prefill path)."""
    flashinfer_or_skip()
    path = synth_model(preset, catalog_size=2000, **HD128)
    a = run_all(path, dtype="bfloat16", quantization="none", attention_backend="torch",
             disable_cuda_graph=True)  # fmt: skip
    eng = make_engine(path, **bf16_knobs("none", "flashinfer"))
    assert eng.runner.attention_backend == "flashinfer"
    for _ in range(2):  # second pass: every prompt hits the radix cache
        reqs = [
            eng.new_request(eng.build_prompt(messages=p), n=n)
            for p in PROMPTS
            for n in (1, 4, 16, 64)
        ]
        b = eng.generate(reqs)
        similar_results(a, b)
    assert eng.scheduler.stats.prefix_hit_tokens_total > 0


def test_flashinfer_fp8_kv_cold_prefill_equals_warm_hit(synth_model):
    """FP8 KV + FlashInfer: a cold prefill reads k/v from the QKV row (written back rounded by
    the fused kernel, PrefillMeta.kv_rounded); a warm radix hit gathers them from the pool.
    Both must see the same values: the same beams, and the fp8 kernel path actually taken."""
    flashinfer_or_skip()
    path = synth_model("tiny", catalog_size=2000, **HD128)
    eng = make_engine(path, **bf16_knobs("fp8", "flashinfer"))
    assert eng.runner._prefill_reads_qkv
    runs = []
    for _ in range(2):  # cold, then every prompt hits the radix cache
        reqs = [eng.new_request(eng.build_prompt(messages=p), n=16) for p in PROMPTS]
        runs.append(eng.generate(reqs))
    assert eng.scheduler.stats.prefix_hit_tokens_total > 0
    similar_results(runs[0], runs[1], tol=2e-2, overlap=0.9)


def _decode_batch(kv, spec, hq, seed, shared=False):
    """A decode batch over ``kv``'s pool: per request (beams, prompt tokens, step); returns
    (meta, q as a strided view of a QKV row, the reference output). ``shared``: every request's
    prompt starts at the same slots (a shared cached prefix)."""
    import numpy as np

    from flashrec.engine.meta import make_decode_meta
    from flashrec.kernels.beam_attention import beam_decode_attention_ref

    g = torch.Generator().manual_seed(seed)
    hkv, d = kv.k[0].shape[1:]
    perm = torch.randperm(kv.k[0].shape[0], generator=g).numpy()
    rows = torch.randperm(kv.dk[0].shape[0] // kv.depth, generator=g).numpy()
    groups, used, ru = [], 0, 0
    for n, length, step in spec:
        groups.append((rows[ru : ru + n], perm[used : used + length], None, step, length + step))
        used, ru = (0 if shared else used + length), ru + n
    meta = make_decode_meta(groups, kv.depth, "cuda", packed=True, group_size=hq // hkv,
                            num_kv_heads=hkv, sms=132)  # fmt: skip
    r = sum(n for n, _, _ in spec)
    qkv = torch.randn(r, (hq + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
    q = qkv[:, : hq * d].view(r, hq, d)
    pk = meta.packed
    ref = beam_decode_attention_ref(
        q, kv.k[0], kv.v[0], pk.slots, pk.row_start, pk.n, pk.slot_start, pk.length, pk.step,
        kv.dk[0], kv.dv[0], meta.rows, kv.depth, d**-0.5,
    )  # fmt: skip
    assert isinstance(meta.host[0], np.ndarray)
    return meta, q, ref


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_flashinfer_paged_decode_prompt_matches_reference_eager_and_graph(kv_dtype):
    """--decode-prompt-attention flashinfer at the layer: FlashInfer's prefill (paged over a
    BF16 pool, pages of one slot; over an FP8 pool, ragged over the prompts staged as BF16) +
    the suffix merge kernel equals the reference beam-decode attention, eagerly (two forwards
    queued back to back) and replayed from one CUDA graph captured at its bucket size, then
    replanned for batches of other shapes (other request counts and rows: the bucket's padding
    rows go to one extra request). A batch under PAGED_DECODE_MIN_ROWS keeps the Triton
    kernel (no plan); so does an FP8 batch whose prompts outgrow the staging buffer."""
    flashinfer_or_skip()
    from types import SimpleNamespace

    import numpy as np

    from flashrec.layers.attention_flashinfer import FlashInferAttention

    torch.manual_seed(4)
    hq, hkv, d, depth, pool, srows = 16, 8, 128, 3, 30000, 1200
    bf = torch.bfloat16

    def randn(n):
        return torch.randn(n, hkv, d, device="cuda").to(kv_dtype)

    kv = SimpleNamespace(k=[randn(pool)], v=[randn(pool)], dk=[randn(srows * depth)],
                         dv=[randn(srows * depth)], dtype=kv_dtype, depth=depth)  # fmt: skip
    fi = FlashInferAttention(kv, hq, hkv, d, decode_prompt="flashinfer")
    assert fi.staged == (kv_dtype != bf)
    if fi.staged:  # NaN where a reused buffer's leftovers could be: the prefill kernel's
        for buf in fi._stage:  # last key tile reads past the staged rows (masked)
            buf.fill_(float("nan"))
    specs = [[(264, 2465, 1), (7, 129, 0), (330, 1000, 2)], [(512, 5000, 0)],
             [(1, 17, 2), (300, 3000, 1), (250, 2465, 0), (50, 300, 2)]]  # fmt: skip
    batches = [_decode_batch(kv, s, hq, i) for i, s in enumerate(specs)]
    # two forwards queued back to back: the plan ring keeps their plans apart
    outs = [fi.decode(q, 0, meta) for meta, q, _ in batches[:2]]
    for out, (_, _q, ref) in zip(outs, batches):
        torch.testing.assert_close(out.view(ref.shape).float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert fi.paged_plans == 2
    meta, q, ref = _decode_batch(kv, [(200, 1000, 1)], hq, 9)  # narrow: the Triton kernel
    torch.testing.assert_close(fi.decode(q, 0, meta).view(ref.shape).float(), ref.float(),
                               atol=2e-2, rtol=2e-2)  # fmt: skip
    assert fi.paged_plans == 2
    if fi.staged:  # 13 requests over one 2,465-token prefix: 32k rows > the 30k of staging
        meta, q, ref = _decode_batch(kv, [(40, 2465, 1)] * 13, hq, 10, shared=True)
        assert not fi.decode_graph_fits(meta)
        torch.testing.assert_close(fi.decode(q, 0, meta).view(ref.shape).float(), ref.float(),
                                   atol=2e-2, rtol=2e-2)  # fmt: skip
        assert fi.paged_plans == 2

    size = 704  # one graph bucket for every batch
    fi.setup_decode_graph(size, 20000, bf)
    q_s = torch.zeros(size, hq, d, device="cuda", dtype=bf)
    static = SimpleNamespace(
        rows=torch.zeros(size, dtype=torch.long, device="cuda"),
        out_loc=torch.zeros(size, dtype=torch.long, device="cuda"),
        packed=SimpleNamespace(slots=torch.zeros(20000, dtype=torch.int32, device="cuda")),
        host=(np.array([size]), np.array([1]), None),
    )
    fi.plan_decode_graph(static, size)
    fi.decode(q_s, 0, static)  # warm-up, as capture_graph does
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_s = fi.decode(q_s, 0, static)
    for meta, q, ref in batches:
        r = q.shape[0]
        q_s[:r].copy_(q)
        static.rows[:r].copy_(meta.rows)
        static.out_loc[:r].copy_(meta.out_loc)
        static.rows[r:].fill_(srows - 1)  # padding rows: a decode row of their own, step 0
        static.out_loc[r:].fill_((srows - 1) * depth)
        fi.plan_decode_graph(meta, size)
        graph.replay()
        got = out_s[:r].view(ref.shape)
        torch.testing.assert_close(got.float(), ref.float(), atol=2e-2, rtol=2e-2)
        assert bool(torch.isfinite(out_s.float()).all())


@pytest.mark.parametrize("quantization", ["none", "fp8"])
def test_flashinfer_paged_decode_prompt_engine_equals_triton_decode(synth_model, quantization):
    """Whole engine, 256 beams, three requests decoding together (768 rows): with
    --decode-prompt-attention flashinfer (graphs with the whole-step graph, then eagerly) the
    beams equal those of the Triton decode kernel on the same engine settings, cold and on
    radix hits; the prompt part was planned for those forwards (BF16 KV: paged over the pool;
    FP8 KV: staged as BF16, ragged). auto takes it with BF16 KV, and with FP8 KV from
    --beam-width 256."""
    flashinfer_or_skip()
    path = synth_model("tiny", catalog_size=2000, **HD128)
    shape = dict(beam_width=256, cuda_graph_max_bs=1024, batch_slots=1024)
    knobs = dict(bf16_knobs(quantization, "flashinfer"), **shape)
    base = run_all(path, ns=(256,), **knobs, decode_prompt_attention="triton")
    # FP8: the activations' e4m3 rounding turns the two kernels' rounding differences (float16
    # products in the Triton kernel's FP8 launch, BF16 staging here; the layer test holds both to
    # float32) into whole e4m3 steps: on an H100 the shared beams differ by a median 0.066 nat,
    # p95 0.22, worst 0.30. So FP8 is held two ways: loosely against the Triton launch (most
    # beams shared, the p95 and worst bounded), and against the BF16 engine (no FP8), which the
    # staged path must approach as closely as the Triton launch does (stale or NaN staged rows
    # move every score far from it)
    if quantization == "fp8":
        check = dict(tol=0.3, spread=(0.15, 0.4, 0.6))
        plain = dict(bf16_knobs("none", "flashinfer"), **shape)
        bf16 = run_all(path, ns=(256,), **plain, decode_prompt_attention="triton")
        triton_gap = median_gap(bf16, base)
    else:
        check = dict(tol=0.1)
    for graphs in (True, False):
        eng = make_engine(path, **knobs, decode_prompt_attention="flashinfer",
                          disable_cuda_graph=not graphs)  # fmt: skip
        attn = eng.runner.attn
        assert attn.decode_prompt == "flashinfer" and attn.staged == (quantization == "fp8")
        before = attn.paged_plans
        for _ in range(2):  # second pass: every prompt hits the radix cache
            reqs = [eng.new_request(eng.build_prompt(messages=p), n=256) for p in PROMPTS]
            got = eng.generate(reqs)
            similar_results(base, got, **check)
            if quantization == "fp8":
                gap = median_gap(bf16, got)
                print(f"median gap to BF16: flashinfer {gap:.4f}, triton {triton_gap:.4f}")
                assert gap <= 1.25 * triton_gap + 0.02, (gap, triton_gap)
        assert attn.paged_plans > before
        forwards = eng.runner.decode_forwards
        assert forwards["graph" if graphs else "eager"] > 0, forwards
    # auto: BF16 at any width; FP8 from --beam-width 256 (the graphs' capture unit)
    auto = make_engine(path, **knobs)
    assert auto.runner.decode_prompt_attention == "flashinfer"
    narrow = make_engine(path, **dict(knobs, beam_width=50), disable_cuda_graph=True)
    assert narrow.runner.decode_prompt_attention == (
        "flashinfer" if quantization == "none" else "triton"
    )
