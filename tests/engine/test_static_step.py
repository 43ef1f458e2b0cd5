"""The static decode step (--enable-step-graph's body): the same alive beams as the eager
expansion, on random catalogs with levels mixed in one batch, and the same engine results."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashrec.beam.search import expand
from flashrec.beam.step import StaticStep
from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine
from flashrec.sid.layout import SidLayout
from flashrec.sid.trie import SidTrie

K = 8


class _Head:
    """level_logprobs from fixed random logits per level (h is a row index)."""

    def __init__(self, rows: int, depth: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.logits = [torch.randn(rows, K, generator=g) for _ in range(depth)]

    def level_logprobs(self, h, level):
        return torch.log_softmax(self.logits[level][h[:, 0]], -1)


def step_cases(max_n: int):
    """Hypothesis inputs of a static-step case: a catalog of 3-level SIDs, b requests of
    width n, a seed and the draws (see :func:`_case`)."""
    return given(
        codes=st.lists(
            st.tuples(*[st.integers(0, K - 1)] * 3), min_size=1, max_size=80, unique=True
        ),
        n=st.integers(1, max_n),
        b=st.integers(1, 4),
        seed=st.integers(0, 10_000),
        data=st.data(),
    )


def _case(codes, n: int, b: int, seed: int, data):
    """(trie, layout, head, step, levels): the static step over ``codes`` for ``b`` requests of
    width ``n``, each at a drawn level before the end token."""
    depth = 3
    trie = SidTrie(np.asarray(codes), K)
    layout = SidLayout(code_start=10, codebook_size=K, num_levels=depth, sid_begin=5, sid_end=6)
    head = _Head(b * n, depth, seed)
    step = StaticStep(head, trie, layout, depth, "cpu")
    levels = data.draw(st.lists(st.integers(1, depth - 1), min_size=b, max_size=b))
    return trie, layout, head, step, levels


@settings(max_examples=40, deadline=None)
@step_cases(max_n=12)
def test_static_step_equals_expand(codes, n, b, seed, data):
    trie, layout, head, step, levels = _case(codes, n, b, seed, data)
    rng = np.random.default_rng(seed)
    cum = torch.tensor(rng.normal(size=(b, n)), dtype=torch.float32)
    cum[torch.tensor(rng.random((b, n)) < 0.2)] = float("-inf")  # some dead rows
    nodes = torch.stack(
        [torch.tensor(rng.integers(0, trie.num_nodes(lv), size=n)) for lv in levels]
    )
    h = torch.arange(b * n)[:, None]
    out = step.run(h, torch.tensor(levels), cum, nodes)
    for i, lv in enumerate(levels):
        lp = head.level_logprobs(h[i * n : (i + 1) * n], lv)
        c, ch, v = trie.candidates(lv, nodes[i])
        ref = expand(cum[i : i + 1], lp[None], c[None], ch[None], v[None], n)
        alive = torch.isfinite(ref.cum[0])
        assert torch.equal(torch.isfinite(out.cum[i]), alive)
        assert torch.equal(out.cum[i][alive], ref.cum[0][alive])
        assert torch.equal(out.parents[i][alive], ref.parents[0][alive])
        assert torch.equal(out.nodes[i][alive], ref.nodes[0][alive])
        want_tok = ref.codes[0][alive] + layout.level_range(lv)[0]
        assert torch.equal(out.tokens[i][alive], want_tok)


@pytest.fixture(scope="module")
def model_dir(synth_model):
    return synth_model("tiny", catalog_size=3000)


def _engine(model_dir, **kw) -> Engine:
    cfg = EngineConfig(
        model_path=str(model_dir),
        sid_vocab_file=str(model_dir / "catalog.json"),
        beam_width=8,
        batch_slots=512,
        enable_prefix_cache=False,
        **kw,
    )
    return Engine(cfg)


def _staggered(eng: Engine, widths) -> dict:
    """Two requests join per step (levels mix in decode batches); results by index."""
    sched, done = eng.scheduler, {}
    reqs = [
        eng.new_request(eng.build_prompt(messages=[{"role": "user", "content": f"u{i}"}]), n=n)
        for i, n in enumerate(widths)
    ]
    pending = list(reqs)
    while pending or sched.has_work():
        for _ in range(2):
            if pending:
                sched.add(pending.pop(0))
        for req, res in sched.step():
            assert not isinstance(res, Exception), res
            done[req.rid] = res
    return {i: done[r.rid] for i, r in enumerate(reqs)}


@pytest.mark.parametrize("widths", [(8,) * 7, (8, 3, 8, 8, 16, 8)])
def test_engine_static_step_equals_eager_expansion(model_dir, widths):
    eager = _engine(model_dir)
    static = _engine(model_dir, enable_step_graph=True)
    assert static.runner.step is not None and eager.runner.step is None
    calls = []
    orig = static.runner.decode_step
    static.runner.decode_step = lambda *a: calls.append(a[2].shape[0]) or orig(*a)
    a, b = _staggered(eager, widths), _staggered(static, widths)
    for i in a:
        assert [x.token_ids for x in a[i].beams] == [y.token_ids for y in b[i].beams]
        for x, y in zip(a[i].beams, b[i].beams):
            assert abs(x.cum_logprob - y.cum_logprob) <= 1e-5
    if all(w == 8 for w in widths):
        assert calls and max(calls) >= 2  # static steps ran, with several requests at once
    else:  # a batch holding a request of another width expands eagerly
        assert len(calls) < sum(1 for _ in widths)


def test_other_widths_and_the_end_step_keep_the_eager_expansion(model_dir):
    eng = _engine(model_dir, enable_step_graph=True)
    ok = eng.runner.step_batch_ok
    assert ok([8, 8], [1, 2])
    assert not ok([8, 4], [1, 1])
    assert not ok([8], [eng.runner.depth])  # the end step (scopes other than level)


@settings(max_examples=25, deadline=None)
@step_cases(max_n=10)
def test_sampled_static_step_equals_sampled_expand(codes, n, b, seed, data):
    """Gumbel top-k in the static step: per request its own temperature (0 = greedy) and
    seed, the same picks as the eager expansion with the same seed and level."""
    trie, layout, head, step, levels = _case(codes, n, b, seed, data)
    temps = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=b, max_size=b))
    seeds = torch.tensor(data.draw(st.lists(st.integers(0, 2**62), min_size=b, max_size=b)))
    rng = np.random.default_rng(seed)
    cum = torch.tensor(rng.normal(size=(b, n)), dtype=torch.float32)
    nodes = torch.stack(
        [torch.tensor(rng.integers(0, trie.num_nodes(lv), size=n)) for lv in levels]
    )
    h = torch.arange(b * n)[:, None]
    out = step.run(h, torch.tensor(levels), cum, nodes, torch.tensor(temps), seeds)
    for i, lv in enumerate(levels):
        lp = head.level_logprobs(h[i * n : (i + 1) * n], lv)
        c, ch, v = trie.candidates(lv, nodes[i])
        ref = expand(
            cum[i : i + 1], lp[None], c[None], ch[None], v[None], n, temps[i], seeds[i : i + 1], lv
        )
        alive = torch.isfinite(ref.cum[0])
        assert torch.equal(torch.isfinite(out.cum[i]), alive)
        assert torch.equal(out.parents[i][alive], ref.parents[0][alive])
        assert torch.equal(out.cum[i][alive], ref.cum[0][alive])  # scores stay noise-free
        assert torch.equal(out.tokens[i][alive], ref.codes[0][alive] + layout.level_range(lv)[0])


def test_engine_sampled_requests_run_the_static_step(model_dir):
    """Sampled requests of --beam-width rows take the static step, with the eager
    expansion's beams; a seed reproduces them, another seed changes them."""
    eager = _engine(model_dir)
    static = _engine(model_dir, enable_step_graph=True)
    calls = []
    orig = static.runner.decode_step
    static.runner.decode_step = lambda *a: calls.append(a[5] is not None) or orig(*a)

    def run(eng, seed):
        prompts = [
            eng.build_prompt(messages=[{"role": "user", "content": f"u{i}"}]) for i in range(4)
        ]
        reqs = [eng.new_request(p, n=8, temperature=t, seed=seed + i)
                for i, (p, t) in enumerate(zip(prompts, (0.0, 0.7, 1.5, 0.7)))]  # fmt: skip
        return [[b.token_ids for b in r.beams] for r in eng.generate(reqs)]

    a, b = run(eager, 100), run(static, 100)
    assert a == b
    assert calls and any(calls)  # static steps ran, sampled ones among them
    assert run(static, 100) == b
    assert run(static, 900)[1:] != b[1:] and run(static, 900)[0] == b[0]  # greedy one unmoved


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_sampled_requests_replay_the_step_graph(model_dir):
    """On CUDA, sampled requests replay the captured whole-step graph (its noise computed in
    the graph) and pick the beams of the eager expansion with the same seeds."""
    kw = dict(device="cuda", dtype="float32", cuda_graph_max_bs=64)
    graphed = _engine(model_dir, **kw)
    eager = _engine(model_dir, enable_step_graph=False, **kw)
    assert graphed.runner.graphs is not None and graphed.runner.graphs.step_graphs

    def run(eng):
        prompts = [
            eng.build_prompt(messages=[{"role": "user", "content": f"u{i}"}]) for i in range(4)
        ]
        reqs = [eng.new_request(p, n=8, temperature=t, seed=40 + i)
                for i, (p, t) in enumerate(zip(prompts, (0.0, 0.7, 1.5, 0.7)))]  # fmt: skip
        return [[b.token_ids for b in r.beams] for r in eng.generate(reqs)]

    graphs, sampled = graphed.runner.graphs, []
    orig = graphs.run_step
    graphs.run_step = lambda *a: sampled.append(a[5] is not None) or orig(*a)
    assert run(graphed) == run(eager)
    assert any(sampled)  # step-graph replays with sampled requests in them
