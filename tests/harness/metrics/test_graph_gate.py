"""Graph health from the server's /metrics (harness.metrics.server.graph_delta) and a matrix
gate on it: "no eager decode forward, no capture after warm-up" without a trace."""

from __future__ import annotations

import json
from pathlib import Path

from bench_helpers import fake_engine, processes_with, run_cli, write_matrix

from harness.metrics.server import GRAPH_METRICS, gc_delta, graph_delta, parse_prometheus

EAGER = "flashrec_graph_eager_forwards_total"
REPLAYS = "flashrec_graph_replays_total"
LATE = "flashrec_graph_captures_after_warmup_total"


def _scrape(eager_decode: int, eager_prefill: int, replays: int, late: int) -> dict[str, float]:
    text = "\n".join(
        [
            "# TYPE flashrec_graph_eager_forwards_total counter",
            f'{EAGER}{{phase="decode",reason="device_cpu"}} {eager_decode}',
            f'{EAGER}{{phase="decode",reason="over_max_batch"}} 1',
            f'{EAGER}{{phase="prefill",reason="device_cpu"}} {eager_prefill}',
            f'{REPLAYS}{{phase="decode",kind="decode"}} {replays}',
            f'{REPLAYS}{{phase="decode",kind="step"}} {replays}',
            f'{REPLAYS}{{phase="prefill",kind="piecewise"}} 0',
            f'{LATE}{{kind="decode"}} {late}',
            f'{LATE}{{kind="piecewise"}} 0',
        ]
    )
    return parse_prometheus(text)


def test_graph_delta_per_round_and_captures_after_warm_up_as_a_total():
    before, after = _scrape(10, 3, 5, 1), _scrape(16, 5, 9, 2)
    d = graph_delta(before, after)
    assert d == {
        "server_graph_eager_decode_forwards": 6,
        "server_graph_eager_prefill_forwards": 2,
        "server_graph_replay_decode_forwards": 8,  # decode and step graphs
        "server_graph_replay_prefill_forwards": 0,
        "server_graph_captures_after_warmup": 2,  # since warm-up: not a delta
    }
    assert set(d) == set(GRAPH_METRICS)
    assert gc_delta(before, after) == d  # what the cell records around each round
    # another engine (no families), or a scrape that failed: nothing, never a zero
    assert graph_delta({"other_total": 1.0}, {"other_total": 2.0}) == {}
    assert graph_delta(before, None) == {} and graph_delta(None, after) == {}


def _matrix(engine: dict, gates: list[dict], **extra) -> dict:
    return {
        "name": "graph-gate",
        "engine": engine,
        "workload": {
            "kind": "lorem" if engine.get("kind") == "command" else "synthetic",
            "requests": 4,
            "warmup_requests": 1,
            "median_tokens": 32,
            "system_prompt_tokens": 8,
        },
        "load": {"rounds": 2, "beam_width": 4, "max_tokens": 4, "request_timeout_s": 60},
        "trace": {"cells": "none", "settle_s": 0.3, "timeout_s": 20},
        "gates": gates,
        **extra,
    }


NO_EAGER = {"metric": "server_graph_eager_decode_forwards", "op": "==", "value": 0}
NO_LATE = {"metric": "server_graph_captures_after_warmup", "op": "==", "value": 0}


def test_gate_fails_eager_decode_on_cpu_and_passes_no_capture_after_warm_up(
    tmp_path, tiny_model, marker
):
    """On CPU every decode forward is eager (no CUDA graphs): the gate on eager decode
    forwards fails naming its metric; the one on captures after warm-up passes at 0."""
    engine = {
        "kind": "flashrec",
        "device": "cpu",
        "startup_timeout_s": 180,
        "args": {"served_model_name": marker},
    }
    m = _matrix(engine, [NO_EAGER, NO_LATE], model={"path": str(tiny_model)})
    m["catalog"] = {"path": str(Path(tiny_model) / "catalog.json")}
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 1  # a gate failed
    rep = json.loads((out / "report.json").read_text())
    (cell,) = rep["cells"]
    assert cell["status"] == "ok", cell["error"]
    for r in cell["round_metrics"]:  # every measured round: 4 requests of >= 2 decode forwards
        assert r["server_graph_eager_decode_forwards"] >= 8, r
        assert r["server_graph_eager_prefill_forwards"] >= 1, r
        assert r["server_graph_replay_decode_forwards"] == 0, r
        assert r["server_graph_captures_after_warmup"] == 0, r
    eager, late = rep["gates"]["results"]
    assert rep["gates"]["status"] == "fail"
    assert eager["status"] == "fail" and late["status"] == "pass"
    assert eager["name"] == "server_graph_eager_decode_forwards == 0"
    assert eager["checks"][0]["value"] >= 8
    assert "server_graph_eager_decode_forwards == 0" in (out / "REPORT.md").read_text()
    assert processes_with(marker) == []


def test_gate_on_a_server_without_graph_counters_is_no_data(tmp_path, marker):
    """A server whose /metrics has no flashrec_graph_* families (another engine): the gate
    has nothing to check, so it is no_data with the reason, never a pass."""
    m = _matrix(fake_engine("--marker", marker), [NO_EAGER, NO_LATE])
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0
    rep = json.loads((out / "report.json").read_text())
    (cell,) = rep["cells"]
    assert cell["status"] == "ok" and "server_graph_eager_decode_forwards" not in cell["metrics"]
    assert "no graph counters" in cell["unchecked"]["server_graph_eager_decode_forwards"]
    statuses = [g["status"] for g in rep["gates"]["results"]]
    assert statuses == ["no_data", "no_data"] and rep["gates"]["status"] == "no_data"
    assert "no graph counters" in rep["gates"]["results"][0]["reason"]
    assert processes_with(marker) == []
