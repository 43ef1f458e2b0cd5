"""``--api-server-count``: several HTTP front-end processes on one port, one engine process.

Real server processes on the tiny checkpoint: connections spread over the front ends, every
front end answers as one server would (same beams, one engine), ``/metrics`` counts every
front end's requests whichever answers the scrape, a SIGTERM drains them all, and a front end
that dies takes the whole server down (exit 1, no process left behind).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import requests
from server_helpers import parse_metrics
from test_server_lifecycle import Proc, cli_argv, start, wait_inflight

from flashrec.config import ServerConfig
from flashrec.server.metrics import Histogram, ServerMetrics

SUCCESS = 'flashrec_requests_total{endpoint="chat",outcome="success"}'


def _chat(content: str, n: int = 4) -> dict:
    return {"messages": [{"role": "user", "content": content}], "n": n}


def _info(url: str) -> dict:
    """``/get_server_info`` over a new connection (the kernel picks the front end)."""
    return requests.get(
        url + "/get_server_info", timeout=30, headers={"Connection": "close"}
    ).json()


def _group_gone(pgid: int, timeout: float = 30.0) -> bool:
    """Whether every process of the server's process group has exited within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_front_ends_share_the_port_and_the_engine(procs: list[Proc], tiny_checkpoint: Path):
    argv = cli_argv(tiny_checkpoint, "--api-server-count", "3", "--gc-gen0-threshold", "4321")
    p = start(procs, argv)
    seen = {}
    for _ in range(60):
        info = _info(p.url)
        seen[info["frontend"]["index"]] = info
    assert set(seen) == {0, 1, 2}  # 60 connections: all miss one front end with p < 1e-9
    assert len({i["frontend"]["pid"] for i in seen.values()}) == 3
    assert {i["frontend"]["count"] for i in seen.values()} == {3}
    assert len({i["engine"]["engine_process_pid"] for i in seen.values()}) == 1  # one engine
    assert seen[0]["frontend"]["pid"] == p.p.pid

    # one request at a time, each on a new connection: every front end gives the same beams
    beams = []
    for _ in range(40):
        r = requests.post(
            p.url + "/v1/chat/completions",
            json=_chat("history: 12, 7, 301"),
            headers={"Connection": "close"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert "ipc;dur=" in r.headers["Server-Timing"]
        beams.append([c["sglext"]["token_ids"] for c in r.json()["choices"]])
    assert all(b == beams[0] for b in beams) and len(beams[0]) == 4

    # whichever front end answers the scrape, it counts all of them
    for _ in range(8):
        m = parse_metrics(requests.get(p.url + "/metrics", timeout=30).text)
        assert m[SUCCESS] == 40
        per = {i: m[f'flashrec_frontend_requests_total{{frontend="{i}"}}'] for i in range(3)}
        assert sum(per.values()) == 40 and min(per.values()) >= 1, per
        assert m["flashrec_ready"] == 1 and m["flashrec_http_inflight_requests"] == 0
        for i in (1, 2):  # each spawned front end's own garbage collector, labelled
            assert f'flashrec_gc_collections_total{{generation="0",process="frontend-{i}"}}' in m
        assert 'flashrec_gc_collections_total{generation="0"}' in m  # front end 0's
        assert 'flashrec_gc_collections_total{generation="0",process="engine"}' in m
        # --gc-gen0-threshold, set in every process of the server (each was spawned)
        for lab in ("", '{process="frontend-1"}', '{process="frontend-2"}', '{process="engine"}'):
            assert m[f"flashrec_gc_gen0_threshold{lab}"] == 4321, lab

    # engine calls work from any front end: 12 flushes land on several of them
    for _ in range(12):
        r = requests.post(p.url + "/flush_cache", headers={"Connection": "close"}, timeout=30)
        assert r.status_code == 200 and r.json()["success"] is True
    pgid = os.getpgid(p.p.pid)
    p.p.send_signal(signal.SIGTERM)
    assert p.p.wait(timeout=60) == 0
    assert _group_gone(pgid), "a front end or the engine outlived the server"


def test_sigterm_drains_every_front_end(
    procs: list[Proc], tiny_checkpoint: Path, tmp_path: Path
) -> None:
    # a planted gate holds the engine after every step (it waits for the file): eight requests,
    # spread over the front ends, stay in flight together on any machine until it opens
    gate = tmp_path / "open"
    gate.touch()  # open while the server starts
    argv = cli_argv(tiny_checkpoint, "--api-server-count", "2", "--shutdown-timeout-s", "30")
    p = start(procs, argv, env={"FLASHREC_TEST_STEP_GATE": str(gate)})
    gate.unlink()
    results: list[int] = []

    def call(i: int) -> None:
        r = requests.post(
            p.url + "/v1/chat/completions",
            json=_chat(f"drain me {i}", 8),
            headers={"Connection": "close"},
            timeout=120,
        )
        results.append(r.status_code)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        assert wait_inflight(p.url, 8, timeout=60), (
            "the eight requests were never in flight together"
        )
        ready = parse_metrics(requests.get(p.url + "/metrics", timeout=30).text)["flashrec_ready"]
        pgid = os.getpgid(p.p.pid)
        p.p.send_signal(signal.SIGTERM)
    finally:
        gate.touch()  # the engine steps on: the drain finishes the eight
    for t in threads:
        t.join(timeout=120)
    assert results == [200] * 8
    assert p.p.wait(timeout=60) == 0
    assert _group_gone(pgid)
    log = "".join(p.log)
    assert "[frontend-1]: shutting down" in log and "[frontend-1]: stopped" in log, log
    assert ready == 1


def test_a_front_end_that_dies_stops_the_server(procs: list[Proc], tiny_checkpoint: Path):
    p = start(procs, cli_argv(tiny_checkpoint, "--api-server-count", "2"))
    for _ in range(100):
        info = _info(p.url)
        if info["frontend"]["index"] == 1:
            break
    else:
        pytest.fail("no connection reached front end 1")
    pgid = os.getpgid(p.p.pid)
    os.kill(info["frontend"]["pid"], signal.SIGKILL)
    assert p.p.wait(timeout=60) == 1
    assert _group_gone(pgid)
    assert "front end 1 exited (exit code -9)" in "".join(p.log)


def test_api_server_count_needs_the_engine_process() -> None:
    base = dict(model_path="/m", device="cpu")
    assert ServerConfig(**base, api_server_count=2).resolved_engine_process  # auto: on
    assert not ServerConfig(**base).resolved_engine_process  # auto on CPU, one front end
    with pytest.raises(ValueError, match="engine-process off"):
        ServerConfig(**base, api_server_count=2, engine_process="off")
    with pytest.raises(ValueError, match="1..64"):
        ServerConfig(**base, api_server_count=0)


def test_front_end_counters_merge() -> None:
    a, b = ServerMetrics(), ServerMetrics()
    for m, n, secs in ((a, 3, 0.02), (b, 2, 0.3)):
        for _ in range(n):
            m.count("chat", "success")
            m.observe_latency("chat", secs)
        m.completion_tokens += 10 * n
    b.count("generate", "invalid")
    b.count_error(400)
    a.count_error(503)
    both = ServerMetrics.merged([a, b])
    assert both.requests[("chat", "success")] == 5 and both.requests[("generate", "invalid")] == 1
    assert both.errors == {400: 1, 503: 1} and both.completion_tokens == 50
    hist = both.latency["chat"]
    assert hist.count == 5 and abs(hist.total - (3 * 0.02 + 2 * 0.3)) < 1e-9
    assert hist.counts[hist.buckets.index(0.025)] == 3 and hist.counts[-1] == 5
    assert a.requests[("chat", "success")] == 3  # the parts are left as they were
    assert both.served() == 6 and a.served() == 3
    with pytest.raises(ValueError, match="buckets"):
        Histogram().add(Histogram(buckets=(1.0,)))
