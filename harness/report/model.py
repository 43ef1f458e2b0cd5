"""The report as types: what ``report.json`` holds, written and read through these classes.

Frozen dataclasses, not pydantic models: the report is built once from measured values that
the harness has already checked, then judged and written, so it needs no validation, only a
fixed shape and a byte-exact round trip; a dataclass's fields in declaration order are the
JSON keys in file order, and the reader marks the keys an older report lacks (``absent``) so
that re-writing it gives back the same bytes. ``Report.from_json(json.load(f))`` reads a
report, ``report.to_json()`` gives the document :func:`harness.report.build.write_report`
writes.

Typed: the report, its cells, metrics, measurement, environment, gates, targets, summary and
interruption. Left as documented dicts inside them, being open-ended: a cell's ``params``
(axis -> value), ``round_metrics`` (one ``{round, requests, METRIC: value}`` per round),
``trace``, ``server``, ``baseline``, ``mfu``, ``measured``, ``quality`` and ``warmup`` /
``excluded_requests`` sections; the report's ``matrix`` (the spec as dumped), ``model``,
``engines`` (the engine comparison) and the parity / determinism stage bodies
(:class:`Stage`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar


def _dump(v: Any) -> Any:
    if isinstance(v, Part | Stage):
        return v.to_json()
    if isinstance(v, list | tuple):
        return [_dump(x) for x in v]
    if isinstance(v, dict):
        return {k: _dump(x) for k, x in v.items()}
    return v


# fields of a part that are not keys of its JSON
_META = ("absent", "extra", "source")


@dataclass(frozen=True)
class Part:
    """Base of the report's parts: the fields are the JSON keys, in order.

    ``NESTED``: field -> reader of its JSON value (for typed parts inside); ``OMIT_NONE``:
    fields written only when set; ``absent``: keys the JSON read lacked (an older report),
    never written; ``extra``: keys the class does not know, written after the fields.
    """

    NESTED: ClassVar[dict[str, Callable[[Any], Any]]] = {}
    OMIT_NONE: ClassVar[tuple[str, ...]] = ()

    absent: frozenset[str] = field(default=frozenset(), kw_only=True, repr=False, compare=False)
    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in _META or f.name in self.absent:
                continue
            v = getattr(self, f.name)
            if v is None and f.name in self.OMIT_NONE:
                continue
            out[f.name] = _dump(v)
        return {**out, **_dump(self.extra)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Any:
        """Read a JSON object; a missing key takes the field's default and is marked absent."""
        kw: dict[str, Any] = {}
        absent = []
        names = set()
        for f in fields(cls):
            if f.name in _META:
                continue
            names.add(f.name)
            if f.name in d:
                v = d[f.name]
                reader = cls.NESTED.get(f.name)
                kw[f.name] = reader(v) if reader is not None and v is not None else v
            else:
                absent.append(f.name)
                if f.default is not dataclasses.MISSING:
                    kw[f.name] = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    kw[f.name] = f.default_factory()
                else:
                    kw[f.name] = None
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(**kw, absent=frozenset(absent), extra=extra)

    def get(self, name: str, default: Any = None) -> Any:
        """A field or extra key by name (for the gates' dotted paths)."""
        if name in self.absent:
            return default
        if name in self.extra:
            return self.extra[name]
        return getattr(self, name, default) if name in _names(type(self)) else default


def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls)) - set(_META)


def _tuple_of(kind: type[Part]) -> Callable[[list], tuple]:
    return lambda items: tuple(x if isinstance(x, kind) else kind.from_json(x) for x in items)


# --------------------------------------------------------------------------- cells


@dataclass(frozen=True)
class Metric(Part):
    """One metric of a cell over its rounds (or, ``unit: samples``, over a quality eval's
    samples: then ``ci`` is the interval's method)."""

    median: float | None
    ci95_low: float | None = None
    ci95_high: float | None = None
    cv: float | None = None
    noise_band: float | None = None
    n: int = 0
    values: list[float] = field(default_factory=list)
    unit: str | None = None
    ci: str | None = None
    OMIT_NONE = ("unit", "ci")


def _metrics(d: dict) -> dict[str, Metric]:
    return {k: v if isinstance(v, Metric) else Metric.from_json(v) for k, v in d.items()}


@dataclass(frozen=True)
class Cell(Part):
    """One cell of the report: its parameters, outcome, metrics and sections."""

    id: str
    engine: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"
    error: str | None = None
    log_tail: str | None = None
    rounds: int = 0
    round_metrics: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Metric] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    trace: dict[str, Any] | None = None
    excluded_requests: dict[str, Any] = field(default_factory=dict)
    warmup: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] | None = None
    duration_s: float | None = None
    baseline: dict[str, Any] = field(default_factory=dict)
    mfu: dict[str, Any] | None = None
    measured: dict[str, Any] | None = None
    resumed: bool = False
    quality: dict[str, Any] | None = None
    unchecked: dict[str, str] = field(default_factory=dict)
    NESTED = {"metrics": _metrics}

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def median(self, name: str) -> float | None:
        """The median of metric ``name`` (None when the cell has none)."""
        m = self.metrics.get(name)
        return m.median if m else None

    @property
    def hf(self) -> dict[str, Any]:
        """The HF baseline entry (empty when the cell has none)."""
        return (self.baseline or {}).get("hf") or {}


# --------------------------------------------------------------------------- judging


@dataclass(frozen=True)
class Unchecked(Part):
    """A cell a gate could not judge, and why (an unmeasurable metric, or drift)."""

    target: str
    reason: str


@dataclass(frozen=True)
class GateCheck(Part):
    """One checked value of a gate: ``value`` for a threshold; ``band_pct``, ``p_value`` and
    ``worse_pct`` or ``better_pct`` for a gate against a baseline."""

    target: str
    ok: bool
    value: Any = None
    band_pct: float | None = None
    p_value: float | None = None
    worse_pct: float | None = None
    better_pct: float | None = None

    @property
    def relative(self) -> bool:
        return self.band_pct is not None or "band_pct" in self.extra

    def to_json(self) -> dict[str, Any]:
        if self.band_pct is None and self.worse_pct is None and self.better_pct is None:
            return {"target": self.target, "value": self.value, "ok": self.ok}
        out: dict[str, Any] = {"target": self.target, "band_pct": self.band_pct}
        out["p_value"] = self.p_value
        if self.worse_pct is not None:
            out["worse_pct"] = self.worse_pct
        if self.better_pct is not None:
            out["better_pct"] = self.better_pct
        return {**out, "ok": self.ok}

    @property
    def shown(self) -> Any:
        """The value a failing check shows: the value, else the loss or gain in %."""
        for v in (self.value, self.worse_pct, self.better_pct):
            if v is not None:
                return v
        return None


@dataclass(frozen=True)
class GateResult(Part):
    """One gate's verdict: pass, fail, no_data, inconclusive or skipped."""

    name: str
    checks: tuple[GateCheck, ...] | None = None
    missing: list[str] | None = None
    unchecked: tuple[Unchecked, ...] | None = None
    status: str = "pass"
    inconclusive: tuple[Unchecked, ...] | None = None
    reason: str | None = None
    OMIT_NONE = ("checks", "missing", "unchecked", "inconclusive", "reason")
    NESTED = {
        "checks": _tuple_of(GateCheck),
        "unchecked": _tuple_of(Unchecked),
        "inconclusive": _tuple_of(Unchecked),
    }


@dataclass(frozen=True)
class Gates(Part):
    """Every gate's verdict and the overall one (``none`` without gates)."""

    status: str = "none"
    results: tuple[GateResult, ...] = ()
    NESTED = {"results": _tuple_of(GateResult)}


@dataclass(frozen=True)
class TargetCheck(Part):
    """One cell's outcome for a target (see :mod:`harness.judge.targets`)."""

    cell: str
    actual: float
    target: float
    op: str
    met: bool
    missed_by: float
    ratio: float
    factor: float
    mfu_needed: float | None
    text: str
    cell_actual: float | None = None
    reference: str | None = None
    reference_actual: float | None = None
    OMIT_NONE = ("cell_actual", "reference", "reference_actual")


@dataclass(frozen=True)
class TargetResult(Part):
    """One target's outcome over its cells: met, missed, partial or no_data."""

    name: str
    metric: str
    op: str
    value: float
    cells: str | None
    relative_to: str | None
    fail_run: bool
    status: str
    checks: tuple[TargetCheck, ...] = ()
    missing: list[str] = field(default_factory=list)
    missing_why: dict[str, str] = field(default_factory=dict)
    NESTED = {"checks": _tuple_of(TargetCheck)}


@dataclass(frozen=True)
class Targets(Part):
    """Every target's outcome, the overall one, and whether a ``fail_run`` target failed."""

    status: str = "none"
    fail_run: bool = False
    results: tuple[TargetResult, ...] = ()
    NESTED = {"results": _tuple_of(TargetResult)}


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class Git(Part):
    """The checkout a run ran (``tree``: the files of a dirty one, as a git tree id;
    ``declared``: the commit FLASHREC_SOURCE_COMMIT declares)."""

    commit: str | None = None
    dirty: bool | None = None
    branch: str | None = None
    tree: str | None = None
    declared: str | None = None


@dataclass(frozen=True)
class Environment(Part):
    """Where and with what a run ran; ``host_probe``: ``{cpu_model, json_256_beams_ms}``,
    ``versions``: package -> version, ``gpus``: ``[{name, ...}]``."""

    git: Git = field(default_factory=Git)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    driver: str | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    host: str | None = None
    platform: str | None = None
    cpu_count: int | None = None
    host_probe: dict[str, Any] | None = None
    python_executable: str | None = None
    matrix_path: str | None = None
    matrix_hash: str | None = None
    model_hash: str | None = None
    NESTED = {"git": Git.from_json}


@dataclass(frozen=True)
class Measurement(Part):
    """How the run measured: rounds, radix temperature, traced cells, the method's lines."""

    rounds: int = 0
    radix: str | None = None
    traced_cells: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    resumed_cells: int = 0


@dataclass(frozen=True)
class Summary(Part):
    cells: int = 0
    ok: int = 0
    failed: int = 0


@dataclass(frozen=True)
class Interrupted(Part):
    """A run cut short (a time limit, a signal): how far it got."""

    cause: str
    cells_done: int
    cells_selected: int


@dataclass(frozen=True)
class Stage:
    """A stage's section (parity, determinism): ``{status, ...}``, the rest free-form as the
    stage writes it (:mod:`harness.parity.stage`, :mod:`harness.determinism`)."""

    body: dict[str, Any]

    @property
    def status(self) -> str | None:
        return self.body.get("status")

    def get(self, name: str, default: Any = None) -> Any:
        return self.body.get(name, default)

    def to_json(self) -> dict[str, Any]:
        return self.body


NOT_CONFIGURED = Stage({"status": "not_configured"})


@dataclass(frozen=True)
class Report(Part):
    """A run's report: what ``report.json`` holds (schema ``schema_version``)."""

    schema_version: int = 1
    run_id: str = ""
    created: str = ""
    clock_epoch_unix: float | None = None
    environment: Environment = field(default_factory=Environment)
    matrix: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    measurement: Measurement = field(default_factory=Measurement)
    cells: tuple[Cell, ...] = ()
    engines: dict[str, Any] | None = None
    parity: Stage = NOT_CONFIGURED
    determinism: Stage = NOT_CONFIGURED
    gates: Gates = field(default_factory=Gates)
    targets: Targets = field(default_factory=Targets)
    summary: Summary = field(default_factory=Summary)
    interrupted: Interrupted | None = None
    files: list[str] | None = None
    # where the report was read from (not written)
    source: str | None = field(default=None, kw_only=True, repr=False, compare=False)
    OMIT_NONE = ("interrupted", "files")
    NESTED = {
        "environment": Environment.from_json,
        "measurement": Measurement.from_json,
        "cells": _tuple_of(Cell),
        "parity": Stage,
        "determinism": Stage,
        "gates": Gates.from_json,
        "targets": Targets.from_json,
        "summary": Summary.from_json,
        "interrupted": Interrupted.from_json,
    }

    @property
    def name(self) -> str:
        return self.matrix.get("name") or "matrix"

    def stage(self, name: str) -> Stage:
        """The parity or determinism section."""
        return self.parity if name == "parity" else self.determinism


def as_report(report: Report | dict[str, Any]) -> Report:
    """``report``, read into a :class:`Report` when given as its JSON document."""
    return report if isinstance(report, Report) else Report.from_json(report)


def as_cell(cell: Cell | dict[str, Any]) -> Cell:
    return cell if isinstance(cell, Cell) else Cell.from_json(cell)


def as_metric(metric: Metric | dict[str, Any]) -> Metric:
    return metric if isinstance(metric, Metric) else Metric.from_json(metric)


def read_report(path: str | Path) -> Report:
    """A report.json, given the file or the run directory holding it."""
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    report = Report.from_json(json.loads(p.read_text()))
    return dataclasses.replace(report, source=str(p))
