"""Report plots as PNG bytes (matplotlib, Agg): QPS vs concurrency, latency CDFs, engines.

Every function returns None when matplotlib is missing or the data has nothing to show. Legends
sit outside the axes, beside the points rather than over them.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict

import numpy as np

from harness.load.client import Record
from harness.report.model import Report, as_report

MAX_CDF_LINES = 16


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def legend_outside(ax, fontsize: float = 7) -> None:
    """The legend to the right of the axes, never over the plotted points (the PNG's tight
    bounding box takes it in)."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def _label(params: dict, skip: tuple[str, ...]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items() if k not in skip) or "all"


def _order(params: dict) -> tuple:
    """Sort key: numbers numerically, text alphabetically."""
    return tuple(
        (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in params.values()
    )


def qps_vs_concurrency(report: Report) -> bytes | None:
    """QPS median (95% CI bars) against concurrency; one line per other-parameter combination
    (engine, beam width, quantization, ...)."""
    fig = qps_figure(report)
    return None if fig is None else _png(fig)


def qps_figure(report: Report | dict):
    """The figure of :func:`qps_vs_concurrency` (None: nothing to plot)."""
    report = as_report(report)
    plt = _plt()
    cells = [c for c in report.cells if c.status == "ok" and "qps" in c.metrics]
    if plt is None or not any("concurrency" in c.params for c in cells):
        return None
    series: dict[str, list] = defaultdict(list)
    for c in cells:
        if "concurrency" in c.params:
            series[_label(c.params, ("concurrency",))].append(c)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs: set = set()
    for label, group in sorted(series.items(), key=lambda kv: _order(kv[1][0].params)):
        group.sort(key=lambda c: c.params["concurrency"])
        xs.update(c.params["concurrency"] for c in group)
        x = [c.params["concurrency"] for c in group]
        m = [c.metrics["qps"] for c in group]
        y = np.array([s.median for s in m], dtype=float)
        lo = np.array([s.ci95_low if s.ci95_low is not None else np.nan for s in m], float)
        hi = np.array([s.ci95_high if s.ci95_high is not None else np.nan for s in m], float)
        err = np.nan_to_num(np.vstack([y - lo, hi - y]).clip(min=0))
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("QPS (median over rounds, 95% CI)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(xs), [str(x) for x in sorted(xs)])
    ax.grid(alpha=0.3)
    legend_outside(ax, 7)
    ax.set_title("QPS vs concurrency")
    return fig


def latency_cdf(report: Report, records: list[Record]) -> bytes | None:
    """Empirical CDF of measured request latency per cell (first 16 cells)."""
    fig = latency_figure(report, records)
    return None if fig is None else _png(fig)


def latency_figure(report: Report | dict, records: list[Record]):
    """The figure of :func:`latency_cdf` (None: nothing to plot)."""
    report = as_report(report)
    plt = _plt()
    lat: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.phase == "measure" and r.ok and not r.excluded:
            lat[r.cell].append(r.latency * 1000.0)
    ids = [c.id for c in report.cells if c.id in lat][:MAX_CDF_LINES]
    if plt is None or not ids:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for cid in ids:
        v = np.sort(np.array(lat[cid]))
        ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=cid)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    legend_outside(ax, 6)
    ax.set_title("Latency CDF (measured rounds)")
    return fig


def engines_side_by_side(report: Report) -> bytes | None:
    """QPS of each engine for every shared parameter combination (only with > 1 engine)."""
    plt = _plt()
    cells = [c for c in report.cells if c.status == "ok" and "qps" in c.metrics]
    engines = sorted({c.params.get("engine") for c in cells})
    if plt is None or len(engines) < 2:
        return None
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for c in cells:
        key = json.dumps({k: v for k, v in c.params.items() if k != "engine"})
        table[key][c.params["engine"]] = c.metrics["qps"].median
    keys = sorted(table)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(keys) * len(engines)), 4.5))
    width = 0.8 / len(engines)
    for i, eng in enumerate(engines):
        ax.bar(
            np.arange(len(keys)) + i * width,
            [table[k].get(eng, 0.0) for k in keys],
            width,
            label=eng,
        )
    ax.set_xticks(np.arange(len(keys)) + width * (len(engines) - 1) / 2)
    ax.set_xticklabels(
        [_label(json.loads(k), ()) for k in keys], rotation=30, ha="right", fontsize=7
    )
    ax.set_ylabel("QPS (median)")
    legend_outside(ax, 8)
    ax.set_title("Engines side by side")
    return _png(fig)


def all_plots(report: Report | dict, records: list[Record]) -> list[tuple[str, bytes]]:
    """(title, PNG) for every plot that has data."""
    report = as_report(report)
    plots = [
        ("QPS vs concurrency", qps_vs_concurrency(report)),
        ("Latency CDF", latency_cdf(report, records)),
        ("Engines side by side", engines_side_by_side(report)),
    ]
    return [(t, p) for t, p in plots if p]
