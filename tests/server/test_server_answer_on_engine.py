"""FLASHREC_ANSWER_ON_ENGINE=idle: a one-prompt, unstreamed answer's body is built by the engine
thread (``GenRequest.finisher``) when it has nothing else to do, and is the body the handler
would have built; with other work in the engine, a failing finisher, a stream, a batch or an
engine process, the handler builds it as before."""

from __future__ import annotations

import multiprocessing as mp
import threading
from typing import Any

import pytest
from knob_helpers import import_with
from server_fakes import FakeEngine
from server_helpers import ServerThread, server_config

from flashrec.engine.loop import EngineLoop
from flashrec.engine.request import GenRequest
from flashrec.server import backend as backend_mod
from flashrec.server import responses
from flashrec.server.engine_process.messages import decode
from flashrec.server.engine_process.proxy import EngineClient


def _held_loop(batch_slots: int = 8) -> tuple[EngineLoop, threading.Event]:
    """A fake-engine loop whose thread is held in a call until the event is set, so that the
    requests submitted meanwhile reach the scheduler together."""
    loop = EngineLoop(FakeEngine(server_config("/models/fake", batch_slots=batch_slots)))
    loop.start()
    gate = threading.Event()
    loop.call_on_engine_thread(lambda: gate.wait(30))
    return loop, gate


def _recording(calls: list[str]):
    def finisher(res):
        calls.append(threading.current_thread().name)
        return f"body of {res.rid}"

    return finisher


def test_the_engine_thread_finishes_a_result_only_when_nothing_else_waits():
    loop, gate = _held_loop(batch_slots=8)
    calls: list[str] = []
    try:
        eng = loop.engine
        ids = eng.build_prompt(text="hello")
        first = eng.new_request(ids, n=8, rid="first")
        second = eng.new_request(ids, n=8, rid="second")  # no rows for it until first ends
        first.finisher = second.finisher = _recording(calls)
        f1, f2 = loop.submit(first), loop.submit(second)
        gate.set()
        r1, r2 = f1.result(30), f2.result(30)
    finally:
        loop.stop()
    assert r1.finished is None  # second was waiting: the handler builds first's body
    assert r2.finished == "body of second"
    assert calls == ["flashrec-engine"]


def test_a_failing_finisher_leaves_the_work_to_the_waiting_side():
    loop, gate = _held_loop()
    try:
        req = loop.engine.new_request(loop.engine.build_prompt(text="x"), n=2, rid="r")

        def boom(res):
            raise RuntimeError("no body")

        req.finisher = boom
        fut = loop.submit(req)
        gate.set()
        res = fut.result(30)
        assert res.finished is None and res.beams and not res.error
        # the thread lives on: the next request is served
        fut2 = loop.submit(loop.engine.new_request([1, 2, loop.engine.layout.sid_begin], n=2))
        assert fut2.result(30).beams
    finally:
        loop.stop()


def test_an_engine_process_request_crosses_the_pipe_without_its_finisher():
    here, there = mp.Pipe()
    client = EngineClient(server_config("/models/fake"), here)
    req = GenRequest("r1", [1, 2, 3], 4, 3, 0.5, 7, catalog="books", finisher=lambda res: "x")
    client.submit(req)
    (sent,) = decode(there.recv())
    assert sent.finisher is None
    assert (sent.rid, sent.input_ids, sent.n, sent.max_tokens, sent.temperature, sent.seed) == (
        "r1", [1, 2, 3], 4, 3, 0.5, 7,
    )  # fmt: skip
    assert sent.catalog == "books" and sent.arrival == req.arrival
    here.close()
    there.close()


def _strip(body: dict[str, Any]) -> dict[str, Any]:
    """A chat body without what differs between two answers of one request."""
    return {k: v for k, v in body.items() if k not in ("id", "created")}


def _generate_beams(out: dict[str, Any]) -> list[Any]:
    return [
        (b["output_ids"], b["text"], b["meta_info"]["sequence_score"])
        for b in out["meta_info"]["beam_results"]
    ]


@pytest.fixture
def built_on(monkeypatch) -> list[str]:
    """The threads that built chat and /generate bodies during the test."""
    threads: list[str] = []
    chat, gen = responses.chat_completion_json, responses.generate_result_json

    def chat_json(*a, **kw):
        threads.append(threading.current_thread().name)
        return chat(*a, **kw)

    def gen_json(*a, **kw):
        threads.append(threading.current_thread().name)
        return gen(*a, **kw)

    monkeypatch.setattr(responses, "chat_completion_json", chat_json)
    monkeypatch.setattr(responses, "generate_result_json", gen_json)
    return threads


def test_served_bodies_are_the_handlers_and_built_on_the_engine_thread(
    real: ServerThread, monkeypatch, built_on: list[str]
) -> None:
    msgs = [{"role": "user", "content": "recommend something like <s_a_1>"}]
    chat = {"messages": msgs, "n": 6, "model": "m"}
    gen = {"text": "history <s_a_3><s_b_4>", "sampling_params": {"beam_width": 6, "n": 4}}
    bodies: dict[str, Any] = {}
    for mode in ("off", "idle"):
        monkeypatch.setattr(backend_mod, "ANSWER_ON_ENGINE", mode)
        built_on.clear()
        answers = []
        for path, body in (("/v1/chat/completions", chat), ("/generate", gen)):
            assert real.post("/flush_cache").status_code == 200  # both modes answer cold
            answers.append(real.post(path, body).json())
        bodies[mode] = tuple(answers)
        engine_built = [t == "flashrec-engine" for t in built_on]
        assert engine_built == ([False, False] if mode == "off" else [True, True]), built_on
    (chat_off, gen_off), (chat_idle, gen_idle) = bodies["off"], bodies["idle"]
    assert len(chat_idle["choices"]) == 6 and _strip(chat_idle) == _strip(chat_off)
    assert chat_idle["model"] == "m"
    assert len(gen_idle["meta_info"]["beam_results"]) == 4
    assert _generate_beams(gen_idle) == _generate_beams(gen_off)
    assert gen_idle["meta_info"]["e2e_latency"] > 0


def test_streams_and_batches_are_built_by_the_handler(
    real: ServerThread, monkeypatch, built_on: list[str]
) -> None:
    monkeypatch.setattr(backend_mod, "ANSWER_ON_ENGINE", "idle")
    gen = {"text": ["a <s_a_1>", "b <s_a_2>"], "sampling_params": {"beam_width": 3, "n": 3}}
    out = real.post("/generate", gen).json()
    assert isinstance(out, list) and len(out) == 2
    assert all(len(o["meta_info"]["beam_results"]) == 3 for o in out)
    assert built_on and "flashrec-engine" not in built_on  # two prompts: the handler's
    msgs = [{"role": "user", "content": "hi"}]
    r = real.post("/v1/chat/completions", {"messages": msgs, "n": 2, "stream": True})
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")


def test_off_is_the_default_and_a_typo_fails_the_import():
    knob = ("flashrec.server.backend", "ANSWER_ON_ENGINE", "FLASHREC_ANSWER_ON_ENGINE")
    got = import_with(*knob)
    assert got.returncode == 0 and got.stdout.strip() == "off", got.stderr
    bad = import_with(*knob, "always")
    assert bad.returncode != 0
    assert "FLASHREC_ANSWER_ON_ENGINE must be idle or off, got 'always'" in bad.stderr
