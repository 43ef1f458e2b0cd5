"""harness.report.render_md / render_html / render_stages: the parity, determinism and trace
sections of report.html and REPORT.md are tables, not JSON or Markdown pasted into <pre>
blocks."""

from __future__ import annotations

import html
import re

from harness.parity.compare import Beam, Case, Thresholds, compare_beams, parity_result
from harness.report.render_html import write_html
from harness.report.render_md import write_markdown
from harness.report.render_stages import determinism_blocks, parity_blocks, trace_blocks


def _parity() -> dict:
    """A failing parity result made by the parity stage's own code: beam 2 differs, beam 4's
    score moved."""
    ref = [Beam((1, 2, i), -0.1 * i) for i in range(6)]
    cand = [Beam((1, 2, 9 if i == 2 else i), -0.1 * i + (1e-3 if i == 4 else 0)) for i in range(6)]
    case = Case("chat", 0, 6, ref=ref, cand=cand)
    case.metrics = compare_beams(ref, cand)
    th = Thresholds(exact=True, max_score_diff=1e-4, min_top1=1, min_overlap=1)
    return {**parity_result([case], th, "float32", ["chat"]), "duration_s": 1.5}


DETERMINISM = {
    "status": "fail",
    "passed": False,
    "duration_s": 9.0,
    "config": {"requests": 8, "processes": 2, "ns": [1, 4]},
    "sequential": {
        "processes": 2, "requests": 8, "errors": 0, "drifting_requests": 1,
        "requests_with_rank_changes": 1, "top1_changes": 0, "max_score_diff": 2e-6,
        "drifting": [{"index": 3, "n": 4, "process": 1, "rank_changes": 1, "top1_changed": False,
                      "max_score_diff": 2e-6, "bits_only": False}],
    },
    "localisation": {"sequential": {"verdicts": {"first_step": 2}, "reproduced": [3]}},
    "strict_concurrent": False,
    "acceptance": False,
}  # fmt: skip

TRACE_FILE = {
    "path": "/t/cell-1.trace.json.gz", "size_bytes": 1234, "events": 99, "steps": 7,
    "device": "cpu", "gpu_busy_fraction": "n/a", "largest_gaps_us": "n/a",
    "cuda_graph_launches": "n/a", "decode_graph_replay": "n/a", "top_kernels": "n/a",
    "gemm": "n/a", "top_cpu_ops": [{"name": "aten::matmul", "total_us": 2500.0}],
    "annotations": [{"name": "flashrec.decode", "count": 6, "total_us": 4200.0}],
}  # fmt: skip


def _report() -> dict:
    cell = {
        "id": "e,beam_width=6", "params": {"engine": "e"}, "status": "ok", "rounds": 3,
        "metrics": {}, "notes": [], "error": None, "log_tail": "", "baseline": {},
        "excluded_requests": {"count": 0, "reasons": {}},
        "trace": {"status": "complete", "waited_s": 1.0, "num_steps": 7, "dir": "/t",
                  "files": [TRACE_FILE]},
    }  # fmt: skip
    return {
        "matrix": {"name": "r"},
        "run_id": "r1",
        "created": "2026-01-01T00:00:00+00:00",
        "environment": {},
        "measurement": {"rules": ["fixed load"]},
        "cells": [cell],
        "parity": _parity(),
        "determinism": DETERMINISM,
        "gates": {"status": "none", "results": []},
        "targets": {"status": "none", "results": []},
    }


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def test_stage_and_trace_sections_are_tables(tmp_path):
    report = _report()
    write_html(report, [], tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    for title, end in (("<h2>Traces", "<h2>Parity"), ("<h2>Parity", "<h2>Determinism"),
                       ("<h2>Determinism", "</body>")):  # fmt: skip
        part = _section(page, title, end)
        assert "<pre>" not in part and "<table>" in part, part[:300]
        assert "{" not in re.sub(r"<[^>]+>", "", part), "no JSON left in " + title
    parity = _section(page, "<h2>Parity", "<h2>Determinism")
    assert "<p>fail; 1.5 s</p>" in parity
    # the diff of the worst case, rank by rank, with the differing ranks marked
    assert "<td>2</td><td>1,2,2</td><td>-0.200000</td><td>1,2,9</td>" in parity
    assert "different beam" in parity and "score differs" in parity
    assert "ranked beams differ from rank 2" in parity  # the failures, one per row
    det = _section(page, "<h2>Determinism", "</body>")
    assert "<td>sequential</td><td>2</td><td>8</td><td>0</td><td>1</td>" in det
    assert "localisation (sequential)" in det
    assert "<td>first divergence</td><td>2 requests with verdict &#x27;first_step&#x27;</td>" in det
    traces = _section(page, "<h2>Traces", "<h2>Parity")
    assert "<td>cell-1.trace.json.gz</td><td>1,234</td><td>7</td><td>99</td><td>cpu</td>" in traces
    assert "top CPU ops: aten::matmul 2.5 ms" in traces
    # REPORT.md: the same tables
    write_markdown(report, tmp_path / "REPORT.md")
    md = (tmp_path / "REPORT.md").read_text()
    assert "```json" not in md and "| 2 | 1,2,2 | -0.200000 | 1,2,9 |" in md
    assert "| sequential | 2 | 8 | 0 | 1 | 1 | 0 | 2e-06 |" in md


def test_sections_that_did_not_run_say_so():
    assert parity_blocks({"status": "not_configured"}) == []
    assert determinism_blocks({"status": "error", "error": "no model"}) == []
    assert trace_blocks({"cells": [{"id": "c", "trace": None}]}) == []
    # a diff table in a layout the parser does not know is kept line by line, not dropped
    odd = {"status": "fail", "diff_tables": ["case 1\nheader\nsomething else"]}
    ((title, (head, rows)),) = parity_blocks(odd)
    assert title == "case 1" and rows == [["header"], ["something else"]]


def test_readme_excerpt_is_the_reports_own_table():
    """README's report excerpt copies REPORT.md's cells table as the report writes it: every
    column (the notes included) and every row, so no noisy cell is left out."""
    from bench_helpers import REPO

    readme = (REPO / "README.md").read_text()
    source = re.search(r"From `(reports/[^`]+/REPORT\.md)`", readme).group(1)
    excerpt = [
        ln for ln in readme.split("## A real report", 1)[1].splitlines() if ln.startswith("|")
    ]
    report = (REPO / source).read_text().split("## Cells", 1)[1].split("\n## ", 1)[0]
    table = [ln for ln in report.splitlines() if ln.startswith("|")]
    assert excerpt == table and excerpt[0].endswith("| notes |")


def test_determinism_run_flags_as_written_by_the_run(tmp_path):
    """``acceptance`` and ``strict_concurrent`` are booleans in determinism.json (a run of 120
    requests is True): a row each, in both formats."""
    det = {**DETERMINISM, "status": "pass", "passed": True, "acceptance": True}
    blocks = dict(determinism_blocks(det))
    assert blocks["run"][1] == [
        ["counts for acceptance (enough distinct requests)", "yes"],
        ["concurrent drift fails the run (--strict-concurrent)", "no"],
    ]
    report = {**_report(), "determinism": det}
    write_markdown(report, tmp_path / "REPORT.md")
    assert (
        "| counts for acceptance (enough distinct requests) | yes |"
        in (tmp_path / "REPORT.md").read_text()
    )
    write_html(report, [], tmp_path / "report.html")


def _explained() -> list[dict]:
    """62 requests whose replays first differ in a step's outputs (numerics) and one whose
    inputs differ, as the localisation explains them (first_divergence on step hashes)."""
    from harness.determinism import StepHash, first_divergence

    base = [StepHash(0, "prefill", "i0", "o0"), StepHash(1, "decode", "i1", "o1")]
    numerics = [StepHash(0, "prefill", "i0", "o0"), StepHash(1, "decode", "i1", "X")]
    state = [StepHash(0, "prefill", "i0", "o0"), StepHash(1, "decode", "Y", "o1")]
    out = [{"index": i, "processes": [0, 1], **first_divergence(base, numerics)} for i in range(62)]
    return out + [{"index": 62, "processes": [0, 1], **first_divergence(base, state)}]


def test_determinism_localisation_is_said_in_words(tmp_path):
    """The localisation's verdict counts read as words in the console line and in both report
    formats, never as a Python dict ("{'numerics': 62}")."""
    from harness.determinism.check import localisation_line, tally_divergences

    explained = _explained()
    loc = {"replays": 1, "reproduced": list(range(63)), "not_reproduced": [],
           **tally_divergences(explained), "first_divergence": explained[:10]}  # fmt: skip
    line = localisation_line("concurrent", loc, 70)
    assert line == (
        "determinism: concurrent localisation: 63 of 70 drifting requests drifted again in the "
        "step-hash replay; 62 requests first diverged in numerics (equal step inputs, different "
        "outputs); 1 request first diverged in host-side state (a step's inputs differ)"
    )
    det = {**DETERMINISM, "localisation": {"concurrent": loc}}
    rows = dict(dict(determinism_blocks(det))["localisation (concurrent)"][1])
    assert rows["first divergence"] == line.split("replay; ", 1)[1]
    assert rows["where"] == (
        "numerics at step 1 (decode): 62 requests; inputs differ: host-side state at step 1 "
        "(decode): 1 request"
    )
    assert rows["drifting requests explained"].startswith(
        "request 0 (process 0 vs 1): numerics at step 1 (decode); request 1 "
    )
    report = {**_report(), "determinism": det}
    write_markdown(report, tmp_path / "REPORT.md")
    write_html(report, [], tmp_path / "report.html")
    md = _section((tmp_path / "REPORT.md").read_text(), "## Determinism", "## Gates")
    page = _section((tmp_path / "report.html").read_text(), "<h2>Determinism", "</body>")
    for text in (md, html.unescape(re.sub(r"<[^>]+>", "", page))):
        assert "62 requests first diverged in numerics" in text
        assert "{" not in text and "'numerics'" not in text, text
