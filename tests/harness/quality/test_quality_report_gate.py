"""The Pareto front and charts, quality cell metrics, and the per-sample comparison."""

from __future__ import annotations

import pytest

from harness.judge.samples import compare_samples
from harness.quality.stage import cell_metrics, report_entry
from harness.report.render_quality import pareto, pareto_svg, quality_eval_table


def test_pareto_front():
    pts = [(0.5, 10.0), (0.4, 20.0), (0.3, 15.0), (0.5, 8.0), (0.2, 30.0)]
    assert pareto(pts, higher_y=True) == [0, 1, 4]  # (0.3, 15) and (0.5, 8) are beaten
    assert pareto(pts, higher_y=False) == [3]  # lower latency is better: (0.5, 8) beats all


def _quality(values: list[float]) -> dict:
    mean = sum(values) / len(values)
    m = {"value": mean, "ci_low": 0.0, "ci_high": 1.0, "ci": "bootstrap", "n": len(values)}
    rate = {"value": 0.0, "ci_low": 0.0, "ci_high": 0.1, "ci": "wilson", "count": 0, "n": 64}
    return {
        "status": "ok",
        "catalog_checked": True,
        "protocol": {"beam_width": 32},
        "overall": {
            "metrics": {"recall@32": m},
            "values": {"recall@32": values},
            "invalid_rate": rate,
            "duplicate_rate": rate,
        },
    }


def _cell(n: int, prec: str, values: list[float], qps: float) -> dict:
    q = _quality(values)
    metrics = {"qps": {"median": qps}, "latency_p99_ms": {"median": 1000 / qps}}
    metrics.update(cell_metrics(q))
    return {"id": f"n={n},{prec}", "status": "ok", "params": {"beam_width": n, "quantization": prec},
            "metrics": metrics, "quality": report_entry(q)}  # fmt: skip


def test_cell_metrics_table_and_chart():
    cells = [_cell(32, "bf16", [1, 0, 1, 0], 50.0), _cell(512, "fp8", [1, 1, 1, 0], 20.0)]
    m = cells[0]["metrics"]["recall@32"]
    assert m["median"] == 0.5 and m["unit"] == "samples" and m["values"] == [1, 0, 1, 0]
    assert cells[0]["metrics"]["quality_invalid_rate"]["median"] == 0.0
    assert "values" not in cells[0]["quality"]["overall"]
    report = {"cells": cells}
    head, rows = quality_eval_table(report)
    assert head[3] == "recall@32" and rows[1][1] == "fp8" and rows[1][3].startswith("0.7500")
    svg = pareto_svg(report)
    assert svg.count("r='8'") == 3  # both cells are on the front, plus the legend's ring
    assert "n=512" in svg and "fp8" in svg and "polyline" in svg
    assert pareto_svg({"cells": cells[:1]}) is None
    assert cell_metrics({"status": "error", "error": "x"}) == {}


def test_compare_samples_pairs_by_sample():
    base = {"median": 0.5, "values": [1.0, 0.0] * 20}
    worse = {"median": 0.25, "values": [1.0, 0.0, 0.0, 0.0] * 10}
    r = compare_samples("recall@32", base, worse, 0.05)
    assert r["verdict"] == "regressed" and r["delta_pct"] == pytest.approx(-50.0)
    assert r["test"] == "paired_t over samples"
    assert compare_samples("recall@32", worse, base, 0.05)["verdict"] == "improved"
    assert compare_samples("recall@32", base, base, 0.05)["verdict"] == "within_noise"
    r = compare_samples("recall@32", base, {"values": [0.0] * 10}, 0.05)
    assert r["test"] == "welch over samples"
    assert compare_samples("recall@32", {"values": [1.0]}, base, 0.05)["verdict"] == "n/a"
