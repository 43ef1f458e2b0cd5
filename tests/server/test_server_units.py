"""Unit tests of the pure pieces: protocol parsing, Prometheus rendering, future bridging."""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import Future

import pytest

from flashrec.server.backend import await_engine
from flashrec.server.errors import APIError
from flashrec.server.metrics import Histogram, ServerMetrics
from flashrec.server.protocol import Limits, SamplingParams, parse_chat, parse_generate

LIMITS = Limits(
    max_beam_rows=64, vocab_size=500, max_seq_len=128, default_n=8, default_max_tokens=4
)
MSGS = [{"role": "user", "content": "x", "name": "ignored"}]


def test_chat_defaults_and_precedence() -> None:
    req = parse_chat({"messages": MSGS}, LIMITS)
    assert (req.params.n, req.params.max_tokens, req.params.temperature) == (8, 4, 0.0)
    assert req.messages == [{"role": "user", "content": "x"}] and not req.stream
    req = parse_chat(
        {
            "messages": MSGS,
            "max_tokens": 9,
            "max_completion_tokens": 2,
            "n": 64,
            "seed": 2**63 - 1,
            "temperature": 1,
        },
        LIMITS,
    )
    assert (req.params.max_tokens, req.params.n, req.params.seed) == (2, 64, 2**63 - 1)
    assert req.params.temperature == 1.0 and isinstance(req.params.temperature, float)


@pytest.mark.parametrize(
    "extra",
    [
        {"seed": 2**63},
        {"max_tokens": 129},
        {"n": 65},
        {"temperature": 10**400},
        {"chat_template_kwargs": {"chat_template": "{{ 1 }}"}},
        {"chat_template_kwargs": {"tokenize": True}},
    ],
)
def test_chat_rejects(extra: dict) -> None:
    with pytest.raises(APIError) as err:
        parse_chat({"messages": MSGS, **extra}, LIMITS)
    assert err.value.status == 400 and err.value.param


def test_generate_parsing() -> None:
    req = parse_generate({"text": "a", "sampling_params": {"n": 2, "beam_width": 3}}, LIMITS)
    assert req.params.n == 3 and req.params.num_return == 2 and not req.batched
    assert parse_generate({"text": "a", "sampling_params": {"beam_width": 3}}, LIMITS).params == (
        SamplingParams(n=3, max_tokens=LIMITS.default_max_tokens, num_return=1)
    )  # upstream: n (returned) defaults to 1
    req = parse_generate({"text": "a", "sampling_params": {"n": 3}}, LIMITS)
    assert req.params.n == 3 and req.params.num_return is None  # ours: n alone = beam width
    with pytest.raises(APIError) as err:
        parse_generate({"text": "a", "sampling_params": {"n": 4, "beam_width": 3}}, LIMITS)
    assert err.value.param == "sampling_params.n"
    req = parse_generate(
        {"input_ids": [[1, 2], [3]], "sampling_params": {"sampling_seed": 5}}, LIMITS
    )
    assert req.batched and [p.input_ids for p in req.prompts] == [[1, 2], [3]]
    assert req.params.seed == 5
    with pytest.raises(APIError):
        parse_generate({"text": ["a"] * 2000}, LIMITS)


def test_histogram_and_render() -> None:
    h = Histogram(buckets=(0.1, 1.0))
    for v in (0.05, 0.5, 5.0):
        h.observe(v)
    lines = list(h.lines("lat", {"endpoint": "chat"}))
    assert lines[:3] == [
        'lat_bucket{endpoint="chat",le="0.1"} 1',
        'lat_bucket{endpoint="chat",le="1.0"} 2',
        'lat_bucket{endpoint="chat",le="+Inf"} 3',
    ]
    assert lines[3].startswith('lat_sum{endpoint="chat"} 5.55')
    m = ServerMetrics()
    m.count("chat", "success")
    text = m.render({"queue_len": 3, "used_slots": 0, "unknown_key": 1}, {"flashrec_ready": 1})
    assert "flashrec_queue_length 3\n" in text and "unknown_key" not in text
    assert 'flashrec_requests_total{endpoint="chat",outcome="success"} 1' in text
    assert "# TYPE flashrec_request_latency_seconds histogram" in text
    for line in text.splitlines():
        if not line.startswith("#"):
            assert not math.isnan(float(line.rsplit(" ", 1)[1]))


def test_await_engine_never_cancels_the_engine_future() -> None:
    fut: Future = Future()

    async def main() -> None:
        task = asyncio.ensure_future(await_engine(fut))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert not fut.cancelled()
    fut.set_result(1)  # the engine can still resolve it

    done: Future = Future()
    done.set_result(7)
    assert asyncio.run(await_engine(done)) == 7


def test_gil_switch_interval_is_checked_and_applied(monkeypatch) -> None:
    """``--gil-switch-interval-ms`` is validated and becomes the process's switch interval
    before the engine starts (its threads are created after it)."""
    import sys

    import flashrec.engine.engine as engine_mod
    import flashrec.engine.loop as loop_mod
    from flashrec.config import ServerConfig
    from flashrec.server import app

    for bad in (0.0, -1.0, 1000.0):
        with pytest.raises(ValueError, match="gil-switch-interval-ms"):
            ServerConfig(gil_switch_interval_ms=bad)
    seen = {}
    monkeypatch.setattr(
        engine_mod, "Engine", lambda cfg: seen.setdefault("at", sys.getswitchinterval())
    )
    monkeypatch.setattr(loop_mod, "EngineLoop", lambda eng: None)
    monkeypatch.setattr(app, "serve", lambda engine, cfg: 0)
    before = sys.getswitchinterval()
    try:
        assert app.run_server(ServerConfig(gil_switch_interval_ms=0.25)) == 0
        assert seen["at"] == pytest.approx(0.00025)
    finally:
        sys.setswitchinterval(before)


def test_gc_watch_times_collections_and_reports_slow_ones_once(caplog) -> None:
    import gc
    import logging

    from flashrec.server.gcwatch import GcWatch

    watch = GcWatch(slow_s=0.0).install()  # every pause counts as slow
    try:
        junk = [[] for _ in range(1000)]
        for a, b in zip(junk, junk[1:]):
            a.append(b), b.append(a)  # reference cycles: only the collector frees them
        del junk, a, b
        gc.collect(2)
        assert watch.collections[2] >= 1 and watch.pause_s[2] > 0
        assert watch.slow >= 1 and watch.max_pause_s > 0
        with caplog.at_level(logging.WARNING, logger="flashrec.server"):
            watch.report_slow(step=7)
            watch.report_slow(step=8)  # nothing new: no second line
        lines = [r.getMessage() for r in caplog.records if "garbage-collector" in r.getMessage()]
        assert len(lines) == 1 and "by engine step 7" in lines[0] and "generation 2" in lines[0]
    finally:
        watch.uninstall()
    assert watch._callback not in gc.callbacks
    before = watch.collections[2]
    gc.collect(2)
    assert watch.collections[2] == before  # uninstalled: no longer counting


def test_parent_watch_fires_when_the_launcher_end_closes(monkeypatch) -> None:
    import os
    import threading

    from flashrec.parentwatch import PARENT_WATCH_ENV, ParentLink, watch_from_env

    read, write = os.pipe()  # as a launched server holds it: the read end named in the env
    monkeypatch.setenv(PARENT_WATCH_ENV, str(read))
    gone = threading.Event()
    thread = watch_from_env(gone.set)
    assert thread is not None and PARENT_WATCH_ENV not in os.environ  # not for our children
    assert not os.get_inheritable(read)
    assert not gone.wait(0.3)  # the launcher's end is open: nothing happens
    os.close(write)  # the launcher exits
    assert gone.wait(10)
    thread.join(10)
    monkeypatch.setenv(PARENT_WATCH_ENV, "not-a-number")
    assert watch_from_env(gone.set) is None
    link = ParentLink()  # the launcher's side hands over exactly one fd, named in its env
    assert link.env == {PARENT_WATCH_ENV: str(link.pass_fds[0])}
    link.launched()
    assert link.pass_fds == ()
    link.close()
