"""The soak report from planted samples: a growing resource fails it and is named, as are
gauges left non-idle after the load; /proc sampling sees a process group's members."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from harness.soak import report
from harness.soak.config import SoakConfig
from harness.soak.probe import Probe
from harness.soak.procs import read_proc, sample_group
from harness.soak.run import State, progress_line


def _rows(n: int, fds_per_request: float, conns_step: int = 0) -> list[dict]:
    """``n`` samples; fds leaked at ``fds_per_request``; with ``conns_step``, the client's
    pool of open connections grows by that many halfway (a stall) and stays."""
    rows = []
    for i in range(n):
        done = 500 * (i + 1)
        conns = 4 + (conns_step if i >= n // 2 else 0)
        leaked = 20 + int(done * fds_per_request)
        rows.append({
            "t_s": 60.0 * (i + 1), "requests": done, "sent": done, "rate": 8.3, "ok": 500,
            "errors": 0, "errors_total": 0, "warmup": int(i == 0), "final": int(i == n - 1),
            "probe": "ok", "p50_ms": 20.0 + (i % 3), "p90_ms": 30.0, "p99_ms": 40.0,
            "max_ms": 50.0, "slots_used": 0.0, "processes": 2,
            "rss_mib[engine-7]": 400.0 + (i % 2) * 0.5,
            "fds[engine-7]": leaked + conns, "conns[engine-7]": conns,
            "fds_other[engine-7]": leaked,
        })  # fmt: skip
    return rows


def _write(tmp_path, rows, idle=None):
    cfg = SoakConfig(duration_s=3600, rate=8.3, interval_s=60, warmup_s=60)
    state = State(rows=rows, done=rows[-1]["requests"], sent=rows[-1]["requests"],
                  elapsed_s=rows[-1]["t_s"], idle=idle or {"slots_used": 0.0})  # fmt: skip
    probe = Probe(1e-4)
    probe.sent = 3
    line, passed = report.write(tmp_path, cfg, state, probe, {"command": "test"})
    return line, passed, json.loads((tmp_path / "soak.json").read_text())


def test_a_leaking_fd_fails_the_soak_and_is_named(tmp_path):
    line, passed, doc = _write(tmp_path, _rows(30, 0.002))  # 2 fds per 1,000 requests
    assert not passed and line.endswith("FAIL")
    trend = {t["resource"]: t for t in doc["trends"]}["fds_other[engine-7]"]
    assert trend["verdict"] == "grows" and abs(trend["slope"] - 2.0) < 0.1
    assert len(doc["failures"]) == 1 and doc["failures"][0].startswith("fds_other[engine-7] grows")
    assert "**grows**" in (tmp_path / "REPORT.md").read_text()
    assert (tmp_path / "samples.csv").read_text().count("\n") == 31


def test_a_client_pool_that_grew_is_reported_not_failed(tmp_path):
    """Connections a client keeps open (a pool that grew during a stall, all in rotation
    after) are the client's choice: reported, and the other fds still gated."""
    line, passed, doc = _write(tmp_path, _rows(30, 0.0, conns_step=120))
    assert passed, doc["failures"]
    trends = {t["resource"]: t for t in doc["trends"]}
    assert trends["fds[engine-7]"]["slope"] > 5 and trends["conns[engine-7]"]["slope"] > 5
    assert trends["fds_other[engine-7]"]["verdict"] == "flat"
    assert trends["fds[engine-7]"]["verdict"] == "flat"  # reported only
    _, passed, _ = _write(tmp_path, _rows(30, 0.002, conns_step=120))
    assert not passed  # a leak beside the grown pool is still caught


def test_flat_resources_pass_and_warmup_and_final_rows_are_left_out(tmp_path):
    line, passed, doc = _write(tmp_path, _rows(30, 0.0))
    assert passed and line.endswith("PASS"), doc["failures"]
    assert all(t["samples"] == 28 for t in doc["trends"])


def test_a_child_seen_once_is_one_line_not_a_row_per_resource(tmp_path):
    """A process sampled fewer than 3 times (a child that lived a moment) cannot be fitted:
    the report names it on one line, soak.json keeps its trends, the fitted process keeps
    its rows."""
    rows = _rows(30, 0.0)
    for key, value in (("rss_mib", 9.6), ("fds", 4), ("conns", 0), ("fds_other", 4)):
        rows[12][f"{key}[proc-99]"] = value
    _, passed, doc = _write(tmp_path, rows)
    assert passed, doc["failures"]
    trends = {t["resource"]: t for t in doc["trends"]}
    assert trends["rss_mib[proc-99]"]["verdict"] == "n/a"
    md = (tmp_path / "REPORT.md").read_text()
    assert "`rss_mib[proc-99]`" not in md and "`fds_other[proc-99]`" not in md
    assert "too few samples to fit (every resource n/a; in `soak.json`): `proc-99`." in md
    assert "| `rss_mib[engine-7]` | 28 |" in md and "`fds_other[engine-7]`" in md


def test_gauges_left_busy_after_the_load_fail(tmp_path):
    _, passed, doc = _write(tmp_path, _rows(10, 0.0), idle={"slots_used": 8.0})
    assert not passed and any("not idle" in f for f in doc["failures"])


def test_progress_line():
    row = _rows(3, 0.0)[1]
    text = progress_line(row)
    assert text.startswith("[0:02:00] req 1000 (8.3/s) err 0/0 p50 21 p99 40 ms")
    assert "2 procs rss 400 MiB" in text and "probe ok" in text


def test_open_client_connections_are_told_from_other_fds():
    """The server's side of a connection counts in ``conns`` while the client holds it open;
    once the client closes and the server has not (CLOSE_WAIT: a server's leak), it does not."""
    import socket

    from harness.soak.procs import established_inodes

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        try:
            me = read_proc(os.getpid(), established_inodes(port))
            assert me is not None and me.conns == 1  # the accepted side, not the client's
            client.close()
            deadline = time.monotonic() + 10
            while read_proc(os.getpid(), established_inodes(port)).conns and (
                time.monotonic() < deadline
            ):
                time.sleep(0.05)
            me = read_proc(os.getpid(), established_inodes(port))
            assert me.conns == 0 and me.fds >= 2  # the served socket is still open
        finally:
            served.close()
            client.close()


def test_proc_sampling_sees_a_process_group():
    me = read_proc(os.getpid())
    assert me is not None and me.rss_mib > 1 and me.fds >= 3 and me.threads >= 1
    assert read_proc(2**22 + 12345) is None  # no such pid
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while proc.pid not in sample_group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        got = sample_group(proc.pid)
        assert list(got) == [proc.pid] and got[proc.pid].threads >= 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_latency_around_an_action_finds_the_stall_inside_it(tmp_path):
    """Requests every 0.1 s for 60 s, 30 ms each, but those started in [22.0, 22.5] s wait
    out a 0.8 s stall: an action running from 20 s to 28 s shows them (and when the slowest
    started, from its start); the 5 s after it and an action elsewhere do not."""
    rows = _rows(3, 0.0)
    state = State(rows=rows, done=600, sent=600, elapsed_s=60.0, idle={"slots_used": 0.0})
    for i in range(600):
        t = i / 10
        state.started.append(t)
        state.took.append(22.8 - t if 22.0 <= t <= 22.5 else 0.03)
    state.actions = [
        {"t_s": 20.0, "action": "update_weights", "arg": "/m", "ok": True, "took_s": 8.0,
         "detail": "HTTP 200", "timings_ms": {"load_ms": 3650.4, "copy_ms": 420.2,
         "hash_ms": 3150.0, "swap_ms": 15.84, "swap_wait_ms": 28.0, "release_ms": 30.0}},
        {"t_s": 45.0, "action": "flush_cache", "arg": "", "ok": True, "took_s": 0.05,
         "detail": "HTTP 200"},
    ]  # fmt: skip
    got = report.around_actions(state)
    during, after = got[0]["during"], got[0]["after"]
    assert during["requests"] == 81 and during["max_ms"] == 800.0
    assert during["slowest_started_s"] == 2.0  # 22.0 s: 2 s into the action
    assert after["requests"] == 51 and after["max_ms"] == 30.0
    assert got[1]["during"]["max_ms"] == 30.0 and got[1]["during"]["requests"] == 1
    cfg = SoakConfig(duration_s=60, rate=10, interval_s=20, warmup_s=0)
    probe = Probe(1e-4)
    report.write(tmp_path, cfg, state, probe, {"command": "test"})
    md = (tmp_path / "REPORT.md").read_text()
    assert (
        "| 20 | update_weights /m | 8.00 | 81 | 30 / 720 / 800 | +2.00 (before) | 51 | 30 / 30 / 30 |"
        in md
    )
    # the answer's own phase times beside it; an action whose answer has none shows "-"
    assert (
        "| 8.00 | load 3650, copy 420, hash 3150, swap 15.8, swap_wait 28.0, release 30.0 |" in md
    )
    assert "| 0.05 | - | HTTP 200 |" in md
    doc = json.loads((tmp_path / "soak.json").read_text())
    assert doc["around_actions"][0]["during"] == during


def test_the_phase_a_slow_request_started_in_counts_back_from_the_answer():
    """A weight update answered at 8.0 s whose last phases took copy 420, wait + swap 28 and
    release 30 ms: copy from 7.522 s, swap_wait from 7.942 s, release from 7.970 s."""
    ms = {"load_ms": 5000.0, "copy_ms": 420.0, "swap_wait_ms": 28.0, "release_ms": 30.0}
    order = ("copy_ms", "swap_wait_ms", "release_ms")
    at = [(7.99, "release"), (7.95, "swap_wait"), (7.6, "copy"), (7.5, "before"), (8.1, "after")]
    for t, phase in at:
        assert report.phase_at(t, 8.0, ms, order) == phase, t
    assert report.phase_at(7.6, 8.0, {"copy_ms": 420.0}, order) is None  # a phase untimed
    assert report.phase_at(7.6, 8.0, ms, ()) is None  # an action without phases
