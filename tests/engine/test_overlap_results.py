"""``--overlap-results``: a step's finished requests are handed back by the next step, after
that step's GPU work is queued, while other requests wait or run. The results must be the same,
nothing may be lost or held back longer than one step, and a lone request is never held."""

from __future__ import annotations

import pytest

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine


def _engine(model_dir, overlap: bool) -> Engine:
    return Engine(
        EngineConfig(
            model_path=str(model_dir),
            sid_vocab_file=str(model_dir / "catalog.json"),
            batch_slots=256,
            enable_prefix_cache=False,
            overlap_results=overlap,
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
        assert sched._pending is None and not sched.has_work()  # handed back in its own step
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
    while sched._pending is None:  # run a alone until it finishes, then hold it behind b
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
    while s2._pending is None:
        if len(s2.running) == 1 and s2.running[0].generated == s2.depth - 1:
            s2.add(eng2.new_request(_prompt(eng2, 1), n=4, rid="b"))
        s2.step()
    err = RuntimeError("step failed")
    assert [(r.rid, e) for r, e in s2.flush_pending(err)] == [("a", err)]
