"""Evaluate ``gates:`` and check what gates and targets refer to.

Gates are thresholds on cell metrics, on any report path (e.g. ``parity.top1_agreement``) or
on regressions against a baseline (a comparison from :mod:`harness.gate.compare` or
:mod:`harness.ab.paired`). :func:`check_references` finds, at load time, the gates, targets and
filters that could match nothing.
"""

from __future__ import annotations

import math
import operator
from typing import Any

from harness.metrics.rounds import DIRECTIONS, QUALITY_PREFIXES, direction
from harness.spec.cells import Cell, expand_cells, matches, reference_index
from harness.spec.checks import GateSpec, relative_overrides
from harness.spec.matrix import (
    MatrixSpec,
    SpecError,
    close_hint,
    line_of,
    load_spec,
    relocate,
)

OPS = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    ">": operator.gt,
}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# --------------------------------------------------------------------------- references


def is_metric(name: str, ks: list[int]) -> bool:
    """Whether ``name`` is a cell metric: one of :data:`harness.metrics.rounds.DIRECTIONS`, or a
    quality metric (``hit@K`` ...) at a K of ``quality.ks``."""
    prefix, at, k = name.partition("@")
    if at:
        return f"{prefix}@" in QUALITY_PREFIXES and k.isdigit() and int(k) in ks
    return name in DIRECTIONS


def metric_names(ks: list[int]) -> list[str]:
    """Every metric name a cell can have under ``quality.ks``."""
    return [*DIRECTIONS, *(f"{p}{k}" for p in QUALITY_PREFIXES for k in ks)]


def unknown(name: str, known: list[str], what: str) -> str:
    return f"'{name}' is not {what} ({close_hint(name, known)})"


def filter_problem(filt: str, cells: list, what: str = "cell") -> str | None:
    """Why the cell filter ``filt`` selects no cell of ``cells`` (None when it selects one):
    a ``key=value`` term on a key no cell has is named."""
    if any(matches(c.id, c.params, filt) for c in cells):
        return None
    keys = sorted({k for c in cells for k in c.params})
    for term in (t.strip() for t in filt.split(",")):
        key = term.partition("=")[0]
        if "=" in term and key not in keys:
            return f"cells '{filt}': {unknown(key, keys, 'a cell parameter')}"
    ids = "; ".join(c.id for c in cells[:4]) + ("; ..." if len(cells) > 4 else "")
    return f"cells '{filt}' selects no {what} of the matrix (its cells: {ids})"


def relative_problem(relative_to: str, chosen: list, cells: list) -> str | None:
    """Why a target's ``relative_to`` gives no selected cell a reference cell (None when one
    has): a parameter no cell has, or no cell with the changed values."""
    overrides = relative_overrides(relative_to)
    names = {k for c in cells for k in c.params}
    if bad := sorted(set(overrides) - names):
        return f"relative_to {relative_to!r}: no cell has the parameter(s) {', '.join(bad)}"
    params = [o.params for o in cells]
    for c in chosen:
        i = reference_index(c.params, overrides, params)
        if i is not None and cells[i] is not c:  # found, and not the cell itself
            return None
    return f"relative_to {relative_to!r}: no cell it selects has a cell with those values"


def check_references(spec: MatrixSpec, cells: list) -> list[tuple[tuple, str]]:
    """What the matrix's gates and targets name that it does not have, as (field path,
    message): a metric that is no metric, a ``cells`` filter that selects no cell of the
    expanded ``cells``, a ``path`` whose first part is no section of a report (or of a cell,
    with ``cells``), a stage the matrix does not run, a ``trace.`` / ``mfu.`` / ``quality.``
    path on cells that cannot have that section (untraced, no MFU, not evaluated), or
    a ``trace.cells`` / ``quality.cells`` filter that selects no cell. Empty when every
    reference can match. What only a run can tell (a path's deeper parts)
    fails the gate then (:func:`evaluate_gates`)."""
    from harness.quality.stage import applies
    from harness.report.build import CELL_FIELDS, REPORT_SECTIONS

    ks = list(spec.quality.ks)
    out: list[tuple[tuple, str]] = []
    items = [("gates", i, g) for i, g in enumerate(spec.gates)]
    items += [("targets", i, t) for i, t in enumerate(spec.targets)]
    for kind, i, item in items:
        name = f"{kind[:-1]} '{item.label}'"

        def add(key: str, message: str, kind=kind, i=i, name=name) -> None:
            out.append(((kind, i, key), f"{name}: {message}"))

        chosen = [c for c in cells if not item.cells or matches(c.id, c.params, item.cells)]
        if item.cells and (why := filter_problem(item.cells, cells)):
            add("cells", why)
        metric, path = item.metric, getattr(item, "path", None)
        if kind == "targets" and metric and "." in metric:  # a value of the cell's entry
            path, metric = metric, None
        if metric and not is_metric(metric, ks):
            add("metric", unknown(metric, metric_names(ks), "a metric"))
        if kind == "targets" and item.relative_to and chosen:
            if why := relative_problem(item.relative_to, chosen, cells):
                add("relative_to", why)
        if not path:
            continue
        key = "metric" if kind == "targets" else "path"
        head = path.split(".")[0]
        in_cells = kind == "targets" or bool(item.cells)
        sections = list(CELL_FIELDS if in_cells else REPORT_SECTIONS)
        what = "a section of a report cell" if in_cells else "a section of a report"
        stage = getattr(spec, head) if head in ("parity", "determinism") else None
        unrun = head in ("parity", "determinism") and (stage is None or not stage.enabled)
        if head not in sections:
            add(key, f"path {path}: {unknown(head, sections, what)}")
        elif not in_cells and unrun:
            add(key, f"path {path}: this matrix runs no {head} stage")
        elif in_cells and head == "trace" and chosen and not any(c.traced for c in chosen):
            add(key, f"path {path}: none of its cells is traced (trace.cells)")
        elif in_cells and head == "mfu" and spec.mfu is None:
            add(key, f"path {path}: this matrix computes no MFU (no mfu: section)")
        elif (
            in_cells
            and head == "quality"
            and chosen
            and not any(applies(spec.quality, c) for c in chosen)
        ):
            add(key, f"path {path}: none of its cells is evaluated (quality: section / cells)")
    # the sections' own cell filters: one that selects nothing would silently trace or
    # evaluate nothing
    if isinstance(spec.trace.cells, list):
        for i, filt in enumerate(spec.trace.cells):
            if why := filter_problem(filt, cells):
                out.append((("trace", "cells", i), f"trace: {why}"))
    if spec.quality.evaluates and spec.quality.cells:
        if why := filter_problem(spec.quality.cells, cells):
            out.append((("quality", "cells"), f"quality: {why}"))
    return out


# --------------------------------------------------------------------------- gates


def resolve_path(report: dict, path: str) -> Any:
    """``parity.summary.top1`` or ``cells.0.metrics.qps.median`` in a report (None if absent)."""
    cur: Any = report
    for part in path.split("."):
        if isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return None
    return cur


def unchecked_reason(root: dict, path: str) -> str | None:
    """Why the metric a path names (``metrics.NAME...`` in a cell, ``cells.I.metrics.NAME...``
    in a report) was not measured: the cell's ``unchecked`` entry (None when it has none)."""
    cur: Any = root
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part == "metrics" and isinstance(cur, dict) and i + 1 < len(parts):
            return (cur.get("unchecked") or {}).get(parts[i + 1])
        cur = resolve_path(cur, part)
    return None


def _absolute(gate: GateSpec, report: dict) -> dict:
    """A threshold, checked in every selected cell that ran (or in the report, for a path
    without ``cells``). A failed cell is missing; so is a cell without the path's section at
    all (an untraced cell under a ``trace.`` path). A metric the cell could not check (its
    ``unchecked`` reason: no catalog, one beam ...) is unchecked: the gate is ``no_data`` with
    the reason. Any other value absent where the cell ran, or the section is there, fails the
    gate: it cannot be checked, so it has not passed."""
    op = OPS[gate.op or "=="]
    checks: list[dict] = []
    missing: list[str] = []
    unchecked: list[dict] = []
    if gate.path:
        # with cells: the path inside each selected cell (e.g. its trace); else in the report
        roots = (
            [(f"{c['id']}: {gate.path}", c) for c in report.get("cells", [])
             if matches(c["id"], c.get("params", {}), gate.cells)]
            if gate.cells else [(gate.path, report)]
        )  # fmt: skip
        section = gate.path.split(".")[0]
        for target, root in roots:
            if (root is not report and root.get("status") != "ok") or root.get(section) is None:
                missing.append(target)
                continue
            value = resolve_path(root, gate.path)
            if _finite(value) or isinstance(value, bool):
                checks.append({"target": target, "value": value, "ok": op(value, gate.value)})
            elif value is None and (why := unchecked_reason(root, gate.path)):
                unchecked.append({"target": target, "reason": why})
            else:
                why = "absent" if value is None else f"not a number: {str(value)[:40]}"
                checks.append({"target": target, "value": why, "ok": False})
    else:
        for cell in report.get("cells", []):
            if gate.cells and not matches(cell["id"], cell.get("params", {}), gate.cells):
                continue
            if cell.get("status") != "ok":
                missing.append(cell["id"])
                continue
            m = cell.get("metrics", {}).get(gate.metric or "")
            if m is None and (why := (cell.get("unchecked") or {}).get(gate.metric or "")):
                unchecked.append({"target": cell["id"], "reason": why})
                continue
            if m is None or not _finite(m.get("median")):
                checks.append({"target": cell["id"], "value": "no value", "ok": False})
                continue
            checks.append(
                {"target": cell["id"], "value": m["median"], "ok": op(m["median"], gate.value)}
            )
    return _verdict(gate, checks, missing, unchecked)


def _relative(gate: GateSpec, comparison: dict | None) -> dict:
    """A gate against a baseline (max_regression_pct or min_improvement_pct), per compared cell."""
    if comparison is None:
        return {
            "name": gate.label,
            "status": "skipped",
            "reason": "needs a baseline (flashrec-bench compare / gate)",
        }
    checks, missing, undecided = [], [], []
    d = direction(gate.metric or "") or 1
    for cell in comparison.get("cells", []):
        if gate.cells and not matches(cell["id"], cell.get("params", {}), gate.cells):
            continue
        r = cell.get("metrics", {}).get(gate.metric or "")
        if cell.get("status") != "compared" or r is None or r.get("verdict") == "n/a":
            missing.append(cell["id"])
            continue
        if r.get("drift"):  # a change two separate runs cannot tell from drift (admit_drift)
            undecided.append({"target": cell["id"], "reason": r["drift"]})
            continue
        worse = -d * r["delta_pct"]
        band = r["band_pct"] if gate.beyond_noise else 0.0
        significant = _finite(r.get("p_value")) and r["p_value"] < comparison["alpha"]
        counts = significant or not gate.beyond_noise  # a change the statistics support
        check = {"target": cell["id"], "band_pct": r["band_pct"], "p_value": r.get("p_value")}
        if gate.max_regression_pct is not None:  # fails on a supported loss over the limit
            check.update(
                worse_pct=worse, ok=not (worse - band > gate.max_regression_pct and counts)
            )
        else:  # passes only on a supported gain of at least the minimum, beyond the band
            gain = -worse
            check.update(better_pct=gain, ok=counts and gain - band >= gate.min_improvement_pct)
        checks.append(check)
    out = _verdict(gate, checks, missing)
    if undecided and out["status"] != "fail":
        reason = undecided[0]["reason"]
        out.update(status="inconclusive", inconclusive=undecided, reason=reason)
    return out


def _verdict(
    gate: GateSpec, checks: list[dict], missing: list[str], unchecked: list[dict] | None = None
) -> dict:
    """pass / fail, or ``no_data`` when nothing it selects was measured, or a cell it selects
    ran but could not check its metric (``unchecked``, with the reason): never a pass."""
    failed = [c for c in checks if not c["ok"]]
    out = {"name": gate.label, "checks": checks, "missing": missing}
    why = ""
    if unchecked:
        out["unchecked"] = unchecked
        reasons = list(dict.fromkeys(u["reason"] for u in unchecked))
        if len(reasons) > 1:  # different cells, different reasons: each cell says its own
            why = "; ".join(f"{u['target']}: {u['reason']}" for u in unchecked)
        else:
            why = reasons[0] + ("" if len(unchecked) == 1 else f" ({len(unchecked)} cells)")
    if failed or (gate.required and (missing or not checks or unchecked)):
        return {**out, "status": "fail", **({"reason": why} if why else {})}
    if unchecked:
        return {**out, "status": "no_data", "reason": why}
    if not checks:
        why = "no cell of this run is selected"
        if missing:
            why = f"nothing measured to check (missing: {', '.join(missing)})"
        return {**out, "status": "no_data", "reason": why}
    return {**out, "status": "pass"}


def evaluate_gates(gates: list[GateSpec], report: dict, comparison: dict | None = None) -> dict:
    """Evaluate every gate. Overall: ``none`` (no gates), ``fail`` (one failed), ``no_data``
    (one had nothing to check: e.g. every cell failed), ``inconclusive`` (a relative gate on
    a change two separate runs cannot tell from drift), ``skipped`` (every gate needs a
    baseline and there is none), else ``pass``."""
    results = [_relative(g, comparison) if g.relative_kind else _absolute(g, report) for g in gates]
    statuses = {r["status"] for r in results}
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
    return {"status": status, "results": results}


def load_cells(path: str) -> tuple[MatrixSpec, list[Cell]]:
    """Load a matrix file and expand it, then check what its gates and targets refer to
    (:func:`check_references`); every error names file, line and field."""
    spec, locations = load_spec(path)
    try:
        cells = expand_cells(spec)
    except SpecError as exc:
        raise relocate(exc, str(path), locations) from None
    issues = [(line_of(locations, loc), ".".join(map(str, loc)), msg)
              for loc, msg in check_references(spec, cells)]  # fmt: skip
    if issues:
        raise SpecError(str(path), *issues[0], more=issues[1:])
    return spec, cells
