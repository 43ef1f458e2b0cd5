"""report.html: the report's tables and sections as one HTML page, with the plots inline."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from harness.load.client import Record
from harness.report.plots import all_plots
from harness.report.render import (
    cells_table,
    gates_table,
    header_lines,
    quality_table,
    stage_blocks,
)
from harness.report.render_quality import quality_html
from harness.report.render_sections import extra_tables
from harness.report.render_stages import Table, trace_blocks


def _html_table(t: Table) -> str:
    head, rows = t
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


_CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;"
    "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}"
    "th{background:#eee}pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}"
)


def write_html(report: dict, records: list[Record], path: Path) -> None:
    name = html.escape(report["matrix"].get("name") or "matrix")
    parts = [
        f"<html><head><meta charset='utf-8'><title>{name}</title><style>{_CSS}</style>"
        f"</head><body><h1>flashrec-bench: {name}</h1><ul>"
    ]
    parts += [f"<li>{html.escape(x)}</li>" for x in header_lines(report)] + ["</ul>"]
    parts += (
        ["<h2>How it was measured</h2><ul>"]
        + [f"<li>{html.escape(r)}</li>" for r in report["measurement"]["rules"]]
        + ["</ul>"]
    )
    parts += ["<h2>Cells</h2>", _html_table(cells_table(report))]
    q = quality_table(report)
    if q:
        parts += ["<h2>Quality</h2>", _html_table(q)]
    parts += quality_html(report, _html_table)
    for title, table, note in extra_tables(report):
        parts += [f"<h2>{html.escape(title)}</h2><p>{html.escape(note)}</p>", _html_table(table)]
    plots = all_plots(report, records)
    parts.append(
        "<h2>Plots</h2>"
        if plots
        else "<h2>Plots</h2><p>none (matplotlib missing or nothing to plot)</p>"
    )
    for title, png in plots:
        b64 = base64.b64encode(png).decode()
        parts.append(f"<h3>{html.escape(title)}</h3><img src='data:image/png;base64,{b64}'/>")
    parts.append("<h2>Traces</h2>")
    traces = trace_blocks(report)
    parts += [] if traces else ["<p>no traced cells</p>"]
    for title, table in traces:
        parts += [f"<h3>{html.escape(title)}</h3>", _html_table(table)]
    for c in report["cells"]:
        if c["status"] == "failed":
            parts += [
                f"<h2>Failed: {html.escape(c['id'])}</h2><p>{html.escape(c['error'])}</p>"
                f"<pre>{html.escape(c['log_tail'])}</pre>"
            ]
    for stage in ("parity", "determinism"):
        line, blocks = stage_blocks(report, stage)
        parts.append(f"<h2>{stage.title()}</h2><p>{html.escape(line)}</p>")
        for title, table in blocks:
            parts += [f"<h3>{html.escape(title)}</h3>", _html_table(table)]
    parts.append(f"<h2>Gates: {html.escape(report['gates']['status'])}</h2>")
    if report["gates"]["results"]:
        parts.append(_html_table(gates_table(report)))
    parts.append("</body></html>")
    path.write_text("\n".join(parts))
