"""REPORT.md's "How it was measured" section says only what the run did: servers started or
found running, warm-up sent or not, the radix state each round had, traced rounds or none, and
the rounds the noise band rests on (runs of ``flashrec-bench`` on the fake server)."""

from __future__ import annotations

import json
from pathlib import Path

from bench_helpers import base_matrix, fake_engine, processes_with, run_cli, write_matrix


def _method(out: Path) -> str:
    """The method section of the run's REPORT.md."""
    md = (out / "REPORT.md").read_text()
    return md.split("## How it was measured", 1)[1].split("\n## ", 1)[0]


def test_external_untraced_warm_radix_without_primes(tmp_path, fake_url):
    """``quick --url``: no server started, nothing traced, a warm radix with no warm-up
    prompts to prime with (so it ran cold), two rounds (no noise band)."""
    out = tmp_path / "q"
    argv = ["--url", fake_url, "--beam-width", "4", "--concurrency", "1", "--requests", "6",
            "--warmup", "0", "--rounds", "2", "--radix", "warm", "--prompt-tokens", "40",
            "--timeout-s", "10", "--out", str(out)]  # fmt: skip
    run_cli("quick", *argv)  # its exit code is the gates' (no catalog: invalid SIDs unchecked)
    rep = json.loads((out / "report.json").read_text())
    assert [c["status"] for c in rep["cells"]] == ["ok"]
    text = _method(out)
    for false in ("started fresh", "current checkout", "traced rounds are extra",
                  "trace files", "warm-up requests never counted", "noise band per cell =",
                  "primed with"):  # fmt: skip
        assert false not in text, (false, text)
    external = f"every cell ran on the external server at {fake_url}"
    assert f"no server was started by this run: {external}" in text
    assert "not necessarily the server's" in text
    assert "no warm-up requests were sent before the measured rounds" in text
    assert (
        "before every round of every cell the prefix cache was only flushed (radix: warm, but "
        "with no warm-up prompts to prime it with: it ran cold)"
    ) in text
    assert "no round was traced: this run started no profiler" in text
    assert "only 2 measured round(s) per cell (< 3): no noise band" in text
    rules = rep["measurement"]["rules"]
    assert "\n".join(f"- {r}" for r in rules) in text  # report.json holds the same lines


def test_started_traced_run_cold_and_warm_cells(tmp_path, marker):
    """A run that launched its server, traced the first cell, flushed the cache before every
    round of one cell and flushed and primed it in the other: each of those is said, and
    nothing of an external or untraced run."""
    engine = fake_engine("--marker", marker)
    m = base_matrix(
        engine,
        axes={"radix": ["cold", "warm"]},
        load={"rounds": 3, "beam_width": 4, "request_timeout_s": 10},
        trace={"cells": "first", "num_steps": 3, "settle_s": 0.3, "timeout_s": 20},
    )
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0
    text = _method(out)
    assert "every server was started fresh by this run with its engine's own command" in text
    assert "(1 server launch(es) for 2 cells)" in text  # radix is a client setting
    assert "3 warm-up requests per cell before its measured rounds, never counted" in text
    assert (
        "before every round the prefix cache was flushed (radix: cold) in 1 cell; flushed, "
        "then primed with the cell's warm-up prompts (radix: warm) in 1 cell"
    ) in text
    assert "1 of 2 cells got an extra traced round after their measured rounds" in text
    assert "the run went on only after the trace files of 1 cell were complete and stable" in text
    assert "noise band per cell = 2 x CV over its own 3 measured rounds" in text
    for false in ("external", "no round was traced", "no warm-up", "ran cold", "no noise band"):
        assert false not in text, (false, text)
    assert processes_with(marker) == []


def test_routed_cells_count_every_replica_and_router_launch():
    """A matrix of replicas behind a router: each replica's and each router's launch counts
    (reports/cpu/router: direct, 1 replica + router, 2 x (2 replicas + router))."""
    from harness.report.method import servers_line
    from harness.report.model import Report
    from harness.spec.matrix import load_spec

    root = Path(__file__).resolve().parents[3]
    rep = Report.from_json(json.loads((root / "reports/cpu/router/report.json").read_text()))
    spec, _ = load_spec(root / "matrices/router_cpu.yaml")
    line = servers_line(spec, rep.cells)
    assert line.endswith("(9 launch(es) of servers, replicas and routers for 4 cells)"), line
    assert rep.measurement.rules[0] == line  # the stored report says the same
