"""``--engine-process``: the engine in a spawned process of its own behind the same HTTP API.

Answers equal the in-process engine's; the request checks, Server-Timing (with ``ipc``),
``/metrics`` (the engine process's GC samples labelled), ``/flush_cache`` and the profiler
work through the pipe; client disconnects free the engine's rows; an engine that cannot start
or that dies is reported, never hung on.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError
from pathlib import Path

import pytest
import requests
from server_helpers import ServerThread, process_server, real_config

from flashrec.server.engine_process import EngineProcessError, start_engine_process

SCORE_TOL = 1e-5


@pytest.fixture(scope="module")
def proc_srv(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    """A server whose engine runs in its own process (warm-up on, through the pipe)."""
    with process_server(tiny_checkpoint, warmup=True) as srv:
        yield srv


def _chat(content: str, n: int = 4) -> dict:
    return {"messages": [{"role": "user", "content": content}], "n": n}


def _beams(body: dict) -> list[tuple[list[int], float]]:
    return [(c["sglext"]["token_ids"], c["sglext"]["sequence_score"]) for c in body["choices"]]


def test_answers_equal_the_in_process_engine(proc_srv: ServerThread, real: ServerThread) -> None:
    for i, n in enumerate((1, 4, 16)):
        body = _chat(f"history {i}: 12, 7, 301", n)
        a, b = proc_srv.post("/v1/chat/completions", body), real.post("/v1/chat/completions", body)
        assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
        got, want = _beams(a.json()), _beams(b.json())
        assert [t for t, _ in got] == [t for t, _ in want]
        assert all(abs(x - y) <= SCORE_TOL for (_, x), (_, y) in zip(got, want))
        assert [c["message"] for c in a.json()["choices"]] == [
            c["message"] for c in b.json()["choices"]
        ]
    # SGLang's protocol, a batch of two prompts
    gen = {"text": ["history: 5, 6", "history: 9"], "sampling_params": {"n": 4}}
    a, b = proc_srv.post("/generate", gen), real.post("/generate", gen)
    assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
    assert len(a.json()) == 2
    for x, y in zip(a.json(), b.json()):
        got = [r["output_ids"] for r in x["meta_info"]["beam_results"]]
        assert got == [r["output_ids"] for r in y["meta_info"]["beam_results"]]
        assert len(got) == 4 and x["text"] == y["text"]
    # streamed: one chunk with every beam, the usage chunk, [DONE]
    body = {**_chat("history 1: 12, 7, 301", 4), "stream": True}
    events = proc_srv.post("/v1/chat/completions", body).text.strip().split("\n\n")
    assert len(events) == 3 and events[-1] == "data: [DONE]"
    first = json.loads(events[0].removeprefix("data: "))
    plain = real.post("/v1/chat/completions", _chat("history 1: 12, 7, 301", 4)).json()
    assert [c["sglext"]["token_ids"] for c in first["choices"]] == [
        c["sglext"]["token_ids"] for c in plain["choices"]
    ]


def test_engine_runs_elsewhere_and_reports(proc_srv: ServerThread) -> None:
    info = proc_srv.get("/get_server_info").json()
    pid = info["engine"]["engine_process_pid"]
    assert isinstance(pid, int) and pid != os.getpid()
    os.kill(pid, 0)  # alive
    r = proc_srv.post("/v1/chat/completions", _chat("timing"))
    parts = dict(p.split(";dur=") for p in r.headers["Server-Timing"].split(", "))
    assert list(parts) == ["tokenize", "queue", "engine", "ipc", "respond", "handoff", "body_cpu"]
    assert all(float(v) >= 0 for v in parts.values())
    assert float(parts["handoff"]) <= float(parts["respond"])  # from the result's arrival
    m = proc_srv.metrics()
    assert m["flashrec_engine_steps_total"] > 0
    assert 'flashrec_gc_collections_total{generation="0",process="engine"}' in m
    assert 'flashrec_gc_collections_total{generation="0"}' in m  # the server process's own
    assert m["flashrec_slots_used"] == 0
    calls: list[str] = []
    proc = proc_srv.served.proc
    orig = proc.call
    proc.call = lambda name, *a, **kw: calls.append(name) or orig(name, *a, **kw)
    try:
        proc_srv.metrics()
    finally:
        proc.call = orig
    assert calls == ["metrics"]  # one round trip per scrape: stats, profiler state and GC
    flushed = proc_srv.post("/flush_cache")
    assert flushed.status_code == 200 and flushed.json()["success"] is True
    assert proc_srv.metrics()["flashrec_kv_tokens_cached"] == 0


def test_bad_requests_are_400_before_the_pipe(proc_srv: ServerThread) -> None:
    too_wide = proc_srv.post("/v1/chat/completions", _chat("wide", n=10_000))
    assert too_wide.status_code == 400 and "'n'" in too_wide.text
    long = proc_srv.post("/generate", {"input_ids": [5] * 5000, "n": 2})
    assert long.status_code == 400
    assert proc_srv.post("/v1/chat/completions", _chat("after")).status_code == 200
    # the engine's own checks, on the limits the engine process reported
    from flashrec.engine.request import GenRequest

    check = proc_srv.engine.check_request
    with pytest.raises(ValueError, match="--batch-slots"):
        check(GenRequest("w", [5] * 10, 257, 4))
    with pytest.raises(ValueError, match="--max-seq-len"):
        check(GenRequest("l", [5] * 4097, 4, 4))
    with pytest.raises(ValueError, match="max_tokens"):
        check(GenRequest("m", [5] * 10, 4, 0))
    check(GenRequest("ok", [5] * 10, 256, 4))


def test_profile_is_taken_in_the_engine_process(proc_srv: ServerThread, profiler_dir: Path):
    ok = proc_srv.post("/start_profile", {"output_dir": "engine-process"})
    assert ok.status_code == 200, ok.text
    assert proc_srv.metrics()["flashrec_profiler_active"] == 1
    assert proc_srv.post("/start_profile", {}).status_code == 400  # ProfileError crosses
    assert proc_srv.post("/v1/chat/completions", _chat("profiled")).status_code == 200
    stop = proc_srv.post("/stop_profile")
    assert stop.status_code == 200, stop.text
    (path,) = stop.json()["files"]
    assert Path(path).parent == profiler_dir / "engine-process"
    with gzip.open(path, "rt") as fh:
        names = {e.get("name", "") for e in json.load(fh)["traceEvents"]}
    assert "flashrec.schedule" in names
    assert proc_srv.post("/stop_profile").status_code == 400


def test_disconnects_free_the_engine_rows(tiny_checkpoint: Path, tmp_path: Path, monkeypatch):
    # every engine step waits for the gate file (a test plant the child inherits): the 40 stay
    # in flight until all of them are in the engine and their sockets close, on any machine
    gate = tmp_path / "open"
    monkeypatch.setenv("FLASHREC_TEST_STEP_GATE", str(gate))
    bodies = [_chat(f"gone {i}", n=32) for i in range(40)]
    inflight = "flashrec_http_inflight_requests"
    gate.touch()  # open while the server starts
    with process_server(tiny_checkpoint) as srv:
        before = srv.metrics()
        gate.unlink()
        try:
            srv.abandon(bodies, until=lambda: srv.metrics()[inflight] == len(bodies))
            srv.wait_metric(inflight, 0)  # every handler saw its client go
        finally:
            gate.touch()
        m = srv.wait_engine_idle()
        assert m["flashrec_running_requests"] == 0 and m["flashrec_queue_length"] == 0
        assert m["flashrec_slots_used"] == 0 and m["flashrec_kv_tokens_used"] == 0
        # the front end's futures drain as the engine process's cancel answers come back over
        # the pipe, which may be after its gauges read idle
        deadline = time.monotonic() + 30
        while srv.served.in_flight() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.served.in_flight() == 0
        key = 'flashrec_requests_total{endpoint="chat",outcome="cancelled"}'
        assert m[key] - before[key] == len(bodies)
        steps = m["flashrec_engine_steps_total"] - before["flashrec_engine_steps_total"]
        assert steps <= 4  # withdrawn after the step they met, not decoded to the end
        assert srv.post("/v1/chat/completions", _chat("after")).status_code == 200


def test_cancel_reaches_the_engine(tiny_checkpoint: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLASHREC_TEST_STEP_DELAY_MS", "300")  # the child inherits it
    engine = start_engine_process(real_config(tiny_checkpoint, engine_process="on"))
    try:
        from flashrec.engine.request import GenRequest

        (build,) = engine.prompt_builders(1)
        ids = build(messages=[{"role": "user", "content": "cancel me"}])
        fut = engine.submit(GenRequest("c1", ids, 4, 4))
        engine.cancel("c1")
        with pytest.raises(CancelledError):
            fut.result(timeout=60)
        assert engine.in_flight() == 0
        assert engine.stats()["running_requests"] == 0
    finally:
        engine.stop()
    assert not engine.proc.proc.is_alive()


def test_engine_death_fails_waiting_requests_and_stops_the_server(
    tiny_checkpoint: Path, monkeypatch
) -> None:
    monkeypatch.setenv("FLASHREC_TEST_STEP_DELAY_MS", "500")
    srv = process_server(tiny_checkpoint).start()
    try:
        pid = srv.get("/get_server_info").json()["engine"]["engine_process_pid"]
        with requests.Session() as s:
            import threading

            got: dict = {}

            def ask() -> None:
                got["r"] = s.post(
                    srv.url + "/v1/chat/completions", json=_chat("doomed"), timeout=60
                )

            t = threading.Thread(target=ask)
            t.start()
            srv.wait_metric("flashrec_running_requests", 1)  # admitted, stepping slowly
            os.kill(pid, signal.SIGKILL)
            t.join(timeout=60)
        assert "r" in got, "the request got no answer"
        assert got["r"].status_code == 500
        assert "engine process exited" in got["r"].text
        srv._thread.join(timeout=60)  # the server stops by itself
        assert srv.exit_code == 1
    finally:
        if srv._thread.is_alive():
            srv.stop()


def test_a_fatal_signal_in_the_engine_process_dumps_its_python_stacks(
    tiny_checkpoint: Path, capfd
) -> None:
    """A segfault in the engine process (the H200's n=512 crash in ``cuGraphLaunch``) leaves
    every thread's Python stack in the log: which call of which thread it was."""
    engine = start_engine_process(real_config(tiny_checkpoint, engine_process="on"))
    try:
        pid = engine.server_info()["engine_process_pid"]
        os.kill(pid, signal.SIGSEGV)
        # the client's reader thread reaps the process too (it notices the closed pipe): poll the
        # exit code instead of joining here, which races that thread's waitpid
        deadline = time.monotonic() + 60
        while engine.proc.proc.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.proc.proc.exitcode == -signal.SIGSEGV
    finally:
        engine.stop()
    err = capfd.readouterr().err
    assert "Fatal Python error: Segmentation fault" in err
    # the engine thread's stack: it waits for work in the loop
    assert "flashrec/engine/loop.py" in err


def test_a_failed_start_raises_with_the_cause(tmp_path: Path) -> None:
    config = real_config(tmp_path, engine_process="on")  # no checkpoint there
    t0 = time.monotonic()
    with pytest.raises(EngineProcessError, match="config.json"):
        start_engine_process(config)
    assert time.monotonic() - t0 < 120


def test_the_server_process_tokenizers_come_ready_with_the_engine(
    tiny_checkpoint: Path, monkeypatch
) -> None:
    """The server process loads its tokenizer once, and copies one per prompt builder, while
    the engine process builds the engine: after start nothing loads a tokenizer again, and
    every builder has a copy of its own that builds the same prompts."""
    import flashrec.prompt

    loads = []
    real_load = flashrec.prompt.load_tokenizer

    def counted(path: str):
        loads.append(path)
        return real_load(path)

    monkeypatch.setattr(flashrec.prompt, "load_tokenizer", counted)
    config = real_config(tiny_checkpoint, engine_process="on", tokenizer_workers=3)
    engine = start_engine_process(config)
    try:
        assert loads == [str(tiny_checkpoint)]  # one load; the copies are made from it
        monkeypatch.setattr(flashrec.prompt, "load_tokenizer", None)  # any later load: fails
        builders = [engine.prompt_builder() for _ in range(3)]  # 2 workers + the large lane
        toks = {id(b.args[0]) for b in builders} | {
            id(engine.tokenizer),
            id(engine.proc.text.tokenizer),
        }
        assert len(toks) == 5  # no two threads share a tokenizer
        msgs = [{"role": "user", "content": "same prompt"}]
        want = engine.prompt_builders(1)[0](messages=msgs)
        assert all(b(messages=msgs) == want for b in builders) and want
    finally:
        engine.stop()


def test_a_tokenizer_the_server_process_cannot_load_stops_the_engine(
    tiny_checkpoint: Path, monkeypatch
) -> None:
    """The engine process builds (its own tokenizer loads), but the server process's does not:
    the start fails saying so, and the engine process is not left running."""
    import multiprocessing as mp

    import flashrec.prompt

    def broken(path: str):
        raise ValueError("tokenizer.json is truncated")

    monkeypatch.setattr(flashrec.prompt, "load_tokenizer", broken)  # this process only
    before = {p.pid for p in mp.active_children()}  # e.g. the module's server's engine
    with pytest.raises(EngineProcessError, match="could not load the tokenizer: tokenizer.json"):
        start_engine_process(real_config(tiny_checkpoint, engine_process="on"))
    left = [p for p in mp.active_children() if p.pid not in before]
    assert not left, left


def test_engine_process_knob() -> None:
    from flashrec.config import ServerConfig

    assert ServerConfig(device="cpu").resolved_engine_process is False
    assert ServerConfig(device="cuda").resolved_engine_process is True
    assert ServerConfig(device="cuda", engine_process="off").resolved_engine_process is False
    assert ServerConfig(device="cpu", engine_process="on").resolved_engine_process is True
    with pytest.raises(ValueError, match="--engine-process"):
        ServerConfig(engine_process="maybe")


def test_a_full_queue_in_the_engine_process_is_503(tiny_checkpoint: Path, monkeypatch) -> None:
    """The engine process refuses a request past --max-queue-len; the refusal crosses the pipe
    and becomes the same 503 the in-process engine gives."""
    import threading

    monkeypatch.setenv("FLASHREC_TEST_STEP_DELAY_MS", "200")
    # 16 beam-row slots: one n=16 request runs, the next waits, the rest are refused
    with process_server(tiny_checkpoint, max_queue_len=1, batch_slots=16) as srv:
        codes: list[int] = []

        def ask(i: int) -> None:
            r = requests.post(srv.url + "/v1/chat/completions", json=_chat(f"q{i}", 16), timeout=60)
            codes.append(r.status_code)
            if r.status_code == 503:
                assert "queue is full" in r.text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(timeout=60)
        assert sorted(set(codes)) == [200, 503], codes
        assert srv.served.in_flight() == 0
        assert srv.post("/v1/chat/completions", _chat("after")).status_code == 200


def test_gc_freeze_reaches_the_engine_process_without_warmup(tiny_checkpoint: Path) -> None:
    """--gc-freeze freezes the start-up objects of both processes, warm-up or not; and
    --gc-gen0-threshold is the collector's threshold in both (the engine's set in its own
    process, not inherited: it is spawned)."""
    import gc

    before = gc.get_threshold()
    assert before[0] != 4321
    with process_server(
        tiny_checkpoint, warmup=False, gc_freeze=True, gc_gen0_threshold=4321
    ) as srv:
        m = srv.metrics()
        assert m['flashrec_gc_frozen_objects{process="engine"}'] > 1000
        assert m["flashrec_gc_frozen_objects"] > 1000
        assert m['flashrec_gc_gen0_threshold{process="engine"}'] == 4321
        assert m["flashrec_gc_gen0_threshold"] == 4321
    assert gc.get_threshold() == before
