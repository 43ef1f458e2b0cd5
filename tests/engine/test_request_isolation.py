"""One request's input never fails its batch-mates: a request whose values the engine cannot
hold (a temperature beyond float32, a seed beyond int64, a token id outside the vocabulary,
more beams than rows) is refused alone on arrival (``Scheduler.add``), with a ValueError
naming the value,
while a request admitted in the same step completes with the beams it gets alone.

The requests go straight to the scheduler (``Scheduler.add``), past the front ends' checks
and ``Engine.check_request``: what is tested is the engine's own isolation."""

from __future__ import annotations

import math

import pytest

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine
from flashrec.engine.request import MAX_TEMPERATURE, GenRequest, GenResult, check_sampling

MAX_STEPS = 200  # a request stuck in the queue fails the test instead of hanging it


@pytest.fixture(scope="module")
def engine(tiny_model) -> Engine:
    cfg = EngineConfig(
        model_path=str(tiny_model),
        sid_vocab_file=str(tiny_model / "catalog.json"),
        device="cpu",
        batch_slots=64,
        beam_width=4,
        kv_pool_tokens=1 << 14,
    )
    return Engine(cfg)


def _run(engine: Engine, reqs: list[GenRequest]) -> dict[str, GenResult | Exception]:
    """Add ``reqs`` to the scheduler together (one admission step) and step until each is
    answered; a request not answered within ``MAX_STEPS`` steps fails the test."""
    sched = engine.scheduler
    for r in reqs:
        sched.add(r)
    out: dict[str, GenResult | Exception] = {}
    for _ in range(MAX_STEPS):
        for req, res in sched.step():
            out[req.rid] = res
        if len(out) == len(reqs) and not sched.has_work():
            return out
    raise AssertionError(f"requests unanswered after {MAX_STEPS} steps: {sorted(out)}")


def _good(engine: Engine, rid: str) -> GenRequest:
    ids = engine.build_prompt(messages=[{"role": "user", "content": "shoes for running"}])
    return engine.new_request(ids, n=4, temperature=0.7, seed=11, rid=rid)


# field -> (the request's values, what the refusal must name); each failed the whole
# prefill batch (or, for n, held the head of the queue forever) before admission checked it
BAD = {
    "temperature": ({"temperature": 1e308}, "temperature"),  # float32 cannot hold it
    "seed": ({"seed": 2**64}, "seed"),  # no int64 holds it
    "n": ({"n": 10**6}, "n=1000000"),  # more beams than the engine has rows
    "token id": ({"input_ids": [10**9]}, "token id 1000000000"),  # outside the vocabulary
}
# values the engine's checks refuse as well, though they never broke a batch
OUT_OF_RANGE = {
    "temperature inf": ({"temperature": float("inf")}, "temperature"),
    "temperature nan": ({"temperature": float("nan")}, "temperature"),
    "temperature negative": ({"temperature": -1.0}, "temperature"),
    "seed negative": ({"seed": -5}, "seed"),
}


def _bad(engine: Engine, values: dict) -> GenRequest:
    req = _good(engine, "bad")
    for key, value in values.items():
        if key == "input_ids":  # an out-of-vocabulary id ahead of a valid prompt
            value = [*value, *req.input_ids]
        setattr(req, key, value)
    return req


@pytest.mark.parametrize("field", sorted(BAD))
def test_a_request_the_engine_cannot_hold_fails_alone(engine: Engine, field: str) -> None:
    alone = _run(engine, [_good(engine, "alone")])["alone"]
    assert isinstance(alone, GenResult) and len(alone.beams) == 4

    values, named = BAD[field]
    got = _run(engine, [_bad(engine, values), _good(engine, "mate")])

    err = got["bad"]
    assert isinstance(err, ValueError), err
    assert named in str(err), err
    res = got["mate"]
    assert isinstance(res, GenResult), f"the batch-mate failed: {res!r}"
    # the beams it gets alone, untouched by the refusal (scores to float rounding: its prompt
    # may now come from the prefix cache)
    assert [b.token_ids for b in res.beams] == [b.token_ids for b in alone.beams]
    assert [b.cum_logprob for b in res.beams] == pytest.approx(
        [b.cum_logprob for b in alone.beams], abs=1e-4
    )
    # nothing leaked: every beam row and prompt slot the two held is free again
    assert engine.scheduler.used_rows == 0
    assert engine.scheduler.kv_used_tokens == 0


def test_a_lone_refused_request_is_answered_by_the_next_step(engine: Engine) -> None:
    """Refused on arrival with nothing else queued, it is still work: the engine loop steps
    only while ``has_work()``, and a refusal nobody steps for would never be answered."""
    sched = engine.scheduler
    sched.add(_bad(engine, BAD["seed"][0]))
    assert sched.has_work()
    got = sched.step()
    assert [(req.rid, type(res)) for req, res in got] == [("bad", ValueError)]
    assert not sched.has_work()


@pytest.mark.parametrize("field", sorted(set(BAD) - {"token id"} | set(OUT_OF_RANGE)))
def test_the_engine_refuses_such_a_request_at_submit(engine: Engine, field: str) -> None:
    """``Engine.check_request`` (run by every front end's submit, the engine process's too)
    names the value before the request is queued (token ids: where prompts are built, and
    at admission)."""
    values, named = {**BAD, **OUT_OF_RANGE}[field]
    engine.check_request(_good(engine, "ok"))
    with pytest.raises(ValueError, match=named):
        engine.check_request(_bad(engine, values))


def test_the_largest_accepted_temperature_runs(engine: Engine) -> None:
    """The bound the HTTP checks use is one the engine can hold: a request at it completes
    (its beams a valid ranking), beside a greedy batch-mate."""
    hot = _good(engine, "hot")
    hot.temperature = MAX_TEMPERATURE
    got = _run(engine, [hot, _good(engine, "mate")])
    for rid in ("hot", "mate"):
        res = got[rid]
        assert isinstance(res, GenResult) and len(res.beams) == 4, res
    with pytest.raises(ValueError, match="temperature"):
        check_sampling(math.nextafter(MAX_TEMPERATURE, math.inf), None)
