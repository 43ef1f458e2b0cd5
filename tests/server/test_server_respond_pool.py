"""``--respond-workers``: wide answers' bodies built in worker processes.

The bodies equal the event loop's (same text, byte for byte, but for the request id, the
creation time and the measured latency); narrow and streamed answers stay on the event loop;
a dead worker drops the pool and every answer is still served; the workers end with their
server; workers import neither the application nor torch.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_helpers import ServerThread, process_server, real_server

from flashrec.config import ServerConfig
from flashrec.engine.request import BeamResult, GenResult
from flashrec.server import responses
from flashrec.server.respond_pool import MIN_BEAMS, RespondPool

WIDE = MIN_BEAMS  # the narrowest answer a worker builds


def _chat(content: str, n: int) -> dict:
    return {"messages": [{"role": "user", "content": content}], "n": n}


def _chat_body(srv: ServerThread, content: str, n: int) -> dict:
    r = srv.post("/v1/chat/completions", _chat(content, n))
    assert r.status_code == 200, r.text
    body = r.json()
    del body["id"], body["created"]
    return body


def _generate_bodies(srv: ServerThread, texts: list[str], n: int) -> list[dict]:
    r = srv.post("/generate", {"text": texts, "sampling_params": {"n": n}})
    assert r.status_code == 200, r.text
    out = r.json()
    for b in out:  # the request's own keys, also in the best beam's meta_info (as upstream)
        for meta in (b["meta_info"], b["meta_info"]["beam_results"][0]["meta_info"]):
            del meta["id"], meta["e2e_latency"]
    return out


def _children(pid: int) -> set[int]:
    """Child processes of ``pid``, over all of its threads. A thread may end between the
    listing and the read (its children then belong to another thread of the process, which
    the loop reads too): a vanished task is skipped."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids = Path(f"/proc/{pid}/task/{task.name}/children").read_text().split()
        except FileNotFoundError:
            continue
        out.update(int(k) for k in kids)
    return out


@pytest.fixture(scope="module")
def plain(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with real_server(tiny_checkpoint, batch_slots=512) as srv:
        yield srv


@pytest.fixture(scope="module")
def pooled(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with real_server(tiny_checkpoint, batch_slots=512, respond_workers=2) as srv:
        yield srv


def test_worker_bodies_equal_the_event_loops(plain: ServerThread, pooled: ServerThread) -> None:
    pool = pooled.server.state.backend.respond
    assert pool is not None and pool.workers == 2
    before = pool.built
    for content, n in (("wide one", WIDE), ("wide two", 2 * WIDE), ("narrow", 4)):
        assert _chat_body(pooled, content, n) == _chat_body(plain, content, n)
    texts = ["gen a", "gen b", "gen c"]
    assert _generate_bodies(pooled, texts, WIDE) == _generate_bodies(plain, texts, WIDE)
    assert _generate_bodies(pooled, texts[:1], 4) == _generate_bodies(plain, texts[:1], 4)
    # the two wide chats and the three wide /generate answers; the narrow ones stayed here
    assert pool.built - before == 5
    # streamed answers are built on the event loop, and still arrive whole
    r = pooled.post("/v1/chat/completions", {**_chat("stream", WIDE), "stream": True})
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert pool.built - before == 5


def test_a_dead_worker_drops_the_pool_and_nothing_fails(tiny_checkpoint: Path) -> None:
    with real_server(tiny_checkpoint, batch_slots=512, respond_workers=1) as srv:
        pool = srv.server.state.backend.respond
        assert _chat_body(srv, "first", WIDE)["choices"] and pool.built == 1
        (worker,) = _children(os.getpid()) & {p.pid for p in pool._pool._processes.values()}
        os.kill(worker, signal.SIGKILL)
        for i in range(3):  # the answer that finds the pool broken, then the event loop's
            assert len(_chat_body(srv, f"after {i}", WIDE)["choices"]) == WIDE
        assert pool._pool is None and pool.built == 1


def test_workers_end_with_their_server(tiny_checkpoint: Path) -> None:
    srv = real_server(tiny_checkpoint, respond_workers=2).start()
    pids = {p.pid for p in srv.server.state.backend.respond._pool._processes.values()}
    assert len(pids) == 2 and pids <= _children(os.getpid())
    srv.stop()
    assert not pids & _children(os.getpid())
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_with_an_engine_process(tiny_checkpoint: Path, plain: ServerThread) -> None:
    with process_server(tiny_checkpoint, batch_slots=512, respond_workers=1) as srv:
        assert _chat_body(srv, "through the pipe", WIDE) == _chat_body(
            plain, "through the pipe", WIDE
        )
        assert srv.server.state.backend.respond.built == 1


def test_text_sources_other_than_the_sid_table_are_made_here() -> None:
    """Beams whose text is a string or a function other than a SidText: the server makes the
    text and ships it; the body equals the event loop's."""
    beams = [
        BeamResult([5, 6], -1.0, -0.5, "stop", "given text"),
        BeamResult([7], float("-inf"), float("nan"), "length", lambda ids: f"made {ids}"),
    ] * (WIDE // 2)
    res = GenResult("r", beams, 12, 3)
    pool = RespondPool(1, {}, None)
    try:
        got = asyncio.run(pool.chat_json(res, "m", 7))
        gen = asyncio.run(pool.generate_json(res, 0.25))
    finally:
        pool.close()
    assert got == responses.chat_completion_json(res, "m", 7)
    assert gen == responses.generate_result_json(res, 0.25)
    assert pool.built == 2


def test_knob_bounds() -> None:
    assert ServerConfig(model_path="m").respond_workers == 0
    with pytest.raises(ValueError, match="--respond-workers must be in 0..64"):
        ServerConfig(model_path="m", respond_workers=-1)


def test_a_worker_imports_neither_the_app_nor_torch() -> None:
    code = (
        "import sys, flashrec.server.respond_pool; "
        "print('torch' in sys.modules, 'flashrec.server.app' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split() == ["False", "False"]
