"""GPU checks of the engine (run on the H200): the beam-decode kernel against its reference,
backends, decode and whole-step graphs against eager, FP8 against BF16, HF parity, host syncs
per step, the GPU defaults, overlapped results, decode batches wider than the graphs."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import (
    HD128,
    PROMPTS,
    make_engine,
    run_all,
    same_results,
    similar_results,
)

from flashrec.kernels.beam_attention import (
    beam_decode_attention_ref,
    beam_decode_attention_triton,
    build_work,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("hq,hkv,d", [(16, 8, 128), (4, 2, 16), (8, 1, 64)])
def test_beam_attention_kernel_matches_reference(kv_dtype, hq, hkv, d):
    torch.manual_seed(0)
    dev, depth, pool, slots_n = "cuda", 3, 6000, 64
    kp = torch.randn(pool, hkv, d, device=dev).to(kv_dtype)
    vp = torch.randn(pool, hkv, d, device=dev).to(kv_dtype)
    dk = torch.randn((slots_n + 1) * depth, hkv, d, device=dev).to(kv_dtype)
    dv = torch.randn((slots_n + 1) * depth, hkv, d, device=dev).to(kv_dtype)
    req_n, lens, steps = [5, 20, 1, 33], [17, 2465, 5, 700], [0, 2, 1, 1]
    R = sum(req_n)
    q = torch.randn(R, hq, d, device=dev, dtype=torch.bfloat16)
    slots = torch.randperm(pool, device=dev)[: sum(lens)].int()
    starts = torch.tensor([0] + list(torch.tensor(req_n).cumsum(0)[:-1]), device=dev).int()
    sstart = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)[:-1]), device=dev).int()
    rows = torch.randperm(slots_n, device=dev)[:R]
    args = (
        torch.tensor(req_n, device=dev).int(),
        sstart,
        torch.tensor(lens, device=dev).int(),
        torch.tensor(steps, device=dev).int(),
    )
    ref = beam_decode_attention_ref(q, kp, vp, slots, starts, *args, dk, dv, rows, depth, d**-0.5)
    for splits in (1, 3, 8):  # 8: the 5-token prompt leaves splits empty
        items = build_work(req_n, hq // hkv, 64, splits)
        work = torch.tensor(items + [(-1, 0, 0)] * 5, device=dev).int()
        ctrl = torch.tensor([splits, len(items) + 5], device=dev).int()
        for sms in (132, 2):  # 2: few programs, each walks many work items
            out = beam_decode_attention_triton(
                q, kp, vp, slots, work, starts, *args, dk, dv, rows, depth, d**-0.5,
                ctrl=ctrl, sms=sms, splits=splits,
            )  # fmt: skip
            torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_triton_backend_equals_torch_backend(tiny_model):
    a = run_all(
        tiny_model,
        dtype="float32",
        quantization="none",
        attention_backend="torch",
        disable_cuda_graph=True,
    )
    b = run_all(
        tiny_model,
        dtype="float32",
        quantization="none",
        attention_backend="triton",
        disable_cuda_graph=True,
    )
    same_results(a, b, 1e-3)


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama", "tiny-qwen2"])
def test_graph_replay_equals_eager(synth_model, preset):
    """The decode graph replays the eager forward: the same batch (widths 1, 4, 11 and 64 per
    prompt, 3 x 80 = 240 beam rows, a captured size, so no padding row changes the GEMMs' M)
    gives the same beams; ``decode_forwards`` shows the replays happen (a batch wider than the
    graphs would run eagerly on both sides and compare nothing)."""
    tiny_model = synth_model(preset, catalog_size=2000)
    ns = (1, 4, 11, 64)
    kw = dict(dtype="bfloat16", quantization="fp8", cuda_graph_max_bs=256)
    a = run_all(tiny_model, ns=ns, disable_cuda_graph=True, **kw)
    # the decode graphs only: the piecewise prefill pads the GEMMs' M (test_gpu_prefill.py)
    eng = make_engine(tiny_model, piecewise_prefill_max_tokens=0, **kw)
    assert 240 in eng.runner.graphs.sizes
    b = eng.generate(
        [eng.new_request(eng.build_prompt(messages=p), n=n) for p in PROMPTS for n in ns]
    )
    assert eng.runner.decode_forwards["eager"] == 0 and eng.runner.decode_forwards["graph"] > 0
    same_results(a, b, 1e-3)


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama", "tiny-qwen2"])
def test_step_graph_equals_model_graph(synth_model, preset):
    """--enable-step-graph (the GPU default: model + LM head + trie + top-n + expansion + KV reorder in one
    replay) against the model-only graph with the eager expansion: the same beams. n=16 only
    (every batch takes the step graph), then widths mixed (batches with n != 16 fall back)."""
    path = synth_model(preset, catalog_size=2000)
    kw = dict(dtype="float32", quantization="none", attention_backend="triton")
    for ns in ((16,), (4, 16, 64)):
        a = run_all(path, ns=ns, enable_step_graph=False, **kw)
        b = run_all(path, ns=ns, enable_step_graph=True, **kw)
        same_results(a, b, 1e-4)


# Documented FP8 tolerance on the tiny preset (docs/configuration.md): W8A8 + FP8 KV vs BF16,


# model (hidden 64) is far more sensitive to quantization than a 1.7B model.
@pytest.mark.parametrize("preset", ["tiny", "tiny-llama", "tiny-qwen2"])
def test_fp8_within_tolerance_of_bf16(synth_model, preset):
    tiny_model = synth_model(preset, catalog_size=2000)
    a = run_all(tiny_model, dtype="bfloat16", quantization="none")
    b = run_all(tiny_model, dtype="bfloat16", quantization="fp8", kv_cache_dtype="fp8_e4m3")
    overlap, diff = [], []
    for x, y in zip(a, b):
        sa = {tuple(bb.token_ids) for bb in x.beams[:16]}
        sb = {tuple(bb.token_ids) for bb in y.beams[:16]}
        overlap.append(len(sa & sb) / len(sa))
        diff.append(abs(x.beams[0].sequence_score - y.beams[0].sequence_score))
    print(
        f"fp8 vs bf16: overlap {sum(overlap) / len(overlap):.3f}, |d top1| {sum(diff) / len(diff):.3f}"
    )
    assert sum(overlap) / len(overlap) >= 0.5
    assert sum(diff) / len(diff) <= 1.0


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama", "tiny-qwen2"])
def test_hf_parity_on_gpu_float32(synth_model, preset):
    from harness.servers.hf_reference import HFReference

    tiny_model = synth_model(preset, catalog_size=2000)

    ref = HFReference(str(tiny_model), str(tiny_model / "catalog.json"), device="cuda")
    res = run_all(tiny_model, dtype="float32", quantization="none")
    i = 0
    for p in PROMPTS:
        ids = ref.build_prompt(messages=p)
        for n in (1, 4, 16, 64):
            want = ref.generate(ids, n)
            assert [b.token_ids for b in res[i].beams] == [w.token_ids for w in want]
            assert (
                max(abs(b.sequence_score - w.sequence_score) for b, w in zip(res[i].beams, want))
                <= 1e-3
            )
            i += 1


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("step_graph", [False, True])
def test_at_most_one_host_sync_per_step(synth_model, step_graph, temperature):
    """The step path queues work without waiting for the GPU: torch's sync debug mode counts
    every synchronizing call; a step may sync once (the results' device-to-host copy), and
    only when a request finishes in it. Sampled requests too (their Gumbel noise is built on
    the device, not from host scalars)."""
    import gc
    import traceback
    import warnings

    path = synth_model("tiny", catalog_size=2000, **HD128)
    eng = make_engine(
        path, dtype="bfloat16", quantization="fp8", kv_cache_dtype="fp8_e4m3",
        enable_step_graph=step_graph,
    )  # fmt: skip
    prompts = [eng.build_prompt(messages=p) for p in PROMPTS]
    new = lambda p: eng.new_request(p, n=16, temperature=temperature)  # noqa: E731
    eng.generate([new(p) for p in prompts])  # warm-up: pinned blocks, kernels
    gc.collect()  # the garbage of earlier tests' engines is not this engine's step
    sched, steps = eng.scheduler, []
    for i, p in enumerate(prompts * 2):
        sched.add(new(p))
        if i % 2:
            continue
        syncs: list[str] = []

        # where each sync happened: the stack of the Python call that made it
        # (only torch's per-sync message: set_sync_debug_mode's own one-time notice that the
        # mode is a prototype also says "Synchronization", and is not a sync)
        def seen(message, *_args, syncs=syncs, **_kw):
            if "called a synchronizing" in str(message):
                syncs.append(f"{message}\n" + "".join(traceback.format_stack()[-16:-2]))

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = seen
            torch.cuda.set_sync_debug_mode("warn")
            try:
                done = sched.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        steps.append((len(syncs), len(done), syncs))
    while sched.has_work():
        sched.step()
    bad = [st for s, d, st in steps if s > (1 if d else 0)]
    for stack in bad:
        print("unexpected sync at:\n" + "\n".join(stack))  # shown by pytest on failure
    assert steps and not bad, [(s, d) for s, d, _ in steps]


def test_gpu_defaults_capture_the_whole_step(synth_model):
    """On a GPU the defaults capture decode graphs at multiples of --beam-width, the whole-step
    graph at the sizes that hold whole requests, and both prefill graph kinds."""
    path = synth_model("tiny", catalog_size=2000)
    eng = make_engine(path, dtype="bfloat16")
    eff = eng.server_info()["effective"]
    assert eff["cuda_graphs"] is True and eff["step_graph"] is True
    assert eff["decode_graph_sizes"] == [16 * k for k in range(1, 9)]
    assert eff["step_graph_sizes"] == eff["decode_graph_sizes"]
    assert eff["prefill_graph_max_tokens"] == 2048
    assert eff["piecewise_prefill_max_tokens"] > 0
    assert eff["kv_reorder_positions"] == 1
    assert eff["overlap_results"] is True  # on with CUDA (the A/B in docs/baselines.md)
    # the step graph answers: every request of width 16 at temperature 0 replays it
    calls = []
    orig = eng.runner.graphs.run_step
    eng.runner.graphs.run_step = lambda *a: calls.append(a[0].shape[0]) or orig(*a)
    res = eng.generate([eng.new_request(eng.build_prompt(messages=p), n=16) for p in PROMPTS])
    assert calls and all(r.beams for r in res)


def test_overlap_results_same_beams_on_gpu(synth_model):
    """--overlap-results on the GPU (pinned asynchronous copy + event, results handed back one
    step later while other requests wait): every request's beams and scores equal those of
    the same staggered run with it off, bit for bit, and some results were held back."""
    path = synth_model("tiny", catalog_size=2000)
    runs = []
    for overlap in (False, True):
        eng = make_engine(
            path, dtype="bfloat16", enable_prefix_cache=False, overlap_results=overlap
        )  # fmt: skip
        reqs = [eng.new_request(eng.build_prompt(messages=p), n=16) for p in PROMPTS * 2]
        pending, got, step = list(reqs), {}, 0
        while pending or eng.scheduler.has_work():
            for _ in range(2):
                if pending:
                    eng.scheduler.add(pending.pop(0))
            step += 1
            for req, res in eng.scheduler.step():
                got[req.rid] = (step, res)
        runs.append([got[r.rid] for r in reqs])
    for (s_off, a), (s_on, b) in zip(*runs):
        assert [x.token_ids for x in a.beams] == [x.token_ids for x in b.beams]
        assert [x.sequence_score for x in a.beams] == [x.sequence_score for x in b.beams]
        assert s_on - s_off in (0, 1)
    assert any(s_on > s_off for (s_off, _), (s_on, _) in zip(*runs))


def test_decode_wider_than_the_largest_graph_replays_in_parts(synth_model, caplog):
    """--batch-slots above --cuda-graph-max-bs: a decode batch wider than the largest graph
    runs as graph replays of whole requests (never eagerly), with the beams of a run whose
    graphs hold the whole batch; only a request wider than every graph decodes eagerly, and
    that is logged and counted."""
    path = synth_model("tiny", catalog_size=2000)
    reqs = [(p, 16) for p in PROMPTS * 2]  # 6 x 16 = 96 rows per decode step
    runs = []
    for top in (128, 32):
        eng = make_engine(path, dtype="bfloat16", cuda_graph_max_bs=top, enable_prefix_cache=False)
        assert eng.runner.decode_rows_limit == top
        out = eng.generate([eng.new_request(eng.build_prompt(messages=p), n=n) for p, n in reqs])
        assert eng.runner.decode_forwards["eager"] == 0
        # two decode levels: one replay each at 128 rows, three (of 32 rows) at 32
        assert eng.runner.decode_forwards["graph"] == (2 if top == 128 else 6)
        runs.append(out)
    similar_results(runs[0], runs[1], tol=5e-2, overlap=0.9)
    with caplog.at_level("WARNING", logger="flashrec"):
        wide = eng.generate([eng.new_request(eng.build_prompt(messages=PROMPTS[0]), n=64)])
    assert wide[0].beams and eng.runner.decode_forwards["eager"] == 2
    assert "runs eagerly" in caplog.text
