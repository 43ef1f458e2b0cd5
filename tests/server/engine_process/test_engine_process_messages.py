"""The engine-process pipe's messages: every kind survives pickling and the wire with its
field names and values; results and exceptions come back as what was sent."""

from __future__ import annotations

import pickle
from concurrent.futures import CancelledError
from multiprocessing.reduction import ForkingPickler

import pytest

from flashrec.engine.request import (
    BeamColumns,
    BeamResult,
    EngineError,
    GenRequest,
    GenResult,
    QueueFullError,
)
from flashrec.profiler import ProfileError
from flashrec.server.engine_process import messages as m
from flashrec.server.engine_process import result_from_wire, result_to_wire
from flashrec.sid.layout import SidLayout

_COLS = BeamColumns([[3, 4], [7]], [-1.0, -2.0], [-0.5, -2.0], ["stop", "length"], "x")

# one message of every kind, each field set to a value of its own
SAMPLES: list[tuple] = [
    m.Submit(GenRequest("r1", [1, 2, 3], 4, 3, temperature=0.5, seed=7, arrival=1.5)),
    m.Cancel("r1"),
    m.Call(3, "profile_start", ({"output_dir": "d"},)),
    m.Stop(),
    m.Ready(
        server_info={"model": "tiny"},
        layout=SidLayout(code_start=10, codebook_size=8, num_levels=3, sid_begin=5, sid_end=6),
        vocab_size=64,
        max_beam_rows=256,
        pool_tokens=4096,
        pid=1234,
    ),
    m.Failed("ValueError: no config.json", "Traceback (most recent call last): ..."),
    result_to_wire(GenResult("r2", _COLS, 9, 4, "late", 0.25, 0.5, 12.0)),
    m.RequestError("r3", "queue_full", "queue is full"),
    m.Reply(4, {"running_requests": 0}),
    m.CallError(5, "profile", "a profile is running"),
]


def _same(back: tuple, msg: tuple) -> None:
    assert type(back) is type(msg)
    assert back._fields == type(msg)._fields
    assert back._asdict() == msg._asdict()


def test_every_kind_has_a_sample() -> None:
    assert {type(s) for s in SAMPLES} == set(m._KINDS)
    assert len(m._KINDS) == len(set(m._KINDS))


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_every_kind_round_trips_through_pickle(msg: tuple) -> None:
    _same(pickle.loads(pickle.dumps(msg)), msg)  # the message itself, as a worker gets it
    wire = m.encode(msg)
    assert type(wire) is tuple and type(wire[1]) is tuple  # plain tuples cross the pipe
    _same(m.decode(pickle.loads(ForkingPickler.dumps(wire))), msg)


def test_the_wire_names_no_message_class() -> None:
    """The class reference is what makes a pickled NamedTuple slow: the wire has none."""
    for msg in SAMPLES:
        assert b"engine_process.messages" not in bytes(ForkingPickler.dumps(m.encode(msg)))
        assert b"engine_process.messages" in pickle.dumps(msg)


def test_result_fields_by_name() -> None:
    msg = result_to_wire(GenResult("c", _COLS, 4, 1, None, 0.1, 0.2, 5.0))
    assert msg.rid == "c" and (msg.prompt_tokens, msg.cached_tokens) == (4, 1)
    assert msg.token_ids is _COLS.token_ids and msg.cum_logprobs is _COLS.cum_logprobs
    assert msg.sequence_scores is _COLS.sequence_scores
    assert msg.finish_reasons == ["stop", "length"]
    assert (msg.error, msg.queue_s, msg.engine_s, msg.done_at) == (None, 0.1, 0.2, 5.0)
    assert msg == m.Result(
        "c", *(_COLS.token_ids, _COLS.cum_logprobs, _COLS.sequence_scores, _COLS.finish_reasons),
        4, 1, None, 0.1, 0.2, 5.0,
    )  # fmt: skip


def test_result_round_trip() -> None:
    beams = [BeamResult([3, 4, 5], -1.5, -0.5, "stop", "t") for _ in range(3)]
    res = GenResult("r", beams, 10, 2, queue_s=0.1, engine_s=0.2, done_at=5.0)
    wire = pickle.loads(pickle.dumps(m.encode(result_to_wire(res))))
    back = result_from_wire(m.decode(wire), lambda ids: "-".join(map(str, ids)))
    assert back.beams == res.beams and back.beams[0].text == "3-4-5"
    assert (back.rid, back.prompt_tokens, back.cached_tokens) == ("r", 10, 2)
    assert (back.queue_s, back.engine_s, back.done_at) == (0.1, 0.2, 5.0)
    back = result_from_wire(result_to_wire(GenResult("c", _COLS, 4)), lambda ids: str(ids))
    assert isinstance(back.beams, BeamColumns) and back.beams == _COLS
    assert back.beams.texts() == ["[3, 4]", "[7]"]


@pytest.mark.parametrize(
    "exc",
    [
        CancelledError("x"),
        QueueFullError("x"),
        ValueError("x"),
        EngineError("x"),
        ProfileError("x"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_cross_as_their_type(exc: BaseException) -> None:
    for sent in (m.RequestError.of("r", exc), m.CallError.of(7, exc)):
        back = m.decode(pickle.loads(pickle.dumps(m.encode(sent))))
        got = back.exception()
        assert type(got) is type(exc) and str(got) == "x"


def test_other_errors_become_runtime_errors_with_their_type_named() -> None:
    err = m.RequestError.of("r", KeyError("k"))
    assert (err.rid, err.kind) == ("r", "other")
    got = err.exception()
    assert type(got) is RuntimeError and str(got) == "KeyError: 'k'"
