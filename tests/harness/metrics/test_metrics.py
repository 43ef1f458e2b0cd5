"""harness.metrics.rounds: per-round metrics from records; warm-up and exclusions never count."""

from __future__ import annotations

import pytest

from harness.load.client import Record
from harness.metrics.rounds import cell_metrics, direction, notes, round_metrics
from harness.spec.matrix import StatsSpec


def rec(rnd, phase, i, t0, t1, status="ok", **kw) -> Record:
    """A request whose beams were checked against a catalog (as the client fills it)."""
    kw.setdefault("sids_checked", True)
    return Record("c", rnd, phase, i, i, t0, t1, status=status, beams=kw.pop("beams", 4), **kw)


def test_round_metrics_counts_only_measured_requests():
    records = [
        rec(-1, "warmup", 0, 0.0, 5.0),  # a slow warm-up: ignored
        rec(0, "prime", 0, 5.0, 5.5),
        rec(0, "measure", 0, 10.0, 10.1, prompt_tokens=100, cached_tokens=50),
        rec(0, "measure", 1, 10.1, 10.3, invalid=1, duplicates=1),
        rec(0, "measure", 2, 10.3, 10.5, status="timeout", beams=0),
        rec(0, "measure", 3, 10.5, 20.0, excluded="trace_overlap"),
    ]
    m = round_metrics(records)
    assert m["qps"] == pytest.approx(2 / 0.5)
    assert m["latency_mean_ms"] == pytest.approx(150.0)
    assert m["error_rate"] == pytest.approx(1 / 3)
    assert m["invalid_rate"] == pytest.approx(1 / 8)
    assert m["duplicate_rate"] == pytest.approx(1 / 8)
    assert m["cached_frac"] == pytest.approx(0.5)


def test_cell_metrics_and_notes():
    records = []
    for rnd, dur in enumerate([0.10, 0.11, 0.30]):
        records += [
            rec(rnd, "measure", i, 10 * rnd + i * dur, 10 * rnd + (i + 1) * dur) for i in range(5)
        ]
    m = cell_metrics(records, StatsSpec(bootstrap=200))
    assert m["qps"]["n"] == 3
    assert m["qps"]["median"] == pytest.approx(1 / 0.11)
    text = " ".join(notes(m, StatsSpec(bootstrap=200)))
    assert "too noisy" in text
    few = cell_metrics(records[:5], StatsSpec(bootstrap=200))
    assert "only 1 measured round" in " ".join(notes(few, StatsSpec(bootstrap=200)))


def test_directions():
    assert direction("qps") == 1 and direction("latency_p99_ms") == -1
    assert direction("ndcg@10") == 1 and direction("cached_frac") == 0


def test_closed_loop_steady_rate_leaves_out_start_and_drain():
    """2 clients, 10 requests: the first two sent at 0.0 and 0.5 take 3 s (a start before any
    answer), the rest 1 s each, back to back. The round's QPS carries the start and the drain;
    the steady rate counts the 6 answers between the 2nd and the 8th, while both clients are
    busy: exactly 2 clients / 1 s."""
    from harness.metrics.rounds import closed_extra

    sends = [0.0, 0.5]
    ends = []
    records = []
    for i in range(10):
        t0 = sends[i] if i < 2 else ends[i - 2]
        t1 = t0 + (3.0 if i < 2 else 1.0)  # the first answers come after a 2 s start
        ends.append(t1)
        records.append(rec(0, "measure", i, t0, t1))
    m = round_metrics(records, closed_extra(2))
    assert m["qps"] == pytest.approx(10 / ends[-1])
    # answers at 3, 3.5, 4, ..., 7.5: the window runs from the 2nd (3.5) to the 8th (6.5)
    assert m["qps_steady"] == pytest.approx(2.0)
    assert m["qps_steady"] > m["qps"]
    assert "qps_steady" not in round_metrics(records[:5], closed_extra(2))  # < 3 x clients
    assert direction("qps_steady") == 0  # informational: the A/B gate does not judge it


def test_gpu_busy_implied_by_the_traced_work_at_each_rounds_qps():
    """The traced GPU work per request (the first trace file that has it) times a round's QPS:
    10 requests in 2 s with 150 ms of GPU work each keep the GPU busy 75%. No such figure (no
    trace, a CPU trace, a file without it): no metric at all, never a 0."""
    from harness.metrics.rounds import busy_extra

    records = [rec(0, "measure", i, i * 0.2, i * 0.2 + 0.2) for i in range(10)]
    trace = {"files": [{"device": "cpu"}, {"gpu_ms_per_request": 150.0}]}
    m = round_metrics(records, busy_extra(trace))
    assert m["qps"] == pytest.approx(5.0) and m["gpu_busy_implied"] == pytest.approx(0.75)
    assert direction("gpu_busy_implied") == 0  # informational
    for none in (None, {}, {"files": []}, {"files": [{"device": "cpu"}]}):
        assert busy_extra(none) is None


def test_a_cell_whose_rounds_are_mostly_start_and_drain_gets_a_note():
    from harness.metrics.rounds import closed_extra

    records = []
    for rnd in range(3):  # the round of the steady-rate test, three times
        ends: list[float] = []
        for i in range(10):
            t0 = (0.0 if i == 0 else 0.5) if i < 2 else ends[i - 2]
            t1 = t0 + (3.0 if i < 2 else 1.0)
            ends.append(t1)
            records.append(rec(rnd, "measure", i, 100 * rnd + t0, 100 * rnd + t1))
    m = cell_metrics(records, StatsSpec(bootstrap=200), closed_extra(2))
    lost = 1 - m["qps"]["median"] / m["qps_steady"]["median"]
    assert lost > 0.05
    assert any("below the rate while every client was busy" in n for n in notes(m, StatsSpec()))
    plain = cell_metrics(records, StatsSpec(bootstrap=200))  # no steady rate: no such note
    assert not any("every client was busy" in n for n in notes(plain, StatsSpec()))
