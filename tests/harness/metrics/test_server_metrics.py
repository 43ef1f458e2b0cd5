"""harness.metrics.server: /metrics scrapes around a round -> the server's GC deltas."""

from __future__ import annotations

import math

from harness.load.client import Record
from harness.metrics.rounds import round_metrics
from harness.metrics.server import (
    capacity_notes,
    chain,
    gc_delta,
    parse_prometheus,
    round_extra,
)

BEFORE = """# HELP flashrec_gc_pause_seconds_total x
# TYPE flashrec_gc_pause_seconds_total counter
flashrec_gc_pause_seconds_total{generation="0"} 0.010
flashrec_gc_pause_seconds_total{generation="1"} 0.002
flashrec_gc_pause_seconds_total{generation="2"} 0.0
flashrec_gc_collections_total{generation="2"} 0
flashrec_gc_slow_pauses_total 0
garbage line
"""
AFTER = BEFORE.replace('"2"} 0.0', '"2"} 0.2').replace('generation="2"} 0\n', 'generation="2"} 1\n')
AFTER = AFTER.replace("flashrec_gc_slow_pauses_total 0", "flashrec_gc_slow_pauses_total 1")


def test_gc_delta_of_a_round_with_one_full_collection():
    b, a = parse_prometheus(BEFORE), parse_prometheus(AFTER)
    assert b['flashrec_gc_pause_seconds_total{generation="1"}'] == 0.002
    d = gc_delta(b, a)
    assert math.isclose(d["server_gc_pause_ms"], 200.0)
    assert d["server_gc_full_collections"] == 1 and d["server_gc_slow_pauses"] == 1
    assert gc_delta(b, None) == {} and gc_delta({}, a) == {}
    assert gc_delta({"other_total": 1.0}, {"other_total": 2.0}) == {}  # another engine


def test_round_extra_lands_in_its_round_only():
    recs = [
        Record("c", rnd, "measure", i, i, t_send=float(i), t_end=i + 0.1)
        for rnd in (0, 1)
        for i in range(2)
    ]
    extra = chain(
        None,
        round_extra({1: {"server_gc_pause_ms": 200.0}}),
        lambda ok, out: {"seen": out.get("server_gc_pause_ms", -1.0)},
    )
    m0 = round_metrics([r for r in recs if r.round == 0], extra)
    m1 = round_metrics([r for r in recs if r.round == 1], extra)
    assert "server_gc_pause_ms" not in m0 and m0["seen"] == -1.0
    assert m1["server_gc_pause_ms"] == 200.0 and m1["seen"] == 200.0  # later extras see it
    assert chain(None, None) is None and round_extra({}) is None


def test_capacity_notes_name_a_slot_budget_below_the_load():
    m = {"flashrec_slots_total": 1024.0}
    (note,) = capacity_notes(m, m, beam_width=512, concurrency=8)
    assert "512 x concurrency 8 = 4096 > the server's 1024 slots" in note
    assert "at most 2 request(s) run at once" in note
    assert capacity_notes(m, m, beam_width=128, concurrency=8) == []  # 1024 rows: fits
    assert capacity_notes({}, {}, beam_width=512, concurrency=8) == []  # another engine


def test_capacity_notes_name_eager_decode_beside_graph_replays():
    b = {"flashrec_decode_eager_forwards_total": 0.0, "flashrec_decode_graph_forwards_total": 10.0}
    a = {"flashrec_decode_eager_forwards_total": 2.0, "flashrec_decode_graph_forwards_total": 30.0}
    (note,) = capacity_notes(b, a, beam_width=16, concurrency=1)
    assert note.startswith("eager decode:")
    assert capacity_notes(b, b, beam_width=16, concurrency=1) == []  # none in the round
    cpu = {**a, "flashrec_decode_graph_forwards_total": 10.0}  # no graph replay: CPU / eager
    assert capacity_notes(b, cpu, beam_width=16, concurrency=1) == []
