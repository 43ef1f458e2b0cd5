"""The report's stage and trace sections as tables: parity, determinism, traced rounds.

Each ``*_blocks`` function turns one section of report.json into ``(title, table)`` blocks
(``table`` = header, rows), which REPORT.md and report.html lay out like every other table;
:func:`trace_lines` is the Markdown list of the traced rounds (the HTML shows its per-file
details as a table).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from harness.determinism.stephash import divergence_words, verdict_words, where_words
from harness.report.model import Report, as_report

Table = tuple[list[str], list[list[str]]]
Block = tuple[str, Table]


def _num(x: Any, fmt: str = ".4g") -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return "-" if x is None else str(x)
    return format(x, fmt)


def stage_line(stage: dict | None) -> str:
    """One line for a stage's outcome: status, time, why it did not run, where its details are."""
    if not stage:
        return "not configured"
    parts = [str(stage.get("status", "?"))]
    for key in ("error", "reason"):
        if stage.get(key):
            parts.append(str(stage[key]))
    if stage.get("duration_s") is not None:
        parts.append(f"{stage['duration_s']} s")
    if stage.get("details"):
        parts.append(f"details: {stage['details']}")
    return "; ".join(parts)


def _pairs(d: dict, skip: tuple[str, ...] = ()) -> list[list[str]]:
    """``[key, value]`` rows of a flat-ish dict (nested values shown compactly)."""
    rows = []
    for k, v in d.items():
        if k in skip:
            continue
        if isinstance(v, dict):
            v = ", ".join(f"{a}={b}" for a, b in v.items()) or "-"
        elif isinstance(v, list):
            v = ", ".join(map(str, v)) or "-"
        rows.append([str(k), _num(v)])
    return rows


# --------------------------------------------------------------------------- parity

PARITY_COLUMNS = ("cases", "errors", "exact", "exact_rate", "top1_agreement", "overlap_mean",
                  "overlap_min", "spearman_min", "max_score_diff")  # fmt: skip


def _diff_rows(text: str) -> Table | None:
    """A parity diff table (:func:`harness.parity.compare.diff_table`'s fixed-width text) as
    rows; None when a line does not have that layout."""
    lines = text.splitlines()
    rows = []
    for line in lines[2:]:
        if line.startswith("  ..."):
            rows.append(["", line.strip(), "", "", "", ""])
            continue
        rank = line[2:6].strip()
        if not rank.isdigit():
            return None
        mark = {"!": "different beam", "~": "score differs"}.get(line[:1], "")
        cols = [line[8:42], line[43:53], line[56:90], line[91:101]]
        rows.append([rank, *(c.strip() for c in cols), mark])
    head = ["rank", "reference", "score", "candidate", "score", ""]
    return head, rows


TABLE_COLUMNS = ("cases", "errors", "top1_agreement", "overlap_mean", "overlap_min",
                 "spearman_mean", "spearman_min", "max_score_diff", "exact_rate")  # fmt: skip
RULE_COLUMNS = ("candidate", "than", "n", "metric", "value", "other", "margin", "noise")


def _rule_result(check: dict) -> str:
    if not check.get("passed"):
        return "FAIL"
    return "pass (worse within noise)" if check.get("within_noise") else "pass"


def _resumed(c: dict) -> list[str]:
    """A candidate whose answers an earlier, interrupted run saved (``--resume``) says so."""
    if not c.get("resumed"):
        return []
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.get("saved_at") or 0))
    return [f"answers of the run of {when}, read back by --resume"]


def _candidate_blocks(parity: dict) -> list[Block]:
    """The ``candidates:`` form: one row per candidate x n against the reference, the
    no_worse_than checks, and each candidate's verdict."""
    out: list[Block] = []
    ref = parity.get("reference") or {}
    title = f"against the {ref.get('dtype') or parity.get('reference_dtype', '?')} reference"
    rows = [[str(r.get("candidate")), str(r.get("precision")), str(r.get("n")),
             *(_num(r.get(k)) for k in TABLE_COLUMNS)]
            for r in parity.get("table") or []]  # fmt: skip
    if rows:
        out.append((title, (["candidate", "precision", "n", *TABLE_COLUMNS], rows)))
    cols = ("n", "cases", "errors", "top1_agreement", "overlap_mean", "max_score_diff")
    against = [[str(r.get("candidate")), str(r.get("against")), *(_num(r.get(k)) for k in cols)]
               for r in parity.get("against") or []]  # fmt: skip
    if against:  # a candidate (a peer engine) against another one (ours)
        out.append(("candidate against candidate", (["candidate", "against", *cols], against)))
    rules = [[*(_num(c.get(k)) for k in RULE_COLUMNS), _rule_result(c)]
             for c in parity.get("rules") or []]  # fmt: skip
    if rules:
        out.append(("no_worse_than", ([*RULE_COLUMNS, "result"], rules)))
    verdicts = [[str(c.get("name")), str(c.get("kind")), str(c.get("status")),
                 "yes" if c.get("gate") else "no (reported)",
                 "; ".join(_resumed(c) + (c.get("failures") or c.get("notes") or [])) or "-"]
                for c in parity.get("candidates") or []]  # fmt: skip
    if verdicts:
        out.append(("candidates", (["candidate", "kind", "status", "gated", "findings"], verdicts)))
    return out


def parity_blocks(parity: dict) -> list[Block]:
    """The parity stage: its summary (overall and per protocol) or, with several candidates,
    the candidate x n table and rule checks; thresholds, failures and the first differing
    beams of the worst cases."""
    out: list[Block] = _candidate_blocks(parity)
    summary = parity.get("summary")
    if summary:
        rows = [["all", *(_num(summary.get(k)) for k in PARITY_COLUMNS)]]
        for proto, s in (parity.get("by_protocol") or {}).items():
            rows.append([proto, *(_num(s.get(k)) for k in PARITY_COLUMNS)])
        out.append(("summary", (["protocol", *PARITY_COLUMNS], rows)))
    keys = ("precision", "reference_dtype", "reference", "ns", "prompts", "protocols", "servers")
    settings = {k: parity[k] for k in keys if k in parity}
    settings.update(parity.get("thresholds") or {})
    if settings:
        out.append(("settings and thresholds", (["setting", "value"], _pairs(settings))))
    failures = parity.get("failures") or []
    if failures:
        out.append(
            ("failures", (["#", "failure"], [[str(i + 1), f] for i, f in enumerate(failures)]))
        )
    for text in parity.get("diff_tables") or []:
        table = _diff_rows(text)
        title = text.splitlines()[0] if text else "diff"
        out.append((title, table or (["diff"], [[line] for line in text.splitlines()[1:]])))
    return out


# --------------------------------------------------------------------------- determinism

DRIFT_COLUMNS = ("processes", "requests", "errors", "drifting_requests",
                 "requests_with_rank_changes", "top1_changes", "max_score_diff")  # fmt: skip
DRIFT_ROWS = ("index", "n", "process", "rank_changes", "top1_changed", "max_score_diff",
              "bits_only")  # fmt: skip


# the run's yes / no fields (harness/determinism/check.py writes them as booleans)
RUN_FLAGS = (
    ("acceptance", "counts for acceptance (enough distinct requests)"),
    ("strict_concurrent", "concurrent drift fails the run (--strict-concurrent)"),
)


# a localisation's fields said in words (harness.determinism.stephash): no dict shown as such
LOCALISATION_WORDS = {
    "verdicts": ("first divergence", verdict_words),
    "first_divergence_at": ("where", where_words),
    "first_divergence": (
        "drifting requests explained",
        lambda rows: "; ".join(divergence_words(e) for e in rows) or "-",
    ),
}


def _localisation(loc: dict) -> list[list[str]]:
    """A localisation's rows: its counts and lists as they are, its verdicts in words."""
    rows = _pairs(loc, skip=tuple(LOCALISATION_WORDS))
    for key, (label, words) in LOCALISATION_WORDS.items():
        if key in loc:
            rows.append([label, words(loc[key])])
    return rows


def determinism_blocks(det: dict) -> list[Block]:
    """The determinism stage: each mode's drift counts, its drifting requests (first 20), the
    localisation of any drift, and the run's settings."""
    out: list[Block] = []
    modes = {k: v for k, v in det.items() if isinstance(v, dict) and "drifting_requests" in v}
    if modes:
        rows = [[m, *(_num(v.get(k)) for k in DRIFT_COLUMNS)] for m, v in modes.items()]
        out.append(("processes compared", (["mode", *DRIFT_COLUMNS], rows)))
    drifting = [[m, *(_num(r.get(k)) for k in DRIFT_ROWS)]
                for m, v in modes.items() for r in (v.get("drifting") or [])[:20]]  # fmt: skip
    if drifting:
        out.append(("drifting requests", (["mode", *DRIFT_ROWS], drifting)))
    for mode, loc in (det.get("localisation") or {}).items():
        if isinstance(loc, dict) and loc:
            out.append((f"localisation ({mode})", (["field", "value"], _localisation(loc))))
    run = [[label, "yes" if det[key] else "no"] for key, label in RUN_FLAGS
           if isinstance(det.get(key), bool)]  # fmt: skip
    if run:
        out.append(("run", (["field", "value"], run)))
    if det.get("config"):
        out.append(("settings", (["setting", "value"], _pairs(det["config"]))))
    return out


# --------------------------------------------------------------------------- traces


def _file_details(f: dict) -> list[tuple[str, list[str]]]:
    """What a trace file's summary says beyond its headline, as (line, sub-lines)."""
    out: list[tuple[str, list[str]]] = []
    gemm = f.get("gemm")
    fp8 = (
        gemm
        if isinstance(gemm, str)
        else (f"{gemm['is_fp8']} (FP8 share of GEMM time {gemm['fp8_fraction']})")
    )
    out.append(
        (
            f"device {f['device']}; GPU busy {f['gpu_busy_fraction']}; "
            f"CUDA-graph decode {f['decode_graph_replay']} "
            f"({f.get('decode_graph_launches', 'n/a')} of {f['cuda_graph_launches']} graph "
            f"launches inside decode spans); FP8 GEMMs: {fp8}",
            [],
        )
    )
    tops = f["top_kernels"] if isinstance(f["top_kernels"], list) else f["top_cpu_ops"]
    label = "kernels" if isinstance(f["top_kernels"], list) else "CPU ops"
    out.append(
        (
            f"top {label}: "
            + ", ".join(f"{k['name'][:60]} {k['total_us'] / 1000:.1f} ms" for k in tops[:5]),
            [],
        )
    )
    kinds = f.get("gpu_time_by_class")
    if isinstance(kinds, list) and kinds:
        out.append(
            (
                "GPU time by kind: "
                + ", ".join(
                    f"{k['name']} {k['total_us'] / 1000:.1f} ms ({k['pct']:.1f}%)" for k in kinds
                ),
                [],
            )
        )
    per = f.get("gpu_ms_per_request")
    if isinstance(per, (int, float)):
        parts = ", ".join(
            f"{name} {ms:.2f}" for name, ms in (f.get("gpu_ms_per_request_by_class") or {}).items()
        )
        n, counted = f["requests_in_window"], f.get("requests_counted") or 0
        over = (
            f"the GPU's work between two of the {n} answers inside the traced window at the "
            f"same point of their rhythm, over the {counted:g} answered in between"
            if f.get("estimate") == "between answers"
            else f"the traced window's work over the {counted:.2f} requests whose engine spans "
            "it holds"
        )
        out.append(
            (
                f"GPU work per request: {per:.2f} ms ({parts}), {over}; with the GPU never idle "
                f"that is {f['qps_at_full_busy']:.1f} QPS",
                [],
            )
        )
    elif f.get("requests_in_window") == 0:
        out.append(("GPU work per request: no request was answered inside the traced window", []))
    elif "requests_in_window" in f:  # answers inside, but under one request's work to share
        out.append(
            (
                f"GPU work per request: none; the traced window holds {f['requests_in_window']} "
                "answers but under one request's engine time",
                [],
            )
        )
    if f.get("annotations"):
        spans = ", ".join(
            f"{k['name']} x{k['count']} {k['total_us'] / 1000:.1f} ms" for k in f["annotations"][:6]
        )
        out.append((f"spans: {spans}", []))
    if isinstance(f["largest_gaps_us"], list) and f["largest_gaps_us"]:
        gaps = ", ".join(
            f"{g['gap_us']:.0f} us after {g['before'][:40]}" for g in f["largest_gaps_us"][:3]
        )
        out.append((f"largest gaps: {gaps}", []))
    over = f.get("gaps_over")
    if isinstance(over, dict) and over["count"]:
        out.append(
            (
                f"GPU gaps over {over['threshold_us'] / 1000:.1f} ms: {over['count']}, "
                f"{over['total_us'] / 1000:.1f} ms together ({over['fraction']:.1%} of the "
                "window)",
                [],
            )
        )
    if isinstance(f.get("gpu_time_by_span"), list) and f["gpu_time_by_span"]:
        subs = []
        for r in f["gpu_time_by_span"]:
            kernels = "; ".join(
                f"{k['name'][:50]} {k['total_us'] / 1000:.1f} ms ({k['count']} x "
                f"{k['mean_us']:.0f} us, max {k['max_us']:.0f}"
                + (f", {k['registers']} regs" if k.get("registers") else "")
                + ")"
                for k in r["top"]
            )
            kinds = ", ".join(f"{k['name']} {k['pct']:.0f}%" for k in r.get("by_class", []))
            times = f" x{r['spans']}" if r.get("spans") else ""
            subs.append(
                f"{r['span']}{times} {r['gpu_us'] / 1000:.1f} ms ({r['pct']:.1f}% of GPU "
                f"time, {r['ops']} ops): {kernels}" + (f"; by kind: {kinds}" if kinds else "")
            )
        out.append(("GPU time by span (its top kernels: launches x mean, longest):", subs))
    stalls = f.get("host_stalls")
    if isinstance(stalls, dict):
        calls = ", ".join(
            f"{k} x{v['count']} {v['total_us'] / 1000:.1f} ms" for k, v in stalls.items()
        )
        out.append((f"allocator calls and syncs: {calls or 'none'}", []))
    if f.get("decode_steps"):
        interval = f.get("decode_interval_us_mean")
        duty = f.get("decode_duty")
        out.append(
            (
                f"decode: {f['decode_steps']} steps, {f['decode_span_us_mean'] / 1000:.2f}"
                " ms each on the host, one every "
                + (f"{interval / 1000:.2f} ms" if isinstance(interval, float) else "n/a")
                + (f" (duty cycle {duty:.0%})" if isinstance(duty, float) else ""),
                [],
            )
        )
    if f.get("limit"):
        out.append((f"**limit: {f['limit']}**", []))
        if f.get("gpu_idle_by_host"):
            idle = ", ".join(
                f"{r['span']} {r['idle_us'] / 1000:.1f} ms ({r['pct_of_window']:.1f}%)"
                for r in f["gpu_idle_by_host"]
            )
            out.append((f"GPU idle while the host is in: {idle}", []))
        if isinstance(f.get("gpu_idle_by_python"), list) and f["gpu_idle_by_python"]:
            frames = ", ".join(
                f"{r['frame'][:70]} {r['idle_us'] / 1000:.1f} ms"
                for r in f["gpu_idle_by_python"][:5]
            )
            out.append((f"GPU idle by Python frame: {frames}", []))
    out.extend(_span_lines(f.get("span_breakdown") or []))
    return out


def _span_lines(rows: list[dict]) -> list[tuple[str, list[str]]]:
    """The host spans a matrix asked to break down (``trace.spans``): per span its host time,
    its direct children, its own time and the GPU work it launched; a span the trace does not
    hold is said, not left out."""
    out: list[tuple[str, list[str]]] = []
    for r in rows:
        if not r.get("count"):
            out.append((f"host span {r['span']}: not in the trace", []))
            continue
        kids = [
            f"{k['name'][:70]} {k['total_us'] / 1000:.2f} ms (x{k['count']}, {k['pct'] or 0:.1f}%)"
            for k in r.get("children", [])
        ]
        out.append(
            (
                f"host span {r['span']} x{r['count']}: {r['host_us_mean'] / 1000:.2f} ms each "
                f"on the host, {r['self_us'] / 1000:.1f} ms of {r['host_us'] / 1000:.1f} in "
                f"its own code; it launched {r['gpu_us'] / 1000:.1f} ms of GPU work "
                f"({r['gpu_ops']} ops). Its direct children by host time:",
                kids,
            )
        )
    return out


def _traced(report: Report | dict) -> list[tuple[dict, dict]]:
    report = as_report(report)
    return [(c, c.trace) for c in report.cells if c.trace]


def trace_lines(report: Report | dict) -> list[str]:
    """REPORT.md's list of the traced rounds: each cell's trace, its files and their details."""
    report = as_report(report)
    out = []
    for c, t in _traced(report):
        out.append(
            f"**{c.id}**: {t.get('status')} after {t.get('waited_s', '-')} s "
            f"(num_steps {t.get('num_steps')}, dir `{t.get('dir')}`)"
        )
        for f in t.get("files", []):
            out.append(
                f"- `{Path(f['path']).name}`: {f['size_bytes']:,} bytes, "
                f"{f.get('steps', '-')} steps, {f.get('events', '-')} events"
            )
            if "error" in f:
                out.append(f"  - unreadable: {f['error']}")
                continue
            for line, subs in _file_details(f):
                out += [f"  - {line}"] + [f"    - {s}" for s in subs]
        implied = c.metrics.get("gpu_busy_implied")  # the traced work at the measured QPS
        if implied is not None and implied.median is not None:
            lo, hi = (
                f"{x:.1%}" if x is not None else "-" for x in (implied.ci95_low, implied.ci95_high)
            )
            out.append(
                "- GPU busy implied in the measured rounds (traced GPU work per request x "
                f"their QPS): {implied.median:.1%} [{lo}, {hi}]"
            )
    return out


def trace_blocks(report: Report | dict) -> list[Block]:
    """report.html's traced rounds: one row per traced cell, one per trace file (its headline
    numbers), and the files' details."""
    report = as_report(report)
    cells, files, details = [], [], []
    for c, t in _traced(report):
        got = t.get("files", [])
        cells.append(
            [c.id, str(t.get("status")), _num(t.get("waited_s")), _num(t.get("num_steps")),
             str(len(got)), str(t.get("dir"))]
        )  # fmt: skip
        for f in got:
            name = Path(f["path"]).name
            gemm = f.get("gemm")
            fp8 = gemm.get("fp8_fraction") if isinstance(gemm, dict) else gemm
            files.append(
                [c.id, name, f"{f['size_bytes']:,}", _num(f.get("steps")),
                 _num(f.get("events")), str(f.get("device", "-")),
                 _num(f.get("gpu_busy_fraction")), _num(f.get("decode_graph_replay")),
                 _num(fp8), str(f.get("limit") or f.get("error") or "")]
            )  # fmt: skip
            if "error" not in f:
                details += [
                    [c.id, name, line.strip("*") + "".join(f"; {s}" for s in subs)]
                    for line, subs in _file_details(f)
                ]
    if not cells:
        return []
    out: list[Block] = [
        ("traced rounds", (["cell", "status", "waited s", "num_steps", "files", "dir"], cells))
    ]
    head = ["cell", "file", "bytes", "steps", "events", "device", "GPU busy",
            "CUDA-graph decode", "FP8 share of GEMMs", "limit / error"]  # fmt: skip
    if files:
        out.append(("trace files", (head, files)))
    if details:
        out.append(("trace details", (["cell", "file", "detail"], details)))
    return out
