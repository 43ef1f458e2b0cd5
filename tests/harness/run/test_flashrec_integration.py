"""The harness against the real FlashRec server: a smoke_cpu-like matrix, both protocols."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import REPO, processes_with, run_cli, write_matrix

pytestmark = pytest.mark.skipif(
    not (REPO / "flashrec" / "server" / "app.py").is_file()
    or not (REPO / "flashrec" / "__main__.py").is_file(),
    reason="the FlashRec server is not in this checkout",
)


def test_smoke_matrix_on_flashrec(tmp_path, tiny_model, marker):
    engine = {
        "kind": "flashrec",
        "device": "cpu",
        "startup_timeout_s": 180,
        "args": {"served_model_name": marker},
    }
    m = {
        "name": "flashrec-smoke",
        # the generate side runs its engine in a process of its own (the GPU default)
        "engines": [
            # 4 slots: n=4 x concurrency 2 = 8 beam rows, so the report notes the queueing
            {**engine, "name": "chat", "args": {**engine["args"], "batch_slots": 4}},
            {
                **engine,
                "name": "gen",
                "protocol": "generate",
                "args": {**engine["args"], "engine_process": "on"},
            },
        ],
        "model": {"path": str(tiny_model)},
        "catalog": {"path": str(Path(tiny_model) / "catalog.json")},
        "workload": {
            "kind": "synthetic",
            "requests": 8,
            "warmup_requests": 2,
            "median_tokens": 48,
            "system_prompt_tokens": 16,
        },
        "axes": {"beam_width": [4], "concurrency": [1, 2]},
        "load": {"rounds": 3, "radix": "warm", "max_tokens": 4, "request_timeout_s": 60},
        "trace": {
            "cells": ["chat,beam_width=4,concurrency=1", "gen,beam_width=4,concurrency=1"],
            "num_steps": 5,
            "settle_s": 1,
            "timeout_s": 120,
        },
        "gates": [
            {"metric": "invalid_rate", "op": "==", "value": 0},
            {"metric": "error_rate", "op": "==", "value": 0},
        ],
    }
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0
    rep = json.loads((out / "report.json").read_text())
    cells = {c["id"]: c for c in rep["cells"]}
    assert sorted(cells) == [
        "chat,beam_width=4,concurrency=1",
        "chat,beam_width=4,concurrency=2",
        "gen,beam_width=4,concurrency=1",
        "gen,beam_width=4,concurrency=2",
    ]
    for c in cells.values():
        assert c["status"] == "ok", c["error"]
        assert c["metrics"]["beams_mean"]["median"] == 4
        assert c["metrics"]["invalid_rate"]["median"] == 0
        assert c["metrics"]["qps"]["n"] == 3
        assert c["server"]["info"], "get_server_info answered"
        # every measured round carries the server's GC deltas (scraped around it) and the
        # Server-Timing respond phase
        for r in c["round_metrics"]:
            assert r["server_gc_pause_ms"] >= 0 and r["server_gc_slow_pauses"] >= 0, r
            assert r["server_respond_ms_mean"] >= 0, r
            # the pipe's own phase only where the engine runs in a process of its own
            assert ("server_ipc_ms_mean" in r) == c["id"].startswith("gen"), r
        # the server's CPU per request: its process's share of its group's; the engine's
        # forward runs in that process for chat, in a process of its own for gen
        rounds = c["round_metrics"]
        total = sum(r["server_cpu_ms_per_request"] for r in rounds)
        main = sum(r["server_main_cpu_ms_per_request"] for r in rounds)
        assert total > 0 and all(r["server_main_cpu_cores"] >= 0 for r in rounds)
        if c["id"].startswith("chat"):
            assert main >= 0.9 * total, (main, total)
        else:
            assert main < 0.9 * total, (main, total)
    assert cells["chat,beam_width=4,concurrency=1"]["metrics"]["cached_frac"]["median"] > 0
    # the server's slot budget (from its /metrics) below the load's beam rows: noted, once
    starved = [n for n in cells["chat,beam_width=4,concurrency=2"]["notes"] if "beam rows" in n]
    assert len(starved) == 1 and "= 8 > the server's 4 slots" in starved[0], starved
    for cell in ("chat,beam_width=4,concurrency=1", "gen,beam_width=4,concurrency=2"):
        assert not [n for n in cells[cell]["notes"] if "beam rows" in n]
    for cell in ("chat,beam_width=4,concurrency=1", "gen,beam_width=4,concurrency=1"):
        trace = cells[cell]["trace"]  # the engine process's profile, too
        assert trace["status"] == "complete", trace
        assert trace["files"] and trace["files"][0]["size_bytes"] > 0
        assert trace["files"][0]["steps"] >= 1 and trace["files"][0]["device"] == "cpu"
    assert rep["gates"]["status"] == "pass"
    assert processes_with(marker) == []
    # the engine process went with its server
    pid = cells["gen,beam_width=4,concurrency=1"]["server"]["info"]["engine"]["engine_process_pid"]
    assert isinstance(pid, int) and not Path(f"/proc/{pid}").exists()
    # REPORT.md says what each server ran with (its resolved knobs, one row per cell)
    report_md = (out / "REPORT.md").read_text()
    assert "## Engine settings (from /get_server_info)" in report_md
    settings = report_md.split("## Engine settings")[1].split("\n## ")[0]
    assert "| gen,beam_width=4,concurrency=1 | cpu, float32 |" in settings
    assert settings.count("| eager | off |") == 4  # no CUDA graphs, step graph off on CPU
