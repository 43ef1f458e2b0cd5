"""A run's report judged: its gates and targets set on it before it is written."""

from __future__ import annotations

import dataclasses

from harness.judge.gates import evaluate_gates
from harness.judge.targets import evaluate_targets
from harness.report.model import Report
from harness.spec.matrix import MatrixSpec


def judge(report: Report, spec: MatrixSpec, comparison: dict | None = None) -> Report:
    """``report`` with the verdicts of ``spec``'s gates (against ``comparison``, a baseline's,
    where given) and targets."""
    return dataclasses.replace(
        report,
        gates=evaluate_gates(spec.gates, report, comparison),
        targets=evaluate_targets(spec.targets, report),
    )
