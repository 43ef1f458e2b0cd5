"""``--overlap-results`` behind the HTTP API: with requests arriving together (so that some
finish while others wait or run and are handed back one step later), every answer equals the
one the same server gives with the option off, in process and with the engine in a process
of its own; ``/get_server_info`` reports the option."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from server_helpers import ServerThread, process_server, real_server

SCORE_TOL = 1e-5
REQUESTS = [(f"history {i}: {i * 7}, {i * 13 % 50}, 301", n) for i, n in enumerate((1, 4, 16) * 4)]


def _beams(srv: ServerThread, content: str, n: int) -> list[tuple[list[int], float]]:
    r = srv.post(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": content}], "n": n}
    )
    assert r.status_code == 200, r.text
    return [(c["sglext"]["token_ids"], c["sglext"]["sequence_score"]) for c in r.json()["choices"]]


def _all_at_once(srv: ServerThread) -> list:
    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        return list(pool.map(lambda cn: _beams(srv, *cn), REQUESTS))


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Path) -> list:
    """The answers of a server without the option, one request at a time."""
    with real_server(tiny_checkpoint, batch_slots=512, overlap_results=False) as srv:
        return [_beams(srv, *cn) for cn in REQUESTS]


@pytest.mark.parametrize("where", ["in-process", "engine-process"])
def test_answers_equal_the_plain_servers(tiny_checkpoint: Path, reference: list, where) -> None:
    make = real_server if where == "in-process" else process_server
    # a small prefill budget admits a prompt or two per step: the first requests finish while
    # the others still wait, so their results are held back
    kw = dict(batch_slots=512, overlap_results=True, max_prefill_tokens=64)
    with make(tiny_checkpoint, **kw) as srv:
        info = srv.get("/get_server_info").json()
        assert info["engine"]["effective"]["overlap_results"] is True
        held = []
        if where == "in-process":  # count the steps that hand back held results
            sched = srv.engine.scheduler
            orig = sched.flush_pending
            sched.flush_pending = lambda *a: held.append(sched._pending is not None) or orig(*a)
        for _ in range(2):  # twice: the second round meets a warm radix cache
            got = _all_at_once(srv)
            for a, b in zip(got, reference):
                assert [t for t, _ in a] == [t for t, _ in b]
                assert all(abs(x - y) <= SCORE_TOL for (_, x), (_, y) in zip(a, b))
        if where == "in-process":
            assert any(held)
