"""Paired comparison of an interleaved A/B run: baseline and candidate rounds matched by pair.

Round ``i`` of the baseline and round ``i`` of the candidate ran back to back on the same
machine, so machine drift and load from other processes hit both alike; the pair's ratio
``b_i / a_i`` cancels them. Per cell and metric::

    d_i    = ln(b_i / a_i)                (b - a over |mean a| when a value is <= 0)
    units  = the d_i, or with sessions the mean d of each session (>= 3 sessions)
    delta  = exp(mean units) - 1          (``wilcoxon``: exp(median units) - 1), the
             "paired change" judged by the verdict and the gates (``delta_pct``); the change of
             the medians (``median_delta_pct``) is shown beside it and may differ in sign
    p      = t-test of mean units == 0    (``wilcoxon``: Wilcoxon signed-rank, exact when small)
    band   = exp(band_k * sd(units) / sqrt(#units)) - 1   the noise band of delta itself

Sessions: the A/B run restarts both servers between sessions. Two processes of the same code
can differ by a few percent for their whole life (memory layout, hash seeds); pairs inside one
session share that offset, so only sessions are independent units.

A metric *regressed* (or *improved*) when ``p < alpha`` and ``|delta| > band``, in the metric's
bad (good) direction, ``p`` Holm-adjusted over the comparison's tests unless
``stats.correction: none`` (:func:`harness.judge.runs.correct_verdicts`). The result has
:func:`harness.judge.runs.compare_reports`' shape, so
:func:`harness.judge.gates.evaluate_gates` and ``compare.md`` work on it unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np

from harness.judge.runs import compare_cell_metrics, correct_verdicts, report_side
from harness.judge.samples import compare_samples, is_sample_metric
from harness.metrics.stats import finite, t_two_sided_p
from harness.names import direction, named_direction
from harness.report.model import Cell, Report, as_report
from harness.report.render_compare import change_pct

NAN = float("nan")
# ``stats.test`` of the matrix -> its paired counterpart
PAIRED_TESTS = {"welch": "paired_t", "mannwhitney": "wilcoxon"}


def paired_t(d: np.ndarray) -> float:
    """Two-sided p-value of the one-sample t-test of mean(d) == 0."""
    if d.size < 2:
        return NAN
    sd = d.std(ddof=1)
    if sd == 0:
        return 1.0 if d.mean() == 0 else 0.0
    return t_two_sided_p(float(d.mean() / (sd / math.sqrt(d.size))), d.size - 1.0)


@cache
def _w_counts(n: int) -> tuple[int, ...]:
    """Number of sign assignments giving each W+ = 0..n(n+1)/2 for ranks 1..n (no ties)."""
    counts = [1]
    for r in range(1, n + 1):
        nxt = counts + [0] * r
        for w, c in enumerate(counts):
            nxt[w + r] += c
        counts = nxt
    return tuple(counts)


def wilcoxon(d: np.ndarray) -> float:
    """Two-sided p-value of the Wilcoxon signed-rank test (zeros dropped; exact for n <= 30
    without ties, else normal with tie and continuity corrections)."""
    d = d[d != 0]
    n = d.size
    if n == 0:
        return 1.0
    a = np.abs(d)
    order = a.argsort(kind="mergesort")
    ranks, ties, i = np.empty(n), 0.0, 0
    while i < n:
        j = i
        while j + 1 < n and a[order[j + 1]] == a[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        ties += (j - i + 1) ** 3 - (j - i + 1)
        i = j + 1
    w = float(ranks[d > 0].sum())
    if ties == 0 and n <= 30:
        counts = _w_counts(n)
        k, total = int(round(w)), float(2**n)
        low, high = sum(counts[: k + 1]) / total, sum(counts[k:]) / total
        return min(1.0, 2.0 * min(low, high))
    mu = n * (n + 1) / 4.0
    var = n * (n + 1) * (2 * n + 1) / 24.0 - ties / 48.0
    z = (abs(w - mu) - 0.5) / math.sqrt(var) if var > 0 else 0.0
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0)))


def _aligned(
    base_cell: Cell, new_cell: Cell, name: str
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The rounds both runs have (in order) and the metric's values there (a round's
    ``round_metrics`` entry: ``{round, requests, METRIC: value}``)."""
    b = {r["round"]: r.get(name) for r in base_cell.round_metrics or []}
    n = {r["round"]: r.get(name) for r in new_cell.round_metrics or []}
    keys = sorted(k for k in b.keys() & n.keys() if finite(b[k]) and finite(n[k]))
    return keys, np.array([b[k] for k in keys], float), np.array([n[k] for k in keys], float)


def _units(d: np.ndarray, groups: np.ndarray | None) -> np.ndarray:
    """The independent units: the pairs, or the mean of each group (session) of pairs."""
    if groups is None or len(set(groups.tolist())) < 3:
        return d
    return np.array([d[groups == g].mean() for g in sorted(set(groups.tolist()))])


def paired_metric(
    name: str,
    a: np.ndarray,
    b: np.ndarray,
    alpha: float,
    test: str,
    band_k: float,
    groups: np.ndarray | None = None,
    sign: int | None = None,
) -> dict:
    """Verdict for one metric from its paired rounds (baseline ``a``, candidate ``b``);
    ``groups[i]`` is pair i's session (None: every pair is independent); ``sign``: the
    metric's good direction where not its :func:`direction` (+1 higher, -1 lower, 0 none)."""
    out: dict[str, Any] = {
        "base": float(np.median(a)) if a.size else None,
        "new": float(np.median(b)) if b.size else None,
        "pairs": int(a.size),
    }
    if a.size < 3:
        return {**out, "verdict": "n/a", "reason": f"{a.size} pair(s); need >= 3"}
    center = np.median if test == "wilcoxon" else np.mean
    if (a > 0).all() and (b > 0).all():
        d = _units(np.log(b / a), groups)
        delta = math.expm1(float(center(d)))
        band = math.expm1(band_k * float(d.std(ddof=1)) / math.sqrt(d.size))
    else:  # zeros (error / invalid rates): differences relative to the baseline's mean
        d = _units(b - a, groups)
        scale, spread = abs(float(a.mean())), band_k * float(d.std(ddof=1)) / math.sqrt(d.size)
        if scale > 0:
            delta, band = float(center(d)) / scale, spread / scale
        else:  # a baseline of zeros: any change is infinitely large, relative to it
            delta = math.copysign(math.inf, float(center(d))) if center(d) != 0 else 0.0
            band = 0.0 if spread == 0 else math.inf
    p = wilcoxon(d) if test == "wilcoxon" else paired_t(d)
    out.update(delta_pct=100 * delta, band_pct=100 * band, p_value=p, units=int(d.size))
    # what delta_pct is (the gates judge it), and the change of the medians shown beside it:
    # the two can differ in sign (a mean of ratios is not a ratio of medians)
    out["estimate"] = "ratio" if (a > 0).all() and (b > 0).all() else "difference"
    out["median_delta_pct"] = change_pct(out["base"], out["new"])
    significant = finite(p) and p < alpha
    if not (significant and abs(delta) > band):
        reason = "not significant" if not significant else "inside the noise band"
        return {**out, "verdict": "within_noise", "reason": reason}
    d_sign = direction(name) if sign is None else sign
    if d_sign == 0:
        return {**out, "verdict": "changed"}
    return {**out, "verdict": "improved" if delta * d_sign > 0 else "regressed"}


def compare_paired(
    base: Report | dict,
    new: Report | dict,
    metrics: list[str] | None = None,
    alpha: float | None = None,
    test: str | None = None,
    sessions: dict[int, int] | None = None,
    correction: str | None = None,
    also: Sequence[str] = (),
) -> dict:
    """Cell-by-cell paired comparison of two reports of one interleaved A/B run;
    ``sessions`` maps a round (pair) number to its session; ``correction`` (default: the
    matrix's ``stats.correction``): see :func:`harness.judge.runs.correct_verdicts`.
    ``also``: metrics judged besides the directional ones, informational ones in their
    :data:`harness.metrics.rounds.NAMED_DIRECTIONS` direction."""
    base, new = as_report(base), as_report(new)
    stats = new.matrix.get("stats", {})
    alpha = alpha if alpha is not None else stats.get("alpha", 0.05)
    test = test or PAIRED_TESTS.get(stats.get("test", "welch"), "paired_t")
    band_k = stats.get("band_k", 2.0)
    by_id = {c.id: c for c in base.cells}
    cells_out = []
    for n in new.cells:
        b = by_id.get(n.id)
        if b is None or not b.ok or not n.ok:
            status = "missing_in_base" if b is None else "failed"
            cells_out.append({"id": n.id, "status": status})
            continue

        def one(m: str, b=b, n=n) -> dict:
            bm, nm = b.metrics.get(m), n.metrics.get(m)
            if is_sample_metric(bm) and is_sample_metric(nm):  # quality: paired by sample
                return compare_samples(m, bm, nm, alpha)  # type: ignore[arg-type]
            keys, a_vals, b_vals = _aligned(b, n, m)
            groups = np.array([sessions.get(k, -1) for k in keys]) if sessions else None
            sign = named_direction(m) if m in also else None
            return paired_metric(m, a_vals, b_vals, alpha, test, band_k, groups, sign)

        cells_out.append(compare_cell_metrics(b, n, metrics, one, also))

    comparison = {
        "base": report_side(base),
        "new": report_side(new),
        "paired": True,
        "alpha": alpha,
        "test": test,
        "band_k": band_k,
        "sessions": len(set(sessions.values())) if sessions else 1,
        "cells": cells_out,
    }
    return correct_verdicts(comparison, correction or stats.get("correction", "holm"))
