"""``targets:``: goals on cell metrics, reported as met or missed by how much.

Unlike gates, a missed target changes the exit code only when it says ``fail_run: true``.
For each matching cell: ``actual`` = the metric's median over rounds (or, for a dotted name
such as ``baseline.hf.speedup``, that value of the cell's report entry), ``ratio`` = actual /
target, ``factor`` = how many times better the cell must get to meet it (target / actual for
``>=`` / ``>``, actual / target for ``<=`` / ``<``; <= 1 when met), ``missed_by`` = the absolute
shortfall (0 when met). For a speed target (``qps``, ``latency_*``) on a cell with an MFU,
``mfu_needed`` = the cell's MFU x ``factor``: the model-FLOP utilisation the cell would need to
meet it with the same FLOPs per request (a derived figure, not a measurement). A missed speed
target on a traced cell also says the trace's GPU work per request and the QPS it allows with
the GPU never idle (``docs/harness/traces.md``): a QPS target above it needs less work per
request, not a busier GPU.

With ``relative_to: "key=value,..."`` the actual is a ratio: the cell's median over that of
the same run's cell with those parameters changed (``value: 0.95`` = at least 95% of it);
a cell without such a reference, or either side without the metric, has no data.
"""

from __future__ import annotations

import math
from typing import Any

from harness.judge.gates import OPS, resolve_path
from harness.report.model import Cell, Report, TargetCheck, TargetResult, Targets, as_report
from harness.spec.cells import matches, reference_index
from harness.spec.checks import TargetSpec, relative_overrides
from harness.trace.summary import traced_work


def _actual(cell: Cell, metric: str) -> float | None:
    m = cell.metrics.get(metric)
    value: Any = m.median if m else resolve_path(cell, metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


SPEED_METRICS = ("qps", "latency_")  # a metric name equal to or starting with one of these


def _mfu(cell: Cell) -> float | None:
    value = (cell.mfu or {}).get("mfu")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def check(
    target: TargetSpec, actual: float, mfu: float | None = None, work: dict | None = None
) -> dict[str, Any]:
    """One cell's outcome for a target (``mfu``: the cell's MFU, for ``mfu_needed``;
    ``work``: its traced GPU work per request, said beside a missed speed target)."""
    met = bool(OPS[target.op](actual, target.value))
    higher = target.op in (">=", ">")
    ratio = actual / target.value if target.value else math.inf
    if higher:
        factor = target.value / actual if actual else math.inf
    else:
        factor = actual / target.value if target.value else math.inf
    missed_by = 0.0 if met else abs(actual - target.value)
    speed = target.metric.startswith(SPEED_METRICS)
    mfu_needed = mfu * factor if speed and mfu is not None and math.isfinite(factor) else None
    detail = f"{actual:.4g} vs {target.op} {target.value:g}: {ratio:.3g}x the target"
    if met:
        text = f"met ({detail})"
    else:
        text = f"missed by {missed_by:.4g} ({detail}; needs {factor:.3g}x"
        if mfu_needed is not None:
            text += f", MFU {mfu:.1%} -> {mfu_needed:.1%}"
        text += ")"
        if speed and work is not None:  # the trace's measure of what the GPU work allows
            text += (
                f"; traced GPU work {work['gpu_ms_per_request']:.3g} ms per request, at most "
                f"{work['qps_at_full_busy']:.4g} QPS with the GPU never idle"
            )
    return {
        "actual": actual,
        "target": target.value,
        "op": target.op,
        "met": met,
        "missed_by": missed_by,
        "ratio": ratio,
        "factor": factor,
        "mfu_needed": mfu_needed,
        "text": text,
    }


def _relative(
    t: TargetSpec, cell: Cell, cells: tuple[Cell, ...]
) -> tuple[dict[str, Any] | None, str | None]:
    """A relative target's check of ``cell`` (None and why, when it has no data)."""
    overrides = relative_overrides(t.relative_to or "")
    i = reference_index(cell.params, overrides, [c.params for c in cells])
    ref = cells[i] if i is not None else None
    if ref is cell:
        return None, "is its own reference"
    if ref is None:
        return None, f"no cell of this run with {t.relative_to}"
    actual = _actual(cell, t.metric) if cell.ok else None
    base = _actual(ref, t.metric) if ref.ok else None
    if actual is None or base is None or base == 0:
        side = "its" if actual is None else f"the reference {ref.id}'s"
        return None, f"{side} {t.metric} is missing"
    out = check(t, actual / base)
    out.update(cell_actual=actual, reference=ref.id, reference_actual=base)
    out["text"] += f"; {actual:.4g} against {base:.4g} in {ref.id}"
    return out, None


def evaluate_targets(targets: list[TargetSpec], report: Report | dict) -> Targets:
    """``{status: met|missed|partial|none, fail_run, results: [{name, metric, status, cells,
    checks, missing}]}``; a target's status is met, missed, partial (met where measured, some
    selected cell without data) or no_data.

    ``fail_run`` is true when a target with ``fail_run: true`` was missed (or had no data).
    """
    results: list[TargetResult] = []
    fail_run = False
    cells = as_report(report).cells
    for t in targets:
        checks: list[TargetCheck] = []
        missing: list[str] = []
        why: dict[str, str] = {}
        for cell in cells:
            if t.cells and not matches(cell.id, cell.params, t.cells):
                continue
            if t.relative_to:
                got, reason = _relative(t, cell, cells)
                if reason == "is its own reference":
                    continue  # the filter also selected a reference: not a cell to judge
                if got is None:
                    missing.append(cell.id)
                    why[cell.id] = reason or ""
                else:
                    checks.append(TargetCheck(cell=cell.id, **got))
                continue
            actual = _actual(cell, t.metric) if cell.ok else None
            if actual is None:
                missing.append(cell.id)
                if reason := (cell.unchecked or {}).get(t.metric):  # not measurable
                    why[cell.id] = reason
                continue
            got = check(t, actual, _mfu(cell), traced_work(cell.trace))
            checks.append(TargetCheck(cell=cell.id, **got))
        missed = any(not c.met for c in checks)
        # met only when every selected cell was measured and met it: a cell without the
        # metric (failed, or no quality eval) leaves the target partial, never met
        status = "missed" if missed else ("no_data" if not checks else
                                          "partial" if missing else "met")  # fmt: skip
        if t.fail_run and (missed or missing or not checks):
            fail_run = True
        results.append(
            TargetResult(
                name=t.label,
                metric=t.metric,
                op=t.op,
                value=t.value,
                cells=t.cells,
                relative_to=t.relative_to,
                fail_run=t.fail_run,
                status=status,
                checks=tuple(checks),
                missing=missing,
                missing_why=why,
            )
        )
    if not results:
        overall = "none"
    elif any(r.status == "missed" for r in results):
        overall = "missed"
    elif all(r.status == "met" for r in results):
        overall = "met"
    else:
        overall = "partial"
    return Targets(overall, fail_run, tuple(results))
