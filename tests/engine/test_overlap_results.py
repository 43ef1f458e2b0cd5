"""``--overlap-results``: a step's finished requests are handed back by the next step, after
that step's GPU work is queued, while other requests wait or run. The results must be the same,
nothing may be lost or held back longer than one step, and a lone request is never held."""

from __future__ import annotations

import pytest

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine


def _engine(model_dir, overlap: bool, steps: int = 1) -> Engine:
    return Engine(
        EngineConfig(
            model_path=str(model_dir),
            sid_vocab_file=str(model_dir / "catalog.json"),
            batch_slots=256,
            enable_prefix_cache=False,
            overlap_results=overlap,
            overlap_results_steps=steps,
        )
    )


def _prompt(eng: Engine, i: int) -> list[int]:
    return eng.build_prompt(messages=[{"role": "user", "content": f"user {i} likes item {i * 7}"}])


def _staggered(eng: Engine, widths, per_step: int = 2) -> dict[str, tuple[int, object]]:
    """Requests join ``per_step`` per step; rid -> (step that handed its result back, result)."""
    sched = eng.scheduler
    reqs = [eng.new_request(_prompt(eng, i), n=n, rid=f"r{i}") for i, n in enumerate(widths)]
    pending, got, step = list(reqs), {}, 0
    while pending or sched.has_work():
        for _ in range(per_step):
            if pending:
                sched.add(pending.pop(0))
        step += 1
        for req, res in sched.step():
            assert not isinstance(res, Exception), res
            assert req.rid not in got
            got[req.rid] = (step, res)
    assert set(got) == {r.rid for r in reqs}  # nothing lost
    return got


WIDTHS = (3, 8, 8, 16, 3, 8, 1, 16)


def test_same_results_at_most_one_step_later(tiny_model):
    off = _staggered(_engine(tiny_model, False), WIDTHS)
    on = _staggered(_engine(tiny_model, True), WIDTHS)
    held = 0
    for rid, (s_off, a) in off.items():
        s_on, b = on[rid]
        assert [x.token_ids for x in a.beams] == [x.token_ids for x in b.beams]
        assert [x.sequence_score for x in a.beams] == [x.sequence_score for x in b.beams]
        assert s_on - s_off in (0, 1)
        held += s_on > s_off
    assert held > 0  # requests finished while others waited or ran: their results were held
    # the last request to finish has nothing queued behind it: handed back at once
    assert max(s for s, _ in on.values()) == max(s for s, _ in off.values())


def _one_at_a_time(eng: Engine, widths) -> tuple[int, list]:
    """Each request added once the previous one is answered; (steps, results)."""
    sched, steps, results = eng.scheduler, 0, []
    for i, n in enumerate(widths):
        sched.add(eng.new_request(_prompt(eng, i), n=n, rid=f"r{i}"))
        out = []
        while not out:
            steps += 1
            out = sched.step()
        assert [r.rid for r, _ in out] == [f"r{i}"]
        assert not sched._pending and not sched.has_work()  # handed back in its own step
        results.append(out[0][1])
    return steps, results


def test_a_lone_request_is_never_held(tiny_model):
    widths = (8, 3, 16)
    steps_off, off = _one_at_a_time(_engine(tiny_model, False), widths)
    steps_on, on = _one_at_a_time(_engine(tiny_model, True), widths)
    assert steps_on == steps_off
    for a, b in zip(off, on):
        assert [x.token_ids for x in a.beams] == [x.token_ids for x in b.beams]


def test_held_results_survive_a_failed_step(tiny_model):
    """The engine loop calls ``flush_pending`` when a step raises: the requests whose results
    were held back get them (or the error, when asked), never a hang."""
    eng = _engine(tiny_model, True)
    sched = eng.scheduler
    a = eng.new_request(_prompt(eng, 0), n=4, rid="a")
    b = eng.new_request(_prompt(eng, 1), n=4, rid="b")
    sched.add(a)
    while not sched._pending:  # run a alone until it finishes, then hold it behind b
        if not sched.waiting and not sched.running:
            pytest.fail("a finished without being held back")
        if len(sched.running) == 1 and sched.running[0].generated == sched.depth - 1:
            sched.add(b)  # b waits while a finishes: a's result is held back
        assert sched.step() == []
    assert sched.has_work()
    orig = sched.admission.admit
    sched.admission.admit = lambda: (_ for _ in ()).throw(RuntimeError("planted"))
    with pytest.raises(RuntimeError, match="planted"):
        sched.step()
    sched.admission.admit = orig
    flushed = sched.flush_pending()
    assert [r.rid for r, _ in flushed] == ["a"] and flushed[0][1].beams
    assert sched.flush_pending() == []
    # and with an error given, the held requests get it
    eng2 = _engine(tiny_model, True)
    s2 = eng2.scheduler
    s2.add(eng2.new_request(_prompt(eng2, 0), n=4, rid="a"))
    while not s2._pending:
        if len(s2.running) == 1 and s2.running[0].generated == s2.depth - 1:
            s2.add(eng2.new_request(_prompt(eng2, 1), n=4, rid="b"))
        s2.step()
    err = RuntimeError("step failed")
    assert [(r.rid, e) for r, e in s2.flush_pending(err)] == [("a", err)]


def test_two_steps_hold_results_at_most_two_steps(tiny_model):
    """``--overlap-results-steps 2``: the same results, none held more than two steps, some
    held exactly two (on CPU no copy lands early), and the last one handed back at once."""
    off = _staggered(_engine(tiny_model, False), WIDTHS)
    two = _staggered(_engine(tiny_model, True, steps=2), WIDTHS)
    lags = []
    for rid, (s_off, a) in off.items():
        s_two, b = two[rid]
        assert [x.token_ids for x in a.beams] == [x.token_ids for x in b.beams]
        assert [x.sequence_score for x in a.beams] == [x.sequence_score for x in b.beams]
        lags.append(s_two - s_off)
    assert set(lags) <= {0, 1, 2} and 2 in lags
    assert max(s for s, _ in two.values()) == max(s for s, _ in off.values())


def test_two_held_steps_are_flushed_together(tiny_model):
    """Results of two steps held at once all come back from ``flush_pending`` (oldest first),
    or all get the error."""
    for err in (None, RuntimeError("step failed")):
        eng = _engine(tiny_model, True, steps=2)
        sched = eng.scheduler
        reqs = [eng.new_request(_prompt(eng, i), n=n, rid=f"r{i}") for i, n in enumerate(WIDTHS)]
        got = []
        while len(sched._pending) < 2:  # one request joins per step: they finish a step apart
            assert reqs or sched.has_work(), "never two steps held"
            if reqs:
                sched.add(reqs.pop(0))
            got += [r.rid for r, _ in sched.step()]
        held = [st.req.rid for p in sched._pending for st in p.states]
        flushed = sched.flush_pending(err)
        assert [r.rid for r, _ in flushed] == held and not sched._pending
        assert not set(held) & set(got)
        if err is None:
            assert all(res.beams for _, res in flushed)
        else:
            assert all(res is err for _, res in flushed)


def test_steps_outside_their_range_are_refused():
    for bad in (0, 9):
        with pytest.raises(ValueError, match="--overlap-results-steps must be in 1..8"):
            EngineConfig(model_path="m", overlap_results_steps=bad)
