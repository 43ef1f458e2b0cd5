"""report.html's layout: the verdict (gates, targets) first, every table in a horizontally
scrolling container, long notes as paragraphs, plot legends outside the plotted points.
``scripts/screenshot_report.sh`` renders such a page to PNG with headless Chromium to look at."""

from __future__ import annotations

import html
import re

import pytest

from harness.load.client import Record
from harness.report.render_html import paragraphs, write_html


def _metric(median: float) -> dict:
    return {"median": median, "ci95_low": median * 0.9, "ci95_high": median * 1.1, "cv": 0.02}


def _cell(conc: int, notes: list[str]) -> dict:
    metrics = {
        "qps": _metric(10.0 * conc), "latency_p50_ms": _metric(20.0),
        "latency_mean_ms": _metric(21.0), "server_engine_ms_mean": _metric(15.0),
        "server_tokenize_ms_mean": _metric(1.0), "server_queue_ms_mean": _metric(2.0),
        "outside_server_ms_mean": _metric(3.0),
    }  # fmt: skip
    for m in ("recall", "pass", "position1_pass"):  # a wide quality table
        metrics.update({f"{m}@{k}": _metric(0.5) for k in (1, 5, 10, 32, 64, 128)})
    return {
        "id": f"flashrec,beam_width=32,concurrency={conc},quantization=fp8", "status": "ok",
        "params": {"engine": "flashrec", "concurrency": conc, "beam_width": 32}, "rounds": 3,
        "metrics": metrics, "notes": notes, "error": "", "log_tail": "", "baseline": {},
        "excluded_requests": {"count": 0, "reasons": {}}, "trace": None, "server": {},
    }  # fmt: skip


LONG_NOTE = (
    "round QPS 12.0% below the rate while every client was busy (40.00): the rounds are short "
    "for this concurrency, so start and drain weigh on the round QPS; more requests per round "
    "measure the rate"
)


def _report() -> dict:
    return {
        "matrix": {"name": "layout"}, "run_id": "r1", "created": "2026-01-01T00:00:00+00:00",
        "environment": {},
        "measurement": {"rules": ["every server was started fresh by this run"]},
        "cells": [_cell(1, ["qps CV 14.0% > 10%: too noisy to support a conclusion", LONG_NOTE]),
                  _cell(8, [])],
        "parity": {"status": "not_configured"}, "determinism": {"status": "not_configured"},
        "gates": {"status": "fail", "results": [
            {"name": "no-errors", "status": "pass", "checks": []},
            {"name": "qps-floor", "status": "fail",
             "checks": [{"target": "flashrec,concurrency=1", "value": 10.0, "ok": False}]}]},
        "targets": {"status": "missed", "results": [
            {"name": "qps >= 100", "missing": [],
             "checks": [{"cell": "flashrec,concurrency=8", "met": False, "text": "80 < 100"}]}]},
        "summary": {"cells": 2, "ok": 2, "failed": 0},
    }  # fmt: skip


def test_verdict_first_tables_scroll_notes_are_paragraphs(tmp_path):
    write_html(_report(), [], tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    body = page.split("<body>", 1)[1]
    # the verdict is the first section, gates and targets in it, shown nowhere else
    verdict = body.index("<section id='verdict'>")
    assert verdict < body.index("<h2>") + 1 and verdict < body.index("<h2>How it was measured")
    first = body[verdict : body.index("</section>")]
    assert "gates: <b>fail</b>" in first and "targets: <b>missed</b>" in first
    assert "<td>qps-floor</td><td>fail</td>" in first and "<td>80 &lt; 100</td>" in first
    rest = body[body.index("</section>") :]
    assert "<h2>Gates" not in rest and "Targets" not in rest and "qps-floor" not in rest
    # every table scrolls in a container of the page's width: no column is cut
    assert page.count("<table>") == page.count("<div class='wide'><table>") >= 4
    assert re.search(r"\.wide\{[^}]*overflow-x:auto", page)
    quality = body[body.index("<h2>Quality</h2>") :]
    assert quality.startswith("<h2>Quality</h2>\n<div class='wide'><table><tr><th>cell</th>")
    assert "<th>position1_pass@128</th>" in quality
    # a cell id may wrap between its parameters (else one word as wide as all of them)
    assert (
        "<td>flashrec,<wbr>beam_width=32,<wbr>concurrency=1,<wbr>quantization=fp8</td>" in quality
    )
    # a cell's notes: a paragraph each
    noisy = "qps CV 14.0% &gt; 10%: too noisy to support a conclusion"
    assert f"<td><p>{noisy}</p><p>{LONG_NOTE}</p></td>" in page
    # the long Server-Timing note: several paragraphs, none a wall of text
    start = body.index("<h2>Where the latency goes")
    timing = body[start : body.index("<div class='wide'>", start)]
    ps = [html.unescape(p) for p in re.findall(r"<p>(.*?)</p>", timing)]
    assert len(ps) >= 3 and max(map(len, ps)) <= 500, [len(p) for p in ps]


def test_paragraphs_split_between_sentences():
    text = "First one. " * 30 + "\n\nSecond block, e.g. short."
    parts = paragraphs(text, limit=100)
    assert parts[-1] == "Second block, e.g. short." and len(parts) > 3
    assert all(p.endswith(".") and len(p) <= 100 for p in parts)
    assert " ".join(parts[:-1]) == " ".join(("First one. " * 30).split())


def _outside(fig) -> bool:
    """Whether the figure's legend lies wholly right of its axes (nothing plotted under it)."""
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    return legend.x0 >= ax.get_window_extent().x1


def test_plot_legends_sit_outside_the_axes():
    pytest.importorskip("matplotlib")
    from harness.report.plots import latency_figure, qps_figure

    report = _report()
    report["cells"] += [
        {**_cell(c, []), "params": {"engine": "flashrec", "concurrency": c, "beam_width": 64}}
        for c in (1, 8)
    ]
    assert _outside(qps_figure(report))
    records = [
        Record(cell=c["id"], round=0, phase="measure", index=i, prompt=i, t_send=0.0,
               t_end=0.01 * (i + 1))
        for c in report["cells"] for i in range(20)
    ]  # fmt: skip
    assert _outside(latency_figure(report, records))
