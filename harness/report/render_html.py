"""report.html: the report's tables and sections as one HTML page, with the plots inline."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from harness.load.client import Record
from harness.report.model import Report, as_report
from harness.report.plots import all_plots
from harness.report.render import (
    cells_table,
    gates_table,
    header_lines,
    quality_table,
    stage_blocks,
)
from harness.report.render_quality import quality_html
from harness.report.render_sections import TARGETS_NOTE, extra_tables, targets_table
from harness.report.render_stages import Table, trace_blocks


def paragraphs(text: str, limit: int = 400) -> list[str]:
    """A note as paragraphs: its blank-line breaks, and a paragraph longer than ``limit``
    characters cut between sentences (a sentence end before a capital) into parts of about
    ``limit``, so that a long note reads as paragraphs, not one block."""
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        part = ""
        for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z])", " ".join(block.split())):
            if part and len(part) + 1 + len(sentence) > limit:
                out.append(part)
                part = sentence
            else:
                part = f"{part} {sentence}" if part else sentence
        if part:
            out.append(part)
    return out


def _ps(text: str) -> str:
    return "".join(f"<p>{html.escape(p)}</p>" for p in paragraphs(text))


def _breakable(text: str) -> str:
    """Escaped text that may wrap after a comma before a name: a cell id
    (``engine,beam_width=32,...``) is one word otherwise, and would hold its column, and the
    table, wider than the page (numbers and SIDs such as ``1,2,9`` stay whole)."""
    return re.sub(r",(?=[A-Za-z_])", ",<wbr>", html.escape(text))


def _html_table(t: Table, rich: dict[int, list[list[str]]] | None = None) -> str:
    """A table in a horizontally scrolling container (never wider than the page: a wide table
    scrolls, no column is cut); ``rich[column][row]``: that cell's text as paragraphs."""
    head, rows = t
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)

    def cell(i: int, j: int, x: object) -> str:
        texts = (rich or {}).get(j)
        if texts is not None and texts[i]:
            return "<td>" + "".join(f"<p>{html.escape(p)}</p>" for p in texts[i]) + "</td>"
        return f"<td>{_breakable(str(x))}</td>"

    body = "".join(
        "<tr>" + "".join(cell(i, j, x) for j, x in enumerate(r)) + "</tr>"
        for i, r in enumerate(rows)
    )
    return f"<div class='wide'><table><tr>{th}</tr>{body}</table></div>"


_CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;"
    "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;"
    "vertical-align:top;overflow-wrap:break-word}td{max-width:48em}td p{margin:0 0 .3em;min-width:18em}"
    "th{background:#eee}pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}"
    ".wide{max-width:100%;overflow-x:auto;margin-bottom:1em}img,svg{max-width:100%;height:auto}"
    "p{max-width:60em}#verdict{border:2px solid #888;padding:.2em 1em 1em;margin-bottom:1.5em}"
)


def _cells_table(report: Report) -> str:
    """The cells table, each cell's notes (or its error) as paragraphs of their own."""
    table = cells_table(report)
    notes = [c.notes or ([c.error] if c.status != "ok" and c.error else [])
             for c in report.cells]  # fmt: skip
    return _html_table(table, {table[0].index("notes"): notes})


def verdict_parts(report: Report) -> list[str]:
    """The page's first section: the gates and the targets (what the run concluded), with the
    cells that ran and failed, before any detail."""
    gates, targets, s = report.gates, report.targets, report.summary
    parts = [
        "<section id='verdict'><h2>Verdict</h2><ul>",
        f"<li>gates: <b>{html.escape(str(gates.status))}</b></li>",
        f"<li>targets: <b>{html.escape(str(targets.status))}</b></li>",
    ]
    if "summary" not in report.absent:
        parts.append(f"<li>cells: {s.ok} ok, {s.failed} failed of {s.cells}</li>")
    parts.append("</ul>")
    if gates.results:
        parts += ["<h3>Gates</h3>", _html_table(gates_table(gates))]
    table = targets_table(report)
    if table:
        parts += ["<h3>Targets</h3>", _ps(TARGETS_NOTE), _html_table(table)]
    return parts + ["</section>"]


def write_html(report: Report | dict, records: list[Record], path: Path) -> None:
    """report.html: the verdict first (gates, targets), then how the run measured, the cells
    and every other section; tables scroll inside the page, long notes are paragraphs."""
    report = as_report(report)
    name = html.escape(report.name)
    parts = [
        f"<html><head><meta charset='utf-8'><title>{name}</title><style>{_CSS}</style>"
        f"</head><body><h1>flashrec-bench: {name}</h1>"
    ]
    parts += verdict_parts(report) + ["<ul>"]
    parts += [f"<li>{html.escape(x)}</li>" for x in header_lines(report)] + ["</ul>"]
    parts += (
        ["<h2>How it was measured</h2><ul>"]
        + [f"<li>{html.escape(r)}</li>" for r in report.measurement.rules]
        + ["</ul>"]
    )
    parts += ["<h2>Cells</h2>", _cells_table(report)]
    q = quality_table(report)
    if q:
        parts += ["<h2>Quality</h2>", _html_table(q)]
    parts += quality_html(report, _html_table)
    shown = targets_table(report)  # with the verdict at the top
    for title, table, note in extra_tables(report):
        if shown is not None and table == shown:
            continue
        parts += [f"<h2>{html.escape(title)}</h2>{_ps(note)}", _html_table(table)]
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
    for c in report.cells:
        if c.status == "failed":
            parts += [
                f"<h2>Failed: {html.escape(c.id)}</h2>{_ps(c.error)}"
                f"<pre>{html.escape(c.log_tail)}</pre>"
            ]
    for stage in ("parity", "determinism"):
        line, blocks = stage_blocks(report, stage)
        parts.append(f"<h2>{stage.title()}</h2><p>{html.escape(line)}</p>")
        for title, table in blocks:
            parts += [f"<h3>{html.escape(title)}</h3>", _html_table(table)]
    parts.append("</body></html>")
    path.write_text("\n".join(parts))
