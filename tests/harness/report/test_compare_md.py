"""compare.md: the change it shows has the sign of the medians it shows; a paired comparison's
own estimate (what its verdict and gates judge) is a column of its own, named for what it is."""

from __future__ import annotations

import numpy as np

from harness.judge.gates import evaluate_gates
from harness.judge.paired import compare_paired
from harness.judge.runs import compare_reports
from harness.report.render_compare import print_regressions, write_compare_markdown
from harness.spec.checks import GateSpec


def _report(values: list[float], metric: str = "latency_p50_ms") -> dict:
    """A one-cell report whose rounds have ``values`` of ``metric``."""
    return {
        "matrix": {"stats": {"alpha": 0.05, "test": "welch", "band_k": 2.0}},
        "cells": [
            {
                "id": "e,concurrency=1",
                "params": {"engine": "e", "concurrency": 1},
                "status": "ok",
                "round_metrics": [{"round": i, metric: v} for i, v in enumerate(values)],
                "metrics": {
                    metric: {
                        "median": float(np.median(values)),
                        "values": list(values),
                        "noise_band": 0.01,
                    }
                },
            }
        ],
    }


def _rows(text: str) -> list[list[str]]:
    """The cells of the table rows of cell ``e,...``."""
    lines = [ln for ln in text.splitlines() if ln.startswith("| e,")]
    return [[x.strip() for x in ln.strip("|").split("|")] for ln in lines]


def test_medians_down_paired_ratio_up(tmp_path, capsys):
    """21 pairs: the pairs far from the median 10% slower, the five around it 3% faster. The
    median latency goes down 3.0% while the pairs' geometric-mean ratio is +6.8%, a supported
    regression: the delta shown with the medians is negative, the paired change is its own
    column, and the gate judges the paired change."""
    a = [10.0 + i for i in range(21)]
    b = [x * (0.97 if 8 <= i <= 12 else 1.10) for i, x in enumerate(a)]
    assert np.median(b) < np.median(a)
    comparison = compare_paired(_report(a), _report(b))
    r = comparison["cells"][0]["metrics"]["latency_p50_ms"]
    assert r["verdict"] == "regressed" and r["delta_pct"] > 6 and r["estimate"] == "ratio"
    assert round(r["median_delta_pct"], 1) == -3.0
    gate = GateSpec(metric="latency_p50_ms", max_regression_pct=2)
    assert evaluate_gates([gate], _report(b), comparison).to_json()["status"] == "fail"
    write_compare_markdown(comparison, tmp_path / "compare.md")
    text = (tmp_path / "compare.md").read_text()
    head = "| cell | metric | base | new | change of medians | paired change | "
    assert head + "band (of the paired change) | p | p (Holm) | verdict |" in text
    ((_, metric, base, new, medians, paired, _, _, _, verdict),) = _rows(text)
    assert (metric, base, new, verdict) == ("latency_p50_ms", "20", "19.4", "regressed")
    assert medians == "-3.0%" and paired == f"{r['delta_pct']:+.1f}%" and paired.startswith("+6.")
    assert "geometric mean of the pairs' new / base ratios" in text
    print_regressions(comparison)
    err = capsys.readouterr().err
    assert "20 -> 19.4 (-3.0% medians, paired change +6." in err


def test_two_run_compare_shows_the_change_of_medians(tmp_path):
    """Two separate runs: the delta is the change of the medians; no paired column."""
    base, new = _report([10.0, 10.1, 9.9]), _report([11.0, 11.1, 10.9])
    comparison = compare_reports(base, new)
    write_compare_markdown(comparison, tmp_path / "compare.md")
    text = (tmp_path / "compare.md").read_text()
    assert "| change of medians | band | p | p (Holm) | verdict |" in text
    assert "paired change" not in text
    ((_, _, base_v, new_v, medians, *_),) = _rows(text)
    assert (base_v, new_v, medians) == ("10", "11", "+10.0%")
