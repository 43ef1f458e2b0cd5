"""A decode step over requests at different levels and widths: one restricted LM-head product
per level (not per request), batched beam bookkeeping, and the same beams as each request run
alone."""

from __future__ import annotations

import pytest

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine

WIDTHS = (3, 8, 8, 16, 3, 8, 1, 16)


def _engine(model_dir, **kw) -> Engine:
    return Engine(
        EngineConfig(
            model_path=str(model_dir),
            sid_vocab_file=str(model_dir / "catalog.json"),
            batch_slots=256,
            enable_prefix_cache=False,
            **kw,
        )
    )


def _prompt(eng: Engine, i: int) -> list[int]:
    return eng.build_prompt(messages=[{"role": "user", "content": f"user {i} likes item {i * 7}"}])


@pytest.fixture(scope="module")
def staggered(tiny_model):
    """Requests join two per step, so decode batches mix levels and widths. Records, per
    decode forward, the level of every request in it and the LM-head products it ran."""
    eng = _engine(tiny_model)
    runner, head = eng.runner, eng.runner.lm_head
    steps: list[tuple[list[int], list[int]]] = []
    orig_head, orig_decode = head.level_logprobs, runner.decode

    def head_counting(h, level):
        if steps:
            steps[-1][1].append(level)
        return orig_head(h, level)

    def decode_recording(input_ids, meta, levels):
        steps.append((list(levels), []))
        return orig_decode(input_ids, meta, levels)

    head.level_logprobs = head_counting
    runner.decode = decode_recording
    sched = eng.scheduler
    reqs = [eng.new_request(_prompt(eng, i), n=n) for i, n in enumerate(WIDTHS)]
    pending, done = list(reqs), {}
    while pending or sched.has_work():
        for _ in range(2):
            if pending:
                sched.add(pending.pop(0))
        steps.append(([], []))  # the prefill's products land here
        for req, res in sched.step():
            assert not isinstance(res, Exception), res
            done[req.rid] = res
    return eng, reqs, done, [s for s in steps if s[0]]


def test_one_lm_head_product_per_level(staggered):
    _, _, _, steps = staggered
    for levels, products in steps:
        assert sorted(products) == sorted(set(levels)), (levels, products)
    assert any(len(set(lv)) > 1 for lv, _ in steps)  # requests at different levels
    assert any(len(lv) > len(set(lv)) for lv, _ in steps)  # several requests share a level


def test_mixed_batches_equal_each_request_alone(staggered, tiny_model):
    eng, reqs, done, _ = staggered
    solo = _engine(tiny_model)
    for i, req in enumerate(reqs):
        want = solo.generate([solo.new_request(_prompt(solo, i), n=req.n)])[0]
        got = done[req.rid]
        assert [b.token_ids for b in got.beams] == [b.token_ids for b in want.beams]
        for a, b in zip(got.beams, want.beams):
            assert abs(a.cum_logprob - b.cum_logprob) <= 1e-4


@pytest.mark.parametrize(
    "widths,limit,runs",
    [
        ([], 32, []),
        ([8, 8, 16], None, [(0, 3)]),
        ([8, 8, 16], 32, [(0, 3)]),
        ([8, 8, 16, 3], 32, [(0, 3), (3, 4)]),
        ([16, 16, 16, 16, 16], 32, [(0, 2), (2, 4), (4, 5)]),
        ([3, 64, 3, 3], 32, [(0, 1), (1, 2), (2, 4)]),  # wider than the limit: alone
        ([64], 32, [(0, 1)]),
    ],
)
def test_row_chunks_cut_whole_requests_up_to_the_limit(widths, limit, runs):
    from flashrec.engine.scheduler import row_chunks

    assert row_chunks(widths, limit) == runs
    for a, b in runs:  # every run fits, unless it is one request wider than the limit
        assert limit is None or sum(widths[a:b]) <= limit or b - a == 1


@pytest.mark.parametrize("static", [False, True])
def test_decode_wider_than_the_graphs_runs_as_whole_request_batches(
    tiny_model, monkeypatch, static
):
    """Decode batches wider than the largest decode graph (``decode_rows_limit``; CPU has no
    graphs, so the limit is set here) are cut into batches of whole requests, each one
    forward; every request's beams equal the uncut run's. ``static``: every request has the
    beam width, so each cut batch runs the whole static step (``decode_step``)."""
    from flashrec.engine.runner import ModelRunner

    widths, kw = ((8,) * 6, {"beam_width": 8}) if static else ((8, 16, 8, 3, 16, 8), {})
    base = _engine(tiny_model, **kw)
    want = base.generate([base.new_request(_prompt(base, i), n=n) for i, n in enumerate(widths)])
    assert base.runner.decode_forwards == {"graph": 0, "eager": 2}  # two levels after prefill

    monkeypatch.setattr(ModelRunner, "decode_rows_limit", property(lambda self: 24))
    eng = _engine(tiny_model, **kw)
    rows: list[int] = []
    orig = eng.runner._decode_forward
    eng.runner._decode_forward = lambda ids, meta: rows.append(ids.shape[0]) or orig(ids, meta)
    got = eng.generate([eng.new_request(_prompt(eng, i), n=n) for i, n in enumerate(widths)])
    # per level: [8, 16] [8, 3] [16, 8], or three runs of [8, 8, 8]: <= 24 rows each, twice
    assert rows == ([24, 24] if static else [24, 11, 24]) * 2
    assert eng.runner.decode_forwards["eager"] == len(rows)
    for g, w in zip(got, want):
        assert [b.token_ids for b in g.beams] == [b.token_ids for b in w.beams]
        for a, b in zip(g.beams, w.beams):
            assert abs(a.cum_logprob - b.cum_logprob) <= 1e-4
