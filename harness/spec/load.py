"""Matrix YAML -> a validated spec and its cells: load, validate, expand, then check what its
gates and targets refer to (every error names file, line and field).

The names those references are checked against (metrics, report sections, cell fields) come
from :mod:`harness.names`, below this package: the loader knows nothing of the metrics, the
report or the judges.
"""

from __future__ import annotations

from harness.names import CELL_FIELDS, REPORT_SECTIONS, is_metric, metric_names
from harness.spec.base import close_hint
from harness.spec.cells import Cell, expand_cells, matches, reference_index
from harness.spec.checks import relative_overrides
from harness.spec.matrix import MatrixSpec, SpecError, line_of, load_spec, relocate
from harness.spec.quality import QualitySpec


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


def evaluated(quality: QualitySpec, cell: Cell) -> bool:
    """Whether ``cell`` is evaluated by the ``quality:`` section (it has a dataset and its
    filter selects the cell)."""
    return quality.evaluates and (not quality.cells or matches(cell.id, cell.params, quality.cells))


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
            and not any(evaluated(spec.quality, c) for c in chosen)
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
