"""harness.report.model: the typed report reads every committed report.json and writes it back
byte for byte, its fields are the names the matrix loader checks paths against, and the
documents re-rendered from a report.json are those of the run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.names import CELL_FIELDS, REPORT_SECTIONS
from harness.report.model import Cell, Report, read_report

ROOT = Path(__file__).resolve().parents[3]
REPORTS = sorted(
    p for p in (ROOT / "reports").rglob("report.json") if '"cells"' in p.read_text()[:200_000]
)


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} - {"absent", "extra", "source"}


def test_fields_are_the_checked_names():
    assert _names(Report) == set(REPORT_SECTIONS)
    assert [f for f in (f.name for f in dataclasses.fields(Cell)) if f in CELL_FIELDS] == list(
        CELL_FIELDS
    )


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_committed_reports_round_trip_byte_for_byte(path):
    text = path.read_text()
    report = read_report(path)
    assert report.source == str(path)
    assert json.dumps(report.to_json(), indent=1, default=str) == text
    assert all(isinstance(c, Cell) for c in report.cells)


def test_an_older_report_keeps_its_absent_keys_absent():
    old = {"schema_version": 1, "run_id": "r", "cells": [{"id": "a", "status": "ok"}]}
    report = Report.from_json(old)
    assert report.cells[0].unchecked == {} and "unchecked" in report.cells[0].absent
    assert report.to_json() == old
    assert report.gates.status == "none" and report.interrupted is None


def test_a_built_report_writes_every_section(tmp_path):
    """build_report -> judge -> write_report: files and (when cut short) interrupted are in
    report.json; nothing is patched into it after it is judged."""
    from harness.judge.report import judge
    from harness.report.build import build_report, write_report
    from harness.report.model import Interrupted
    from harness.spec.matrix import MatrixSpec

    spec = MatrixSpec.model_validate(
        {"engine": {"name": "e", "kind": "external", "url": "http://127.0.0.1:1"}}
    )
    built = build_report(spec, [], {}, None, "r", interrupted=Interrupted("SIGTERM", 0, 2))
    written = write_report(judge(built, spec), [], tmp_path)
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["interrupted"] == {"cause": "SIGTERM", "cells_done": 0, "cells_selected": 2}
    assert doc["files"] == written.files and doc["gates"] == {"status": "none", "results": []}
    assert list(doc)[-2:] == ["interrupted", "files"]
