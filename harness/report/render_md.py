"""REPORT.md: the report's tables and sections as Markdown."""

from __future__ import annotations

from pathlib import Path

from harness.report.model import Report, as_report
from harness.report.render import (
    cells_table,
    gates_table,
    header_lines,
    quality_table,
    stage_blocks,
)
from harness.report.render_quality import quality_md
from harness.report.render_sections import extra_tables
from harness.report.render_stages import Table, trace_lines


def md_table(t: Table) -> list[str]:
    head, rows = t
    esc = [[str(x).replace("|", "\\|").replace("\n", " ") for x in r] for r in rows]
    return (
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        + ["| " + " | ".join(r) + " |" for r in esc]
        + [""]
    )


def write_markdown(report: Report | dict, path: Path) -> None:
    report = as_report(report)
    name = report.name
    lines = [f"# flashrec-bench: {name}", ""] + [f"- {x}" for x in header_lines(report)] + [""]
    lines += ["## How it was measured", ""] + [f"- {r}" for r in report.measurement.rules] + [""]
    lines += ["## Cells", ""] + md_table(cells_table(report))
    q = quality_table(report)
    if q:
        lines += ["## Quality", ""] + md_table(q)
    lines += quality_md(report, md_table)
    for title, table, note in extra_tables(report):
        lines += [f"## {title}", "", note, ""] + md_table(table)
    traces = trace_lines(report)
    lines += ["## Traces", ""] + (traces or ["no traced cells"]) + [""]
    for c in report.cells:
        if c.status == "failed":
            lines += [
                f"## Failed: {c.id}",
                "",
                c.error,
                "",
                "```",
                c.log_tail.rstrip() or "(empty log)",
                "```",
                "",
            ]
    for stage in ("parity", "determinism"):
        line, blocks = stage_blocks(report, stage)
        lines += [f"## {stage.title()}", "", line, ""]
        for title, table in blocks:
            lines += [f"### {title}", ""] + md_table(table)
    lines += [f"## Gates: {report.gates.status}", ""]
    if report.gates.results:
        lines += md_table(gates_table(report.gates))
    path.write_text("\n".join(lines) + "\n")
