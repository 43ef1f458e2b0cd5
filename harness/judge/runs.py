"""Compare two runs' reports: a verdict per cell and metric.

A metric *regressed* (or *improved*) only when the change is both significant (Welch or
Mann-Whitney over rounds, ``p < alpha``; with ``stats.correction: holm``, the default, the
p-value Holm-adjusted over every cell x metric the comparison tests) and larger than the noise
band (the wider of the two runs' bands), and, the two runs being separate, larger than the
variation between runs (:func:`admit_drift`: else *inconclusive*); anything else is *within
noise*. The paired A/B comparison (:mod:`harness.judge.paired`) shares the cell and verdict
plumbing here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from harness.judge.samples import compare_samples, is_sample_metric
from harness.metrics.host import BUSY_NOTE
from harness.metrics.stats import finite, holm, significance, wider_band
from harness.names import direction, is_metric, metric_names
from harness.report.model import Cell, Metric, Report, as_report
from harness.spec.load import unknown


def compare_metric(name: str, base: Metric, new: Metric, alpha: float, test: str) -> dict:
    """Verdict for one metric of one cell: improved / regressed / within_noise / n/a."""
    if is_sample_metric(base) and is_sample_metric(new):  # a quality eval's: by sample
        return compare_samples(name, base, new, alpha)
    b, n = base.median, new.median
    out: dict[str, Any] = {"base": b, "new": n}
    if not (finite(b) and finite(n)):
        return {**out, "verdict": "n/a", "reason": "missing value"}
    if b != 0:
        delta = (n - b) / abs(b)
    else:
        delta = 0.0 if n == 0 else math.copysign(math.inf, n)
    band = wider_band(base.noise_band, new.noise_band)
    out.update(delta_pct=100 * delta, band_pct=100 * band)
    bv, nv = base.values or [], new.values or []
    if len(bv) < 2 or len(nv) < 2:
        return {**out, "verdict": "n/a", "reason": "fewer than 2 rounds on a side"}
    p = significance(bv, nv, test)
    out["p_value"] = p
    significant = finite(p) and p < alpha
    beyond = abs(delta) > band
    d = direction(name)
    if not (significant and beyond):
        reason = "not significant" if not significant else "inside the noise band"
        return {**out, "verdict": "within_noise", "reason": reason}
    if d == 0:
        return {**out, "verdict": "changed"}
    return {**out, "verdict": "improved" if delta * d > 0 else "regressed"}


def _match(
    base_cells: Sequence[Cell], new_cells: Sequence[Cell]
) -> list[tuple[Cell | None, Cell | None]]:
    """Pairs of cells: by id, then by parameters other than the engine name."""
    by_id = {c.id: c for c in base_cells}
    pairs, left = [], []
    used: set[str] = set()
    for c in new_cells:
        if c.id in by_id:
            pairs.append((by_id[c.id], c))
            used.add(c.id)
        else:
            left.append(c)

    def key(c: Cell) -> str:
        return json.dumps({k: v for k, v in c.params.items() if k != "engine"}, sort_keys=True)

    rest = {key(c): c for c in base_cells if c.id not in used}
    for c in left:
        b = rest.pop(key(c), None)
        pairs.append((b, c))
    pairs += [(b, None) for b in rest.values()]
    return pairs


def compare_cell_metrics(
    b: Cell,
    n: Cell,
    metrics: list[str] | None,
    compare_one: Callable[[str], dict | None],
    also: Sequence[str] = (),
) -> dict:
    """One matched cell pair (both ok): ``compare_one(metric)`` -> result with a ``verdict``
    (None: not comparable) for the given metrics, else every directional metric of ``n``,
    and ``also`` besides. Returns the compared cell (shared by the two-report comparison here
    and the paired A/B comparison of ``harness.judge.paired``; :func:`correct_verdicts` lists
    the regressions)."""
    # both sides' metrics: one the new run lost (a failed quality eval) is shown as n/a and
    # leaves its gates nothing to check, never silently dropped
    sides = dict.fromkeys([*n.metrics, *b.metrics])
    names = metrics or [m for m in sides if direction(m) != 0]
    names = [*names, *(m for m in also if m not in names)]
    res = {m: r for m in names if (r := compare_one(m)) is not None}
    return {
        "id": n.id,
        "base_id": b.id,
        "status": "compared",
        "params": n.params,
        "metrics": res,
    }


CHANGED = ("regressed", "improved", "changed")


def correct_verdicts(comparison: dict, correction: str = "holm") -> dict:
    """Correct one comparison's verdicts for its number of tests, in place, and return it with
    its ``regressions``, ``improvements`` and overall ``verdict``.

    The tests are every compared cell x metric with a p-value, except degenerate ones (no
    change and no spread on either side, e.g. an error rate of 0 against 0: no test at all).
    With ``holm`` each gets ``p_adjusted`` (:func:`harness.metrics.stats.holm`), and a verdict of
    regressed / improved / changed stands only when ``p_adjusted < alpha``: the chance of
    any false verdict in the whole table is then at most alpha, where testing ten metrics
    of two cells at alpha each would give one in several A/A runs. ``none`` keeps the
    per-metric verdicts. The relative gates judge their own metric (see :func:`_relative`).
    """
    tested = [
        r
        for cell in comparison["cells"]
        if cell.get("status") == "compared"
        for r in cell["metrics"].values()
        if finite(r.get("p_value")) and not (r.get("delta_pct") == 0 and r.get("band_pct") == 0)
    ]
    comparison["correction"] = {"method": correction, "tests": len(tested)}
    if correction != "none" and tested:
        for r, p_adj in zip(tested, holm([r["p_value"] for r in tested])):
            r["p_adjusted"] = p_adj
            if r["verdict"] in CHANGED and not p_adj < comparison["alpha"]:
                r["verdict"] = "within_noise"
                r["reason"] = f"not significant over {len(tested)} tests (Holm)"
    return tally(comparison)


def tally(comparison: dict) -> dict:
    """Fill in a comparison's ``regressions``, ``improvements``, ``inconclusive`` and overall
    ``verdict`` (regressed, else inconclusive, else ok; ``no_data`` when no cell of both
    runs was compared) from its metrics' verdicts."""
    lists: dict[str, list] = {"regressed": [], "improved": [], "inconclusive": []}
    for cell in comparison["cells"]:
        for m, r in cell.get("metrics", {}).items():
            if r["verdict"] in lists:
                lists[r["verdict"]].append({"cell": cell["id"], "metric": m, **r})
    verdict = "regressed" if lists["regressed"] else "ok"
    if not any(c.get("status") == "compared" for c in comparison["cells"]):
        verdict = "no_data"  # no cell of both runs was compared: nothing to call ok
    if verdict == "ok" and lists["inconclusive"]:
        verdict = "inconclusive"
    comparison.update(
        regressions=lists["regressed"],
        improvements=lists["improved"],
        inconclusive=lists["inconclusive"],
        verdict=verdict,
    )
    return comparison


# --------------------------------------------------------------------------- between runs


def same_code(base: Report, new: Report) -> str | None:
    """The commit both reports' runs ran, with the same files (None when they differ or a
    report does not say)."""
    bg, ng = base.environment.git, new.environment.git
    if not bg.commit or bg.commit != ng.commit:
        return None
    if (bg.dirty or ng.dirty) and (not bg.tree or bg.tree != ng.tree):
        return None
    return bg.commit


def host_probe_pct(base: Report, new: Report) -> float | None:
    """How much slower (+) or faster (-) NEW's host ran the host probe than BASE's, in %
    (:func:`harness.run.environment.host_probe`; None when a report lacks it)."""
    b, n = ((r.environment.host_probe or {}).get("json_256_beams_ms") for r in (base, new))
    return 100 * (n / b - 1) if finite(b) and finite(n) and b > 0 else None


def _engines(report: Report) -> Any:
    m = report.matrix or {}
    return m.get("engines") or [m.get("engine")]


def between_runs(base: Report, new: Report, band_pct: float | None) -> dict:
    """What two separate runs' comparison knows about the variation between them: not
    interleaved; the commit when both ran the same code with the same engines, model,
    workload and load (an A/A pair: any difference is drift); the host probe's difference;
    the recorded between-run band (%, None when none is recorded)."""
    commit = same_code(base, new)
    setup = commit is not None and _engines(base) == _engines(new) and not comparability(base, new)
    return {
        "interleaved": False,
        "same_code": commit,
        "same_setup": setup,
        "host_probe_pct": host_probe_pct(base, new),
        "between_run_band_pct": band_pct,
    }


def busy_sides(base_cell: Cell, new_cell: Cell) -> list[str]:
    """Which of two matched cells ("base", "new") were measured on a busy host: other
    processes' CPU use during their rounds (the note of :mod:`harness.metrics.host`)."""
    return [
        side
        for side, cell in (("base", base_cell), ("new", new_cell))
        if any(str(n).startswith(BUSY_NOTE) for n in cell.notes or [])
    ]


def admit_drift(comparison: dict) -> dict:
    """Judge a two-run comparison's changes against the variation between runs, which its
    rounds cannot see (a less loaded machine alone can double a QPS). A metric whose change
    the rounds support (p < alpha, beyond its band) stands as regressed / improved / changed
    only when it also exceeds the recorded between-run band plus the host probe's difference,
    never in an A/A pair, and never in a cell measured on a busy host on either side (the
    band holds for quiet hosts); otherwise its verdict is ``inconclusive``, and the metric's
    ``drift`` says why (the relative gates read it). Returns the comparison, re-tallied."""
    info = comparison["between_runs"]
    probe, band = info["host_probe_pct"], info["between_run_band_pct"]
    probe_text = (
        "no host probe in both reports"
        if probe is None
        else (f"host probe differs by {probe:+.1f}%")
    )
    for cell in comparison["cells"]:
        for r in cell.get("metrics", {}).values():
            if r.get("unit") == "samples":  # a decode's quality does not drift with the machine
                continue
            p = r.get("p_value")
            supported = (
                finite(p)
                and p < comparison["alpha"]
                and (abs(r.get("delta_pct", 0.0)) > r.get("band_pct", 0.0))
            )
            if not supported:
                continue
            if cell.get("busy_host"):
                why = f"a busy host on the {' and '.join(cell['busy_host'])} side (other processes' CPU use)"
            elif info["same_setup"]:
                why = f"the same code ({info['same_code'][:7]}) and setup on both sides"
            elif band is None:
                why = "no between-run band recorded (stats.between_run_band_pct)"
            else:
                allowance = band + abs(probe or 0.0)
                if abs(r["delta_pct"]) - r["band_pct"] > allowance:
                    r["between_run_pct"] = allowance
                    continue
                why = f"inside the between-run band ({band:g}% + {abs(probe or 0.0):.1f}% probe)"
            r["drift"] = (
                f"not interleaved; {why}; {probe_text}; for a decision: flashrec-bench gate"
            )
            if r["verdict"] in CHANGED:
                r["verdict"], r["reason"] = "inconclusive", r["drift"]
    return tally(comparison)


def report_side(r: Report) -> dict:
    """Where a compared report came from: path, run id, git state."""
    git = None if "environment" in r.absent else r.environment.git.to_json()
    return {"path": r.source, "run_id": r.get("run_id"), "git": git}


# what must stay fixed for two runs to be comparable (the design notes: the same model and
# catalog, the same load, the same radix temperature); rounds and timeouts may differ
LOAD_FIELDS = ("mode", "concurrency", "rate", "duration_s", "max_tokens", "temperature", "seed",
               "radix", "beam_width")  # fmt: skip
WORKLOAD_FIELDS = ("kind", "path", "requests", "warmup_requests", "median_tokens", "spread",
                   "system_prompt_tokens", "seed", "shuffle", "users", "user_items",
                   "user_order")  # fmt: skip


def comparability(base: Report, new: Report) -> list[dict]:
    """What differs between two reports' runs that makes their numbers incomparable: the
    model (its content hash), the catalog (its file's hash), the workload and the load
    settings. Empty when nothing does (or when a report lacks the field: older reports are
    not flagged)."""
    out: list[dict] = []

    def check(field: str, a: Any, b: Any) -> None:
        if a is not None and b is not None and a != b:
            out.append({"field": field, "base": a, "new": b})

    bmod, nmod = base.model or {}, new.model or {}
    check("model.hash", bmod.get("hash"), nmod.get("hash"))
    check("model.catalog_hash", bmod.get("catalog_hash"), nmod.get("catalog_hash"))
    bm, nm = base.matrix or {}, new.matrix or {}
    for section, fields in (("workload", WORKLOAD_FIELDS), ("load", LOAD_FIELDS)):
        bs, ns = bm.get(section) or {}, nm.get(section) or {}
        for f in fields:
            check(f"{section}.{f}", bs.get(f), ns.get(f))
    return out


def compare_reports(
    base: Report | dict,
    new: Report | dict,
    metrics: list[str] | None = None,
    alpha: float | None = None,
    test: str | None = None,
    correction: str | None = None,
    between_run_band_pct: float | None = None,
) -> dict:
    """Cell-by-cell, metric-by-metric comparison of two separate runs. ``comparability`` lists
    what differs between the two runs' model, workload and load (empty: comparable);
    ``correction`` (default: the new report's ``stats.correction``, else holm): see
    :func:`correct_verdicts`; a change then stands only beyond the variation between runs
    (``between_run_band_pct``, default the new report's ``stats.between_run_band_pct``):
    see :func:`admit_drift`."""
    base, new = as_report(base), as_report(new)
    stats = new.matrix.get("stats", {})
    if between_run_band_pct is None:
        between_run_band_pct = stats.get("between_run_band_pct")
    alpha = alpha if alpha is not None else stats.get("alpha", 0.05)
    test = test or stats.get("test", "welch")
    cells_out = []
    for b, n in _match(base.cells, new.cells):
        if b is None or n is None:
            only = (n or b).id  # type: ignore[union-attr]
            cells_out.append(
                {"id": only, "status": "missing_in_base" if b is None else "missing_in_new"}
            )
            continue
        if not b.ok or not n.ok:
            cells_out.append(
                {
                    "id": n.id,
                    "base_id": b.id,
                    "status": "failed",
                    "base_status": b.status,
                    "new_status": n.status,
                }
            )
            continue

        def one(m: str, b=b, n=n) -> dict | None:
            bm, nm = b.metrics.get(m), n.metrics.get(m)
            if bm is not None and nm is not None:
                return compare_metric(m, bm, nm, alpha, test)
            if bm is None and nm is None:
                return None
            side = "new" if nm is None else "base"
            return {
                "base": None,
                "new": None,
                "verdict": "n/a",
                "reason": f"missing in the {side} run",
            }

        compared = compare_cell_metrics(b, n, metrics, one)
        busy = busy_sides(b, n)
        if busy:
            compared["busy_host"] = busy
        cells_out.append(compared)
    comparison = {
        "base": report_side(base),
        "new": report_side(new),
        "alpha": alpha,
        "test": test,
        "cells": cells_out,
        "comparability": comparability(base, new),
        "between_runs": between_runs(base, new, between_run_band_pct),
    }
    return admit_drift(correct_verdicts(comparison, correction or stats.get("correction", "holm")))


def metrics_problem(names: list[str], reports: list[Report]) -> str | None:
    """Why ``compare --metrics`` names cannot be compared (None when they can): a name that is
    no metric, or one that no ok cell of the reports has."""
    ks = (reports[-1].matrix or {}).get("quality", {}).get("ks", [1, 10])
    have = {m for r in reports for c in r.cells for m in c.metrics}
    if not names:
        return "names no metric"
    for name in names:
        if not is_metric(name, ks):
            return unknown(name, metric_names(ks), "a metric")
        if name not in have:
            return f"'{name}': no cell of the two reports has it (they have: {', '.join(sorted(have))})"
    return None
