"""Cell results -> the typed report (:mod:`harness.report.model`), and the typed report ->
report.json, records, summary.csv, REPORT.md, report.html.

The report is built (:func:`build_report`), judged (:mod:`harness.judge`: its gates and
targets are set on it) and then written (:func:`write_report`): nothing is added to it after.
``report.json`` is schema-versioned (``schema_version``); the per-request records are written
once (``records.csv``, plus ``records.parquet`` when pyarrow is installed) and every metric in
the report is computed from them.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from harness import SCHEMA_VERSION
from harness.load.client import EPOCH_UNIX, Record
from harness.metrics.checked import malformed_note, unchecked
from harness.metrics.flops import derived_metrics
from harness.metrics.rounds import (
    KEY_METRICS,
    burst_extra,
    busy_extra,
    by_round,
    cell_metrics,
    closed_extra,
    notes,
    round_metrics,
)
from harness.metrics.server import chain, round_extra
from harness.quality.stage import cell_metrics as quality_cell_metrics
from harness.quality.stage import report_entry as quality_report_entry
from harness.report.engines import engine_comparison
from harness.report.method import method_lines
from harness.report.model import Cell, Interrupted, Report
from harness.report.render_html import write_html
from harness.report.render_md import write_markdown
from harness.run.cell import CellResult
from harness.run.environment import environment, machine
from harness.spec.matrix import MatrixSpec
from harness.spec.model import ResolvedModel


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN / inf -> None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def cell_entry(res: CellResult, spec: MatrixSpec, here: dict | None = None) -> Cell:
    """One cell of the report; ``here``: this run's machine stamp, for a resumed cell's note
    (:func:`resumed_note`; default :func:`harness.run.environment.machine`)."""
    measured = [r for r in res.records if r.phase == "measure"]
    excluded = Counter(r.excluded for r in measured if r.excluded)
    warm = [r for r in res.records if r.phase == "warmup"]
    hf = (res.baseline or {}).get("hf")
    extra = chain(
        derived_metrics(res.mfu, hf),
        round_extra(res.server_rounds),
        burst_extra(res.burst) if res.burst else None,
        closed_extra(res.closed) if res.closed else None,
        busy_extra(res.trace),
    )
    metrics = cell_metrics(res.records, spec.stats, extra) if res.status == "ok" else {}
    notes_q = []
    if res.status == "ok" and res.quality:
        q = quality_cell_metrics(res.quality)
        clash = sorted(set(q) & set(metrics))
        if clash:
            notes_q.append(f"{', '.join(clash)}: the quality eval's, not the workload's")
        metrics.update(q)
    # metrics the run could not check, and why (harness.metrics.checked): a gate on one is
    # no_data with the reason, never a pass
    not_checked = unchecked(res, metrics, list(spec.quality.ks))
    if res.status == "ok" and (malformed := malformed_note(res.records)):
        notes_q.append(malformed)
    rounds = [
        {"round": rnd, "requests": len(recs), **round_metrics(recs, extra)}
        for rnd, recs in by_round(res.records).items()
    ]
    first = [resumed_note(res.measured or None, here or machine())] if res.resumed else []
    entry = {
        "id": res.id,
        "engine": res.params.get("engine"),
        "params": res.params,
        "status": res.status,
        "error": res.error,
        "log_tail": res.log_tail,
        "rounds": res.rounds_done,
        "round_metrics": rounds,
        "metrics": metrics,
        "notes": first
        + res.notes
        + notes_q
        + (notes(metrics, spec.stats) if res.status == "ok" else []),
        "trace": res.trace,
        "excluded_requests": {"count": sum(excluded.values()), "reasons": dict(excluded)},
        "warmup": {
            "requests": len(warm),
            "failed": sum(1 for r in warm if not r.ok),
            "invalid_sids": sum(r.invalid for r in warm),
        },
        "server": res.server,
        "duration_s": res.duration_s,
        "baseline": {"hf": _hf_entry(hf, metrics)} if hf else {},
        "mfu": _mfu_entry(res.mfu, metrics),
        "measured": res.measured or None,
        "resumed": res.resumed,
        "quality": quality_report_entry(res.quality),
        "unchecked": not_checked,
    }
    return Cell.from_json(entry)


def resumed_note(measured: dict | None, here: dict) -> str:
    """The note of a cell that --resume took from an earlier run: when, where and at which
    commit it was measured, and whether that differs from ``here`` (the reporting run's
    :func:`harness.run.environment.machine`)."""
    if not measured:
        return "resumed from an earlier run (which machine and commit is not recorded)"
    git = (measured.get("git") or "?")[:7]
    if not measured.get("git") and measured.get("declared"):  # a tree copied without its .git
        git = f"? (declared source commit {measured['declared']})"
    if measured.get("dirty"):
        tree = measured.get("tree")
        git += f" (dirty, tree {tree[:7]})" if tree else " (dirty)"
    where = measured.get("host") or "?"
    if measured.get("gpu"):
        where += f", {measured['gpu']}"
    note = f"resumed: measured {measured.get('at', '?')} on {where}, git {git}"
    other = []
    if any(measured.get(k) != here[k] for k in ("host", "gpu")):
        other.append("machine")
    if (
        measured.get("git") != here["git"]
        or measured.get("tree") != here.get("tree")
        or measured.get("declared") != here.get("declared")
    ):
        other.append("commit")
    if other:
        note += f" (not this report's {' or '.join(other)})"
    return note


def _median(metrics: dict, name: str) -> float | None:
    m = metrics.get(name)
    return m["median"] if m else None


def _hf_entry(hf: dict, metrics: dict) -> dict:
    """The HF baseline of a cell plus the ratios against FlashRec's medians."""
    out = dict(hf)
    out.setdefault("hf_skipped", None)
    out.setdefault("hf_error", None)
    qps, lat = _median(metrics, "qps"), _median(metrics, "latency_mean_ms")
    ok = hf.get("status") == "ok"
    out["speedup"] = qps / hf["hf_qps"] if ok and qps else None
    out["latency_ratio"] = hf["hf_ms_per_request"] / lat if ok and lat else None
    return out


def _mfu_entry(info: dict | None, metrics: dict) -> dict | None:
    """A cell's MFU inputs and results (medians over rounds)."""
    if info is None:
        return None
    out = dict(info)
    if "linear_params" in info:
        out["flop_per_token"] = 2 * info["linear_params"]
        out["decode_rows"] = info["beam_width"] * info["decode_forwards"]
    for name in ("tflop_per_request", "achieved_tflops", "mfu"):
        out[name] = _median(metrics, name)
    return out


def build_report(
    spec: MatrixSpec,
    results: list[CellResult],
    stages: dict[str, dict],
    model: ResolvedModel | None,
    run_id: str,
    matrix_path: str | None = None,
    interrupted: Interrupted | None = None,
    git: dict | None = None,
) -> Report:
    """The run's report, not yet judged (:func:`harness.judge.judge` sets its gates and
    targets); ``git``: the checkout the cells ran, where not this one (an A/B side)."""
    matrix = spec.model_dump(mode="json")
    env = environment(matrix, matrix_path, model.hash if model else None)
    if git is not None:
        env = {**env, "git": git}
    here = machine() if any(r.resumed for r in results) else None
    cells = [cell_entry(r, spec, here) for r in results]
    traced = [c.id for c in cells if c.trace]
    rules = method_lines(spec, results, cells)  # each line from what the run did
    resumed = sum(c.resumed for c in cells)
    document = _clean(
        {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "clock_epoch_unix": EPOCH_UNIX,
            "environment": env,
            "matrix": matrix,
            "model": model.__dict__ if model else None,
            "measurement": {
                "rounds": max((c.rounds for c in cells), default=0),
                "radix": spec.load.radix,
                "traced_cells": traced,
                "rules": rules,
                "resumed_cells": resumed,
            },
            "cells": [c.to_json() for c in cells],
            "engines": engine_comparison(
                cells,
                [e.name for e in spec.engine_list],
                spec.load.interleave_engines,
                spec.stats.confidence,
                spec.stats.bootstrap,
                [e.name for e in spec.engine_list if e.control],
            ),
            "parity": stages.get("parity", {"status": "not_configured"}),
            "determinism": stages.get("determinism", {"status": "not_configured"}),
            "gates": {"status": "none", "results": []},
            "targets": {"status": "none", "results": []},
            "summary": {
                "cells": len(cells),
                "ok": sum(c.status == "ok" for c in cells),
                "failed": sum(c.status == "failed" for c in cells),
            },
        }
    )
    # built whole: no key is absent (``interrupted`` and ``files`` are written when set)
    return dataclasses.replace(
        Report.from_json(document), interrupted=interrupted, absent=frozenset()
    )


def write_records(records: list[Record], out_dir: Path) -> list[str]:
    """records.csv (and records.parquet with pyarrow); returns the file names written."""
    rows = [r.row() for r in records]
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with open(out_dir / "records.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    written = ["records.csv"]
    try:
        import pandas as pd
        import pyarrow  # noqa: F401
    except ImportError:
        return written
    pd.DataFrame(rows, columns=columns).to_parquet(out_dir / "records.parquet", index=False)
    return written + ["records.parquet"]


def write_summary(report: Report, out_dir: Path) -> None:
    """summary.csv: one row per cell, the key metrics' median, interval and CV."""
    params: list[str] = []
    for c in report.cells:
        params += [k for k in c.params if k not in params]
    names = list(KEY_METRICS) + ["invalid_rate", "duplicate_rate", "beams_mean"]
    for c in report.cells:
        names += [m for m in c.metrics if m not in names]
    hf_cols = ["hf_status", "hf_ms_per_request", "hf_qps", "hf_speedup", "hf_latency_ratio"]
    header = ["id", *params, "status", "rounds"]
    for m in names:
        header += [m, f"{m}_ci95_low", f"{m}_ci95_high", f"{m}_cv"]
    header += hf_cols
    with open(out_dir / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for c in report.cells:
            row = [c.id, *[c.params.get(p, "") for p in params], c.status, c.rounds]
            for m in names:
                s = c.metrics.get(m)
                row += [s.median, s.ci95_low, s.ci95_high, s.cv] if s else [None] * 4
            hf = c.hf
            row += [
                hf.get("status"),
                hf.get("hf_ms_per_request"),
                hf.get("hf_qps"),
                hf.get("speedup"),
                hf.get("latency_ratio"),
            ]
            w.writerow(["" if v is None else v for v in row])


def write_report(report: Report, results: list[CellResult], out_dir: Path) -> Report:
    """Write every report file into ``out_dir``; returns the report as written (its
    ``files`` named)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records = [r for res in results for r in res.records]
    files = write_records(records, out_dir)
    report = dataclasses.replace(
        report, files=["report.json", *files, "summary.csv", "REPORT.md", "report.html"]
    )
    write_documents(report, records, out_dir)
    return report


def write_documents(report: Report, records: list[Record], out_dir: Path) -> None:
    """report.json, summary.csv, REPORT.md and report.html of a report (with ``records``, the
    run's requests, for the HTML's plots; a report re-rendered from its report.json has
    none)."""
    (out_dir / "report.json").write_text(
        json.dumps(_clean(report.to_json()), indent=1, default=str)
    )
    write_summary(report, out_dir)
    write_markdown(report, out_dir / "REPORT.md")
    write_html(report, records, out_dir / "report.html")
