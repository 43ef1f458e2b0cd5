"""Server-Timing: header parsing and the per-round latency breakdown the report shows."""

from __future__ import annotations

import math

from harness.load.client import Record, parse_server_timing
from harness.metrics.rounds import round_metrics


def test_parse_server_timing():
    assert parse_server_timing("tokenize;dur=1.25, queue;dur=0.5, engine;dur=28") == {
        "tokenize": 1.25,
        "queue": 0.5,
        "engine": 28.0,
    }
    assert parse_server_timing('db;desc="x";dur="3.5", cache;desc=hit, bad;dur=x') == {"db": 3.5}
    assert parse_server_timing("") == {}


def _rec(i: int, latency_s: float, server_ms: dict) -> Record:
    r = Record("c", 0, "measure", i, i, t_send=float(i), t_end=float(i) + latency_s)
    r.server_ms = server_ms
    return r


def test_round_metrics_break_the_latency_down():
    recs = [
        _rec(0, 0.040, {"tokenize": 1.0, "queue": 2.0, "engine": 30.0}),
        _rec(1, 0.050, {"tokenize": 3.0, "queue": 0.0, "engine": 40.0}),
    ]
    m = round_metrics(recs)
    assert math.isclose(m["server_engine_ms_mean"], 35.0)
    assert math.isclose(m["server_tokenize_ms_mean"], 2.0)
    assert math.isclose(m["server_queue_ms_mean"], 1.0)
    assert math.isclose(m["outside_server_ms_mean"], ((40 - 33) + (50 - 43)) / 2)
    # the host path: the latency less the engine's own time
    assert math.isclose(m["host_path_ms_mean"], ((40 - 30) + (50 - 40)) / 2)
    assert "server_respond_ms_mean" not in m  # a server without the respond phase
    assert "server_engine_ms_mean" not in round_metrics([_rec(0, 0.04, {})])  # no header
    # with respond on every request it is its own column and leaves "outside"
    both = [
        _rec(0, 0.040, {"tokenize": 1.0, "queue": 2.0, "engine": 30.0, "respond": 3.0}),
        _rec(1, 0.050, {"tokenize": 3.0, "queue": 0.0, "engine": 40.0, "respond": 1.0}),
    ]
    m = round_metrics(both)
    assert math.isclose(m["server_respond_ms_mean"], 2.0)
    assert math.isclose(m["outside_server_ms_mean"], ((40 - 36) + (50 - 44)) / 2)
    # on only some requests it is left out (a mean over some would not add up)
    m = round_metrics([both[0], recs[1]])
    assert "server_respond_ms_mean" not in m
    assert math.isclose(m["outside_server_ms_mean"], ((40 - 33) + (50 - 43)) / 2)
    assert Record("c", 0, "measure", 0, 0, 0.0).row().keys() >= {"latency_s"}
    assert _rec(0, 0.04, {"engine": 3.0}).row()["server_engine_ms"] == 3.0


def test_ipc_phase_is_its_own_column():
    """An engine process's pipe time (FlashRec --engine-process) is a phase of its own: its
    mean is a round metric, it leaves "outside", and the report table gets an ipc column."""
    from harness.report.render_sections import server_timing_table

    recs = [
        _rec(0, 0.040, {"tokenize": 1.0, "queue": 2.0, "engine": 30.0, "ipc": 1.5, "respond": 2.0}),
        _rec(1, 0.050, {"tokenize": 3.0, "queue": 0.0, "engine": 40.0, "ipc": 0.5, "respond": 1.0}),
    ]
    m = round_metrics(recs)
    assert math.isclose(m["server_ipc_ms_mean"], 1.0)
    assert math.isclose(m["outside_server_ms_mean"], ((40 - 36.5) + (50 - 44.5)) / 2)
    assert math.isclose(m["host_path_ms_mean"], ((40 - 30) + (50 - 40)) / 2)  # ipc counts
    no_ipc = _rec(1, 0.05, {"tokenize": 1.0, "queue": 0.0, "engine": 1.0, "respond": 1.0})
    assert "server_ipc_ms_mean" not in round_metrics([recs[0], no_ipc])
    table = server_timing_table(
        {
            "cells": [
                {
                    "id": "a",
                    "metrics": {
                        k: {"median": v, "ci95_low": v, "ci95_high": v} for k, v in m.items()
                    },
                }
            ]
        }
    )
    assert table is not None
    head, rows = table
    assert (
        head.index("ipc") == head.index("engine") + 1
        and head.index("respond") == head.index("ipc") + 1
    )
    assert len(rows[0]) == len(head)


def test_handoff_is_a_detail_of_respond_never_summed():
    """FlashRec's ``handoff`` (respond's part up to the handler) is reported beside respond,
    leaves "outside" as it was, and needs respond counted and on every timed request."""
    from harness.report.render_sections import server_timing_table

    phases = {"tokenize": 1.0, "queue": 2.0, "engine": 30.0, "respond": 3.0}
    recs = [
        _rec(0, 0.040, {**phases, "handoff": 1.0}),
        _rec(1, 0.050, {**phases, "engine": 40.0, "respond": 1.0, "handoff": 0.5}),
    ]
    m = round_metrics(recs)
    assert math.isclose(m["server_handoff_ms_mean"], 0.75)
    assert math.isclose(m["outside_server_ms_mean"], ((40 - 36) + (50 - 44)) / 2)
    assert "server_handoff_ms_mean" not in round_metrics([recs[0], _rec(1, 0.05, phases)])
    no_respond = {k: v for k, v in recs[0].server_ms.items() if k != "respond"}
    assert "server_handoff_ms_mean" not in round_metrics([_rec(0, 0.04, no_respond)])
    cell = {
        "id": "a",
        "metrics": {k: dict.fromkeys(("median", "ci95_low", "ci95_high"), v) for k, v in m.items()},
    }
    head, rows = server_timing_table({"cells": [cell]})
    assert head.index("of respond: hand-off") == head.index("respond") + 1
    assert rows[0][head.index("of respond: hand-off")].startswith("0.8")


def test_body_cpu_is_a_detail_of_respond_beside_the_handoff():
    """FlashRec's ``body_cpu`` (the event loop's CPU time after the hand-off) is averaged
    like the hand-off, shown after it, never summed: "outside" is what it was without it."""
    from harness.report.render_sections import server_timing_table

    phases = {"tokenize": 1.0, "queue": 2.0, "engine": 30.0, "respond": 3.0, "handoff": 1.0}
    recs = [
        _rec(0, 0.040, {**phases, "body_cpu": 1.5}),
        _rec(1, 0.050, {**phases, "engine": 40.0, "body_cpu": 0.5}),
    ]
    m = round_metrics(recs)
    assert math.isclose(m["server_body_cpu_ms_mean"], 1.0)
    assert math.isclose(m["outside_server_ms_mean"], ((40 - 36) + (50 - 46)) / 2)
    assert "server_body_cpu_ms_mean" not in round_metrics([recs[0], _rec(1, 0.05, phases)])
    cell = {
        "id": "a",
        "metrics": {k: dict.fromkeys(("median", "ci95_low", "ci95_high"), v) for k, v in m.items()},
    }
    head, rows = server_timing_table({"cells": [cell]})
    col = head.index("after it: event-loop CPU")
    assert col == head.index("of respond: hand-off") + 1 and len(rows[0]) == len(head)
    assert rows[0][col].startswith("1.0")
