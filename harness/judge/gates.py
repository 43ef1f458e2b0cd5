"""Evaluate ``gates:`` on a typed report (:mod:`harness.report.model`).

Gates are thresholds on cell metrics, on any report path (e.g. ``parity.top1_agreement``) or
on regressions against a baseline (a comparison from :mod:`harness.judge.runs` or
:mod:`harness.judge.paired`). What a gate may name is checked when the matrix is loaded
(:func:`harness.spec.load.check_references`).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

from harness.metrics.stats import finite
from harness.names import direction
from harness.report.model import (
    Cell,
    GateCheck,
    GateResult,
    Gates,
    Part,
    Report,
    Stage,
    Unchecked,
    as_report,
)
from harness.spec.cells import matches
from harness.spec.checks import GateSpec

OPS = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    ">": operator.gt,
}


def resolve_path(root: Any, path: str) -> Any:
    """``parity.summary.top1`` or ``cells.0.metrics.qps.median`` in a report, or a path in
    one of its cells (None if absent): through the typed parts' fields and the dicts and
    lists inside them."""
    cur: Any = root
    for part in path.split("."):
        if isinstance(cur, list | tuple) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        elif isinstance(cur, Part | Stage):
            cur = cur.get(part)
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return None
    return cur


def unchecked_reason(root: Report | Cell, path: str) -> str | None:
    """Why the metric a path names (``metrics.NAME...`` in a cell, ``cells.I.metrics.NAME...``
    in a report) was not measured: the cell's ``unchecked`` entry (None when it has none)."""
    cur: Any = root
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part == "metrics" and isinstance(cur, Cell) and i + 1 < len(parts):
            return (cur.unchecked or {}).get(parts[i + 1])
        cur = resolve_path(cur, part)
    return None


def _absolute(gate: GateSpec, report: Report) -> GateResult:
    """A threshold, checked in every selected cell that ran (or in the report, for a path
    without ``cells``). A failed cell is missing; so is a cell without the path's section at
    all (an untraced cell under a ``trace.`` path). A metric the cell could not check (its
    ``unchecked`` reason: no catalog, one beam ...) is unchecked: the gate is ``no_data`` with
    the reason. Any other value absent where the cell ran, or the section is there, fails the
    gate: it cannot be checked, so it has not passed."""
    op = OPS[gate.op or "=="]
    checks: list[GateCheck] = []
    missing: list[str] = []
    unchecked: list[Unchecked] = []
    if gate.path:
        # with cells: the path inside each selected cell (e.g. its trace); else in the report
        roots: list[tuple[str, Report | Cell]] = (
            [(f"{c.id}: {gate.path}", c) for c in report.cells
             if matches(c.id, c.params, gate.cells)]
            if gate.cells else [(gate.path, report)]
        )  # fmt: skip
        section = gate.path.split(".")[0]
        for target, root in roots:
            if (isinstance(root, Cell) and not root.ok) or _section(root, section) is None:
                missing.append(target)
                continue
            value = resolve_path(root, gate.path)
            if finite(value) or isinstance(value, bool):
                checks.append(GateCheck(target, bool(op(value, gate.value)), value=value))
            elif value is None and (why := unchecked_reason(root, gate.path)):
                unchecked.append(Unchecked(target, why))
            else:
                why = "absent" if value is None else f"not a number: {str(value)[:40]}"
                checks.append(GateCheck(target, False, value=why))
    else:
        name = gate.metric or ""
        for cell in report.cells:
            if gate.cells and not matches(cell.id, cell.params, gate.cells):
                continue
            if not cell.ok:
                missing.append(cell.id)
                continue
            m = cell.metrics.get(name)
            if m is None and (why := (cell.unchecked or {}).get(name)):
                unchecked.append(Unchecked(cell.id, why))
                continue
            if m is None or not finite(m.median):
                checks.append(GateCheck(cell.id, False, value="no value"))
                continue
            checks.append(GateCheck(cell.id, bool(op(m.median, gate.value)), value=m.median))
    return _verdict(gate, checks, missing, unchecked)


def _section(root: Report | Cell, name: str) -> Any:
    """A report's or cell's section by name (None when it has none)."""
    value = root.get(name)
    return value.body if isinstance(value, Stage) else value


def _relative(gate: GateSpec, comparison: dict | None) -> GateResult:
    """A gate against a baseline (max_regression_pct or min_improvement_pct), per compared
    cell of ``comparison`` (the JSON document of :mod:`harness.judge.runs` or
    :mod:`harness.judge.paired`)."""
    if comparison is None:
        return GateResult(
            gate.label, status="skipped", reason="needs a baseline (flashrec-bench compare / gate)"
        )
    checks: list[GateCheck] = []
    missing: list[str] = []
    undecided: list[Unchecked] = []
    d = direction(gate.metric or "") or 1
    for cell in comparison.get("cells", []):
        if gate.cells and not matches(cell["id"], cell.get("params", {}), gate.cells):
            continue
        r = cell.get("metrics", {}).get(gate.metric or "")
        if cell.get("status") != "compared" or r is None or r.get("verdict") == "n/a":
            missing.append(cell["id"])
            continue
        if r.get("drift"):  # a change two separate runs cannot tell from drift (admit_drift)
            undecided.append(Unchecked(cell["id"], r["drift"]))
            continue
        worse = -d * r["delta_pct"]
        band = r["band_pct"] if gate.beyond_noise else 0.0
        significant = finite(r.get("p_value")) and r["p_value"] < comparison["alpha"]
        counts = significant or not gate.beyond_noise  # a change the statistics support
        kw = {"band_pct": r["band_pct"], "p_value": r.get("p_value")}
        if gate.max_regression_pct is not None:  # fails on a supported loss over the limit
            ok = not (worse - band > gate.max_regression_pct and counts)
            checks.append(GateCheck(cell["id"], ok, worse_pct=worse, **kw))
        else:  # passes only on a supported gain of at least the minimum, beyond the band
            gain = -worse
            ok = counts and gain - band >= gate.min_improvement_pct
            checks.append(GateCheck(cell["id"], bool(ok), better_pct=gain, **kw))
    out = _verdict(gate, checks, missing)
    if undecided and out.status != "fail":
        reason = undecided[0].reason
        return dataclasses.replace(
            out, status="inconclusive", inconclusive=tuple(undecided), reason=reason
        )
    return out


def _verdict(
    gate: GateSpec,
    checks: list[GateCheck],
    missing: list[str],
    unchecked: list[Unchecked] | None = None,
) -> GateResult:
    """pass / fail, or ``no_data`` when nothing it selects was measured, or a cell it selects
    ran but could not check its metric (``unchecked``, with the reason): never a pass."""
    failed = [c for c in checks if not c.ok]
    why = ""
    if unchecked:
        reasons = list(dict.fromkeys(u.reason for u in unchecked))
        if len(reasons) > 1:  # different cells, different reasons: each cell says its own
            why = "; ".join(f"{u.target}: {u.reason}" for u in unchecked)
        else:
            why = reasons[0] + ("" if len(unchecked) == 1 else f" ({len(unchecked)} cells)")

    def result(status: str, reason: str | None) -> GateResult:
        return GateResult(
            gate.label,
            checks=tuple(checks),
            missing=missing,
            unchecked=tuple(unchecked) if unchecked else None,
            status=status,
            reason=reason or None,
        )

    if failed or (gate.required and (missing or not checks or unchecked)):
        return result("fail", why)
    if unchecked:
        return result("no_data", why)
    if not checks:
        why = "no cell of this run is selected"
        if missing:
            why = f"nothing measured to check (missing: {', '.join(missing)})"
        return result("no_data", why)
    return result("pass", None)


def evaluate_gates(
    gates: list[GateSpec], report: Report | dict, comparison: dict | None = None
) -> Gates:
    """Evaluate every gate. Overall: ``none`` (no gates), ``fail`` (one failed), ``no_data``
    (one had nothing to check: e.g. every cell failed), ``inconclusive`` (a relative gate on
    a change two separate runs cannot tell from drift), ``skipped`` (every gate needs a
    baseline and there is none), else ``pass``."""
    report = as_report(report)
    results = [_relative(g, comparison) if g.relative_kind else _absolute(g, report) for g in gates]
    statuses = {r.status for r in results}
    if not results:
        status = "none"
    elif "fail" in statuses:
        status = "fail"
    elif "no_data" in statuses:
        status = "no_data"
    elif "inconclusive" in statuses:
        status = "inconclusive"
    else:
        status = "pass" if "pass" in statuses else "skipped"
    return Gates(status, tuple(results))
