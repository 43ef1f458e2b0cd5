"""End to end through ``flashrec-bench`` on the fake server: the measuring loop's rules."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench_helpers import (
    REPO,
    base_matrix,
    fake_catalog,
    fake_engine,
    processes_with,
    run_cli,
    write_matrix,
)


def load(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def records(out: Path) -> list[dict]:
    with open(out / "records.csv") as f:
        return list(csv.DictReader(f))


def test_full_loop_restarts_warmup_trace(tmp_path, marker):
    catalog = fake_catalog(tmp_path)
    engine = fake_engine(
        "--sid-vocab-file",
        str(catalog),
        "--slow-trace",
        "--trace-write-s",
        "1.0",
        "--slow-first",
        "3",
        "--slow-first-ms",
        "1500",
        "--marker",
        marker,
    )
    m = base_matrix(
        engine,
        axes={"beam_width": [4, 8], "concurrency": [1, 2]},
        trace={
            "cells": "first",
            "num_steps": 7,
            "settle_s": 0.3,
            "timeout_s": 20,
            "spans": ["ProfilerStep#2", "flashrec.absent"],
        },  # fmt: skip
        catalog={"path": str(catalog)},
        gates=[{"metric": "invalid_rate", "op": "==", "value": 0}],
    )
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0
    rep = load(out)
    assert rep["schema_version"] == 1
    assert set(rep) >= {"environment", "matrix", "cells", "parity", "determinism", "gates"}
    assert rep["environment"]["git"]["commit"] and rep["environment"]["matrix_hash"]
    for name in ("records.csv", "summary.csv", "REPORT.md", "report.html"):
        assert (out / name).is_file(), name
    cells = {c["id"]: c for c in rep["cells"]}
    assert len(cells) == 4 and all(c["status"] == "ok" for c in cells.values())
    # restarts only on the server-level axis (beam_width): 2 servers for 4 cells
    assert sorted(p.name for p in (out / "servers").iterdir()) == ["fake-1.log", "fake-2.log"]
    pids = {cid: c["server"]["info"]["pid"] for cid, c in cells.items()}
    assert pids["fake,beam_width=4,concurrency=1"] == pids["fake,beam_width=4,concurrency=2"]
    assert pids["fake,beam_width=4,concurrency=1"] != pids["fake,beam_width=8,concurrency=1"]
    # warm-up excluded: the first 3 requests of each server are 1.5 s slower (a measured one
    # that took 1 s would be one of them: far above any stall of a loaded machine's fake)
    rows = records(out)
    warm = [r for r in rows if r["phase"] == "warmup" and r["cell"].endswith("concurrency=1")]
    assert warm and all(float(r["latency_s"]) > 1.45 for r in warm)
    measured = [float(r["latency_s"]) for r in rows if r["phase"] == "measure"]
    assert len(measured) == 4 * 3 * 10 and max(measured) < 1.0
    for c in cells.values():
        assert c["rounds"] == 3 and len(c["metrics"]["qps"]["values"]) == 3
        assert c["metrics"]["latency_p99_ms"]["median"] < 1000
        assert c["warmup"]["requests"] == 3 and c["warmup"]["failed"] == 0
    # the traced round: waited for the slowly written file; its requests never counted
    first = cells["fake,beam_width=4,concurrency=1"]
    t = first["trace"]
    assert t["status"] == "complete" and t["waited_s"] >= 1.0
    assert len(t["files"]) == 1 and t["files"][0]["steps"] == 7
    assert t["files"][0]["size_bytes"] > 0 and t["files"][0]["device"] == "cpu"
    # trace.spans: each named host span broken down, one the trace lacks said so
    step2, absent = t["files"][0]["span_breakdown"]
    assert step2["span"] == "ProfilerStep#2" and step2["count"] == 1 and step2["host_us"] == 5.0
    assert absent == {"span": "flashrec.absent", "count": 0}
    start, end = t["window"]
    assert {r["phase"] for r in rows} == {"warmup", "prime", "measure", "trace"}
    for r in rows:
        if r["phase"] == "measure":
            assert float(r["t_end"]) < start or float(r["t_send"]) > end
    assert sum(c["trace"] is not None for c in cells.values()) == 1
    assert rep["gates"]["status"] == "pass"
    assert rep["parity"] == {"status": "not_configured"}
    assert processes_with(marker) == []
    md = (out / "REPORT.md").read_text()
    assert "## Traces" in md and "fake,beam_width=8,concurrency=2" in md
    assert "host span ProfilerStep#2 x1: 0.01 ms each on the host" in md
    assert "host span flashrec.absent: not in the trace" in md


def test_crash_hang_and_bad_flag_fail_only_their_cells(tmp_path, marker):
    once = tmp_path / "crashed-once"
    m = base_matrix(
        None,
        engines=[
            fake_engine("--crash-once-file", str(once), "--marker", marker, name="fake"),
            fake_engine("--fail-start", "--marker", marker, name="bad"),
            fake_engine("--hang-after", "4", "--marker", marker, name="hang"),
        ],
        axes={"crash_after": [0, 20], "concurrency": [1, 2]},
        exclude=[
            {"engine": ["bad", "hang"], "crash_after": 20},
            {"engine": "hang", "concurrency": 2},
        ],
        load={"rounds": 3, "beam_width": 4, "request_timeout_s": 1.0},
    )
    del m["engine"]
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 3
    cells = {c["id"]: c for c in load(out)["cells"]}
    status = {k: v["status"] for k, v in cells.items()}
    assert status == {
        "fake,crash_after=0,concurrency=1": "ok",
        "fake,crash_after=0,concurrency=2": "ok",
        "fake,crash_after=20,concurrency=1": "failed",
        "fake,crash_after=20,concurrency=2": "ok",  # a fresh server for the next cell
        "bad,crash_after=0,concurrency=1": "failed",
        "bad,crash_after=0,concurrency=2": "failed",
        "hang,crash_after=0,concurrency=1": "failed",
    }
    crashed = cells["fake,crash_after=20,concurrency=1"]
    assert "exited with code 3" in crashed["error"] and "crashing" in crashed["log_tail"]
    assert "server start failed" in cells["bad,crash_after=0,concurrency=1"]["error"]
    assert "impossible flag" in cells["bad,crash_after=0,concurrency=2"]["log_tail"]
    assert "not answering" in cells["hang,crash_after=0,concurrency=1"]["error"]
    assert processes_with(marker) == []
    assert "## Failed: hang,crash_after=0,concurrency=1" in (out / "REPORT.md").read_text()


def _server_round_metrics(cell: dict) -> dict:
    """A report cell's metrics that come from the server's per-round deltas."""
    keys = ("server_cpu_ms_per_request", "server_gc_pause_ms", "harness_cpu_cores")
    return {k: v["median"] for k, v in cell["metrics"].items() if k in keys}


def test_only_resume_dry_run(tmp_path, marker, capsys):
    m = base_matrix(
        fake_engine("--marker", marker),
        axes={"beam_width": [4, 8], "concurrency": [1, 2]},
        load={"rounds": 2, "beam_width": 4},
    )
    path = write_matrix(tmp_path, m)
    assert run_cli(str(path), "--dry-run", "--only", "concurrency=1") == 0
    plan = capsys.readouterr().out
    assert "2 cell(s), 2 server start(s)" in plan and "--beam-width 8" in plan
    out = tmp_path / "out"
    assert run_cli(str(path), "--out", str(out), "--only", "concurrency=1") == 0
    first = load(out)
    assert len(first["cells"]) == 2 and first["measurement"]["resumed_cells"] == 0
    # the server's per-round figures (its CPU, GC pauses: cell.json's server_rounds) by cell
    per_round = {c["id"]: _server_round_metrics(c) for c in first["cells"]}
    assert all(per_round.values()), per_round
    assert not any(c["resumed"] for c in first["cells"])
    assert first["measurement"]["rules"][0].startswith("every server was started fresh by this run")
    done = out / "cells" / "fake,beam_width=4,concurrency=1" / "cell.json"
    stamp = json.loads(done.read_text())["measured"]
    assert stamp["git"] == first["environment"]["git"]["commit"] and stamp["at"]
    # a cell measured elsewhere: the resumed report must not pass it off as its own
    other = done.parent.parent / "fake,beam_width=8,concurrency=1" / "cell.json"
    meta = json.loads(other.read_text())
    meta["measured"] = {**meta["measured"], "host": "gpu-box-7", "gpu": "NVIDIA H200"}
    other.write_text(json.dumps(meta))
    before = done.stat().st_mtime_ns
    assert run_cli(str(path), "--out", str(out), "--resume", "--rounds", "2") == 0
    rep = load(out)
    assert len(rep["cells"]) == 4 and all(c["status"] == "ok" for c in rep["cells"])
    assert done.stat().st_mtime_ns == before, "finished cells are not rerun"
    cells = {c["id"]: c for c in rep["cells"]}
    assert rep["measurement"]["resumed_cells"] == 2
    assert "2 of 4 cells were measured by an earlier run" in rep["measurement"]["rules"][0]
    assert [c["resumed"] for c in rep["cells"]] == [True, False, True, False]
    # a resumed cell keeps them: cell.json's round keys come back as text, the records' as ints
    for cid, metrics in per_round.items():
        assert _server_round_metrics(cells[cid]) == metrics, cid
    assert cells["fake,beam_width=4,concurrency=1"]["notes"][0] == (
        f"resumed: measured {stamp['at']} on {stamp['host']}, git {stamp['git'][:7]}"
        + (f" (dirty, tree {stamp['tree'][:7]})" if stamp["dirty"] else "")
    )
    moved = cells["fake,beam_width=8,concurrency=1"]["notes"][0]
    assert "on gpu-box-7, NVIDIA H200" in moved and moved.endswith("(not this report's machine)")
    assert not any("resumed" in n for n in cells["fake,beam_width=4,concurrency=2"]["notes"])
    assert "resumed: measured" in (out / "REPORT.md").read_text()
    assert len(list((out / "servers").iterdir())) == 4
    other = write_matrix(tmp_path, {**m, "name": "other"}, "other.yaml")
    assert run_cli(str(other), "--out", str(out), "--resume") == 2
    assert processes_with(marker) == []


def test_external_servers_both_protocols_radix_open_loop(tmp_path, fake_url):
    m = base_matrix(
        None,
        engines=[
            {"name": "chat", "kind": "external", "url": fake_url, "protocol": "chat"},
            {"name": "gen", "kind": "external", "url": fake_url, "protocol": "generate"},
        ],
        axes={"radix": ["warm", "cold"]},
        load={"mode": "poisson", "rate": 60, "duration_s": 0.4, "rounds": 2, "beam_width": 4},
        gates=[
            {"metric": "invalid_rate", "op": "==", "value": 0},
            {"path": "summary.failed", "op": "==", "value": 0},
        ],
    )
    del m["engine"]
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0
    rep = load(out)
    cells = {c["id"]: c for c in rep["cells"]}
    # (a server-flag axis over external engines only is refused at load: test_spec_hints)
    assert sorted(cells) == [
        "chat,radix=cold",
        "chat,radix=warm",
        "gen,radix=cold",
        "gen,radix=warm",
    ]
    assert not (out / "servers").exists()
    for c in cells.values():
        # no catalog: the beams were not checked against one, so no invalid rate (not 0)
        assert c["status"] == "ok" and "invalid_rate" not in c["metrics"]
        assert "no catalog" in c["unchecked"]["invalid_rate"]
        assert c["metrics"]["beams_mean"]["median"] == 4
        # not launched by the run: no start time, and no other-CPU reading (no known group)
        assert "startup_s" not in c["server"] and "host_other_cpu_cores" not in c["metrics"]
    # radix: every round starts flushed; warm rounds are primed first, cold ones are not
    firsts = [r for r in records(out) if r["phase"] == "measure" and r["index"] == "0"]
    assert len(firsts) == 4 * 2
    for r in firsts:
        cached = int(r["cached_tokens"])
        assert (cached > 0) if r["cell"].endswith("warm") else (cached == 0), r
    assert [g["status"] for g in rep["gates"]["results"]] == ["no_data", "pass"]
    assert (out / "report.html").read_text().count("data:image/png") >= 2


def test_invalid_sids_fail_the_gate(tmp_path, marker):
    catalog = fake_catalog(tmp_path)
    args = ["--sid-vocab-file", str(catalog), "--invalid-every", "3", "--dup-every", "4"]
    m = base_matrix(
        fake_engine(*args, "--marker", marker),
        catalog={"path": str(catalog)},
        load={"rounds": 2, "beam_width": 8},
        gates=[{"name": "valid", "metric": "invalid_rate", "op": "==", "value": 0}],
    )
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 1
    rep = load(out)
    c = rep["cells"][0]
    assert c["metrics"]["invalid_rate"]["median"] > 0
    assert c["metrics"]["duplicate_rate"]["median"] > 0
    assert rep["gates"]["results"][0]["status"] == "fail"
    assert any("invalid SID" in n for n in c["notes"])


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_leaves_no_process(tmp_path, marker, sig, code):
    m = base_matrix(
        fake_engine("--latency-ms", "50", "--spawn-child", "--marker", marker),
        axes={"concurrency": [1, 2]},
        load={"rounds": 1000, "beam_width": 4},  # far from done when the signal comes
    )
    path = write_matrix(tmp_path, m)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", str(path), "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    deadline = time.monotonic() + 120  # an interpreter start on a saturated machine is slow
    while not processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    assert processes_with(marker), "server did not start"
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, output
    if sig == signal.SIGINT:
        assert b"--resume" in output
    deadline = time.monotonic() + 10  # the harness stopped the group before exiting
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker) == []


def test_a_run_stopped_after_a_cell_reports_that_cell(tmp_path, marker):
    """SIGTERM (a time limit's ``timeout``) after the first cell: the report holds that cell,
    says it was interrupted and how far it got; an earlier run's report in the directory is
    moved aside, not left looking like this run's; --resume then runs only the rest."""
    m = base_matrix(
        fake_engine("--latency-ms", "20", "--marker", marker),
        axes={"concurrency": [1, 2]},
        load={"rounds": 2, "beam_width": 4},
        link={"requests": "3 if concurrency == 1 else 2000"},  # the second cell runs ~40 s
    )
    path = write_matrix(tmp_path, m)
    out = tmp_path / "out"
    out.mkdir()
    (out / "REPORT.md").write_text("an earlier run's report\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", str(path), "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = list((out / "cells").glob("*concurrency=1*/cell.json"))
        if done:
            break
        time.sleep(0.1)
    assert done, "the first cell did not finish"
    time.sleep(0.5)  # the second cell is running
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, output
    assert b"after 1 of 2 cells" in output and b"--resume" in output
    rep = load(out)
    assert rep["interrupted"] == {"cause": "SIGTERM", "cells_done": 1, "cells_selected": 2}
    assert [c["params"]["concurrency"] for c in rep["cells"]] == [1]
    assert rep["cells"][0]["status"] == "ok"
    md = (out / "REPORT.md").read_text()
    assert "INTERRUPTED (SIGTERM) after 1 of 2 selected cells" in md
    old = list(out.glob("superseded-*/REPORT.md"))
    assert len(old) == 1 and old[0].read_text() == "an earlier run's report\n"
    time.sleep(0.2)
    assert processes_with(marker) == []


def test_max_wall_s_starts_no_cell_past_the_budget(tmp_path, marker):
    """--max-wall-s: the first cell always runs; after it the mean cell time no longer fits, so
    the run stops there with a report of that cell (marked INTERRUPTED, the budget named) and
    no server left; --resume then runs the rest."""
    m = base_matrix(
        fake_engine("--latency-ms", "5", "--marker", marker),
        axes={"concurrency": [1, 2, 4]},
        load={"rounds": 2, "beam_width": 4},
    )
    path = write_matrix(tmp_path, m)
    out = tmp_path / "out"
    code = run_cli(str(path), "--out", str(out), "--max-wall-s", "0.5")
    assert code == 130
    rep = load(out)
    assert rep["interrupted"]["cells_done"] == 1 and rep["interrupted"]["cells_selected"] == 3
    assert rep["interrupted"]["cause"].startswith("time budget")
    assert [c["params"]["concurrency"] for c in rep["cells"]] == [1]
    assert processes_with(marker) == []
    assert run_cli(str(path), "--out", str(out), "--resume") == 0
    rep = load(out)
    assert "interrupted" not in rep
    assert sorted(c["params"]["concurrency"] for c in rep["cells"]) == [1, 2, 4]
    assert run_cli(str(path), "--out", str(tmp_path / "o2"), "--max-wall-s", "0") == 2


def test_burst_load_through_the_runner(tmp_path, fake_url):
    """A matrix with ``load.mode: burst``: bursts of ``concurrency`` requests, their makespans
    in the cell metrics and in REPORT.md's burst table."""
    m = base_matrix(
        None,
        engines=[{"name": "chat", "kind": "external", "url": fake_url, "protocol": "chat"}],
        load={"mode": "burst", "concurrency": 5, "rounds": 3, "beam_width": 4},
    )
    del m["engine"]
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0
    (cell,) = load(out)["cells"]
    assert cell["status"] == "ok"
    mm = cell["metrics"]
    assert 0 < mm["burst_ms_mean"]["median"] <= mm["burst_ms_max"]["median"]
    # a burst's makespan is at least its slowest request
    assert mm["burst_ms_max"]["median"] >= mm["latency_p50_ms"]["median"]
    report = (out / "REPORT.md").read_text()
    assert "Bursts (requests sent together)" in report and "burst makespan mean ms" in report


def test_each_cell_records_its_server_start_time(tmp_path, marker):
    """report.json keeps how long each launched server took from launch to a 200 on /health
    (the fake answers 503 for its first 1.5 s); an external server has none."""
    engine = fake_engine("--startup-s", "1.5", "--marker", marker)
    m = base_matrix(engine, axes={"beam_width": [4, 8]})
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0
    starts = [c["server"]["startup_s"] for c in load(out)["cells"]]
    assert len(starts) == 2 and all(1.5 <= s < 20 for s in starts), starts


def _one_traced_cell(tmp_path: Path, engine: dict, timeout_s: float) -> tuple[Path, dict]:
    """One n=4 c=1 cell on ``engine``, one measured round and a 3-step traced round waited
    for up to ``timeout_s``: the run's directory and its cell."""
    m = base_matrix(
        engine,
        axes={"beam_width": [4], "concurrency": [1]},
        load={"rounds": 1, "beam_width": 4, "request_timeout_s": 10},
        trace={"cells": "first", "num_steps": 3, "settle_s": 0.2, "timeout_s": timeout_s},
    )
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0
    (cell,) = load(out)["cells"]
    return out, cell


def test_a_trace_that_never_completes_is_said_in_the_cell(tmp_path, marker):
    """A traced round whose file is still being written at trace.timeout_s: the cell keeps its
    measured rounds (the trace is an extra), and its notes say the trace timed out, where the
    report shows the cell, not only in the trace entry."""
    engine = fake_engine("--slow-trace", "--trace-write-s", "30", "--marker", marker)
    out, cell = _one_traced_cell(tmp_path, engine, timeout_s=1.5)
    assert cell["status"] == "ok" and cell["trace"]["status"] == "timeout", cell["trace"]
    assert any(n.startswith("trace timeout: no complete trace file") for n in cell["notes"])
    assert "trace timeout" in (out / "REPORT.md").read_text()
    assert not processes_with(marker)


def test_a_gpu_trace_gives_the_work_per_request_of_its_window(tmp_path, marker):
    """A trace with torch.profiler's base time (the fake's ``--gpu-trace``: one kernel per
    request it served while profiling): the runner counts the traced round's answers inside
    the trace's GPU window, on the harness's clock mapped to Unix time, and the report gives
    the GPU work per request. A wrong mapping (seconds off) would find none."""
    engine = fake_engine("--gpu-trace", "--latency-ms", "20", "--marker", marker)
    out, cell = _one_traced_cell(tmp_path, engine, timeout_s=20)
    (f,) = cell["trace"]["files"]
    traced = [r for r in records(out) if r["phase"] == "trace" and r["status"] == "ok"]
    # each answer ends after its kernel: the last one (at least) falls after the window
    assert 2 <= f["requests_in_window"] < len(traced), (f, len(traced))
    # one request at a time: the busy time between the first and the last answer inside the
    # window is the work of the requests after the first, a kernel of the fake's 20 ms each
    assert f["estimate"] == "between answers"
    assert f["requests_counted"] == f["requests_in_window"] - 1
    assert 19.0 <= f["gpu_ms_per_request"] <= 45.0, f  # 20 ms sleeps, a loaded host's overshoot
    # each measured round: the busy share that work implies at the round's QPS
    (rnd,) = cell["round_metrics"]
    assert rnd["gpu_busy_implied"] == pytest.approx(f["gpu_ms_per_request"] * rnd["qps"] / 1e3)
    assert 0.3 < rnd["gpu_busy_implied"] <= 1.05  # c=1, each request ~20 ms of the fake's work
    assert "GPU busy implied in the measured rounds" in (out / "REPORT.md").read_text()
    assert "GPU work per request:" in (out / "REPORT.md").read_text()
    assert not processes_with(marker)


def test_work_per_request_only_where_one_file_holds_the_gpu_work():
    """One GPU file in the traced round: the round's ok requests counted by their engine spans
    (the Server-Timing engine phase, placed before respond and ipc; the whole request where
    the server gives none); two files (replicas behind a router, each counting every
    answer) or none: no estimate at all."""
    from harness.load.client import EPOCH_UNIX, Record
    from harness.run.cell import add_work_per_request, engine_span

    def gpu_file() -> dict:
        return {"gpu_window_unix": [EPOCH_UNIX + 10.0, EPOCH_UNIX + 11.0], "gpu_busy_us": 1e5}

    def rec(i: int, t_send: float, rnd: int = 3, phase: str = "trace", **kw) -> Record:
        r = Record("c", rnd, phase, i, 0, t_send=t_send, t_end=t_send + 0.2, **kw)
        r.server_ms = {"tokenize": 10.0, "engine": 150.0, "ipc": 5.0, "respond": 15.0}
        return r

    r = rec(0, 10.0)
    assert engine_span(r) == pytest.approx(
        (EPOCH_UNIX + 10.03, EPOCH_UNIX + 10.18, EPOCH_UNIX + 10.2)
    )
    bare = Record("c", 3, "trace", 9, 0, t_send=9.0, t_end=9.5)  # no Server-Timing
    assert engine_span(bare) == (EPOCH_UNIX + 9.0, EPOCH_UNIX + 9.5, EPOCH_UNIX + 9.5)
    recs = [rec(i, 10.0 + i / 5) for i in range(4)]  # engine spans inside the window
    recs += [
        rec(5, 10.4, status="error"),
        rec(6, 10.4, rnd=2, phase="measure"),
        rec(7, 11.5),  # after the window
    ]
    one = [gpu_file(), {"device": "cpu"}]
    add_work_per_request(one, recs, 3)
    assert one[0]["requests_counted"] == 4.0 and one[0]["gpu_ms_per_request"] == 25.0
    assert "requests_in_window" not in one[1]
    two = [gpu_file(), gpu_file()]
    add_work_per_request(two, recs, 3)
    assert all("requests_in_window" not in f for f in two)
