"""REPORT.md and report.html from a report dict (the same tables in both)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from harness.client import Record
from harness.plots import all_plots

Table = tuple[list[str], list[list[str]]]


def _num(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _med_ci(m: dict | None, fmt: str = ".2f") -> str:
    if not m:
        return "-"
    return f"{_num(m['median'], fmt)} [{_num(m['ci95_low'], fmt)}, {_num(m['ci95_high'], fmt)}]"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def header_lines(report: dict) -> list[str]:
    env = report["environment"]
    git = env.get("git") or {}
    gpus = ", ".join(g["name"] for g in env.get("gpus") or []) or "none"
    v = env.get("versions") or {}
    return [
        f"run `{report['run_id']}`, created {report['created']}",
        f"git {git.get('commit') or '?'}" + (" (dirty)" if git.get("dirty") else ""),
        f"GPU: {gpus}; driver {env.get('driver') or '-'}; CPUs {env.get('cpu_count')}",
        f"torch {v.get('torch')}, flashinfer {v.get('flashinfer-python')}, triton "
        f"{v.get('triton')}, transformers {v.get('transformers')}",
        f"matrix hash {env.get('matrix_hash')}, model hash {env.get('model_hash')}",
    ]


def cells_table(report: dict) -> Table:
    head = [
        "cell",
        "status",
        "rounds",
        "QPS median [95% CI]",
        "QPS CV",
        "p50 ms",
        "p99 ms",
        "errors",
        "invalid SIDs",
        "excluded",
        "notes",
    ]
    rows = []
    for c in report["cells"]:
        m = c["metrics"]
        rows.append(
            [
                c["id"],
                c["status"],
                str(c["rounds"]),
                _med_ci(m.get("qps")),
                _pct((m.get("qps") or {}).get("cv")),
                _num((m.get("latency_p50_ms") or {}).get("median"), ".1f"),
                _num((m.get("latency_p99_ms") or {}).get("median"), ".1f"),
                _pct((m.get("error_rate") or {}).get("median")),
                _pct((m.get("invalid_rate") or {}).get("median")),
                str(c["excluded_requests"]["count"]),
                "; ".join(c["notes"]) or (c["error"] if c["status"] != "ok" else ""),
            ]
        )
    return head, rows


def quality_table(report: dict) -> Table | None:
    names: list[str] = []
    for c in report["cells"]:
        names += [k for k in c["metrics"] if "@" in k and k not in names]
    if not names:
        return None
    rows = [
        [c["id"], *[_num((c["metrics"].get(n) or {}).get("median"), ".4f") for n in names]]
        for c in report["cells"]
        if c["status"] == "ok"
    ]
    return ["cell", *names], rows


def trace_lines(report: dict) -> list[str]:
    out = []
    for c in report["cells"]:
        t = c.get("trace")
        if not t:
            continue
        out.append(
            f"**{c['id']}**: {t.get('status')} after {t.get('waited_s', '-')} s "
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
            gemm = f.get("gemm")
            fp8 = (
                gemm
                if isinstance(gemm, str)
                else (f"{gemm['is_fp8']} (FP8 share of GEMM time {gemm['fp8_fraction']})")
            )
            out.append(
                f"  - device {f['device']}; GPU busy {f['gpu_busy_fraction']}; "
                f"CUDA-graph decode {f['decode_graph_replay']} "
                f"({f['cuda_graph_launches']} graph launches); FP8 GEMMs: {fp8}"
            )
            tops = f["top_kernels"] if isinstance(f["top_kernels"], list) else f["top_cpu_ops"]
            label = "kernels" if isinstance(f["top_kernels"], list) else "CPU ops"
            out.append(
                f"  - top {label}: "
                + ", ".join(f"{k['name'][:60]} {k['total_us'] / 1000:.1f} ms" for k in tops[:5])
            )
            if f.get("annotations"):
                spans = ", ".join(
                    f"{k['name']} x{k['count']} {k['total_us'] / 1000:.1f} ms"
                    for k in f["annotations"][:6]
                )
                out.append(f"  - spans: {spans}")
            if isinstance(f["largest_gaps_us"], list) and f["largest_gaps_us"]:
                out.append(
                    "  - largest gaps: "
                    + ", ".join(
                        f"{g['gap_us']:.0f} us after {g['before'][:40]}"
                        for g in f["largest_gaps_us"][:3]
                    )
                )
    return out


def gates_table(report: dict) -> Table:
    rows = [
        [
            g["name"],
            g["status"],
            "; ".join(
                f"{c['target']}: {c.get('value', c.get('worse_pct'))}"
                for c in g.get("checks", [])
                if not c["ok"]
            )
            or g.get("reason", ""),
        ]
        for g in report["gates"]["results"]
    ]
    return ["gate", "status", "failing"], rows


def _stage(report: dict, name: str) -> str:
    return json.dumps(report.get(name), indent=1, default=str)[:4000]


# --------------------------------------------------------------------------- markdown


def _md_table(t: Table) -> list[str]:
    head, rows = t
    esc = [[str(x).replace("|", "\\|").replace("\n", " ") for x in r] for r in rows]
    return (
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        + ["| " + " | ".join(r) + " |" for r in esc]
        + [""]
    )


def write_markdown(report: dict, path: Path) -> None:
    name = report["matrix"].get("name") or "matrix"
    lines = [f"# flashrec-bench: {name}", ""] + [f"- {x}" for x in header_lines(report)] + [""]
    lines += (
        ["## How it was measured", ""] + [f"- {r}" for r in report["measurement"]["rules"]] + [""]
    )
    lines += ["## Cells", ""] + _md_table(cells_table(report))
    q = quality_table(report)
    if q:
        lines += ["## Quality", ""] + _md_table(q)
    traces = trace_lines(report)
    lines += ["## Traces", ""] + (traces or ["no traced cells"]) + [""]
    for c in report["cells"]:
        if c["status"] == "failed":
            lines += [
                f"## Failed: {c['id']}",
                "",
                c["error"],
                "",
                "```",
                c["log_tail"].rstrip() or "(empty log)",
                "```",
                "",
            ]
    for stage in ("parity", "determinism"):
        lines += [f"## {stage.title()}", "", "```json", _stage(report, stage), "```", ""]
    lines += [f"## Gates: {report['gates']['status']}", ""]
    if report["gates"]["results"]:
        lines += _md_table(gates_table(report))
    path.write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- html


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
    plots = all_plots(report, records)
    parts.append(
        "<h2>Plots</h2>"
        if plots
        else "<h2>Plots</h2><p>none (matplotlib missing or nothing to plot)</p>"
    )
    for title, png in plots:
        b64 = base64.b64encode(png).decode()
        parts.append(f"<h3>{html.escape(title)}</h3><img src='data:image/png;base64,{b64}'/>")
    parts += [
        "<h2>Traces</h2><pre>",
        html.escape("\n".join(trace_lines(report)) or "none"),
        "</pre>",
    ]
    for c in report["cells"]:
        if c["status"] == "failed":
            parts += [
                f"<h2>Failed: {html.escape(c['id'])}</h2><p>{html.escape(c['error'])}</p>"
                f"<pre>{html.escape(c['log_tail'])}</pre>"
            ]
    for stage in ("parity", "determinism"):
        parts += [f"<h2>{stage.title()}</h2><pre>{html.escape(_stage(report, stage))}</pre>"]
    parts.append(f"<h2>Gates: {html.escape(report['gates']['status'])}</h2>")
    if report["gates"]["results"]:
        parts.append(_html_table(gates_table(report)))
    parts.append("</body></html>")
    path.write_text("\n".join(parts))


def write_compare_markdown(comparison: dict, path: Path) -> None:
    """compare.md: every compared metric with its verdict, regressions first."""
    b, n = comparison["base"], comparison["new"]
    lines = [
        "# flashrec-bench compare",
        "",
        f"- base: `{b['path']}` (git {(b.get('git') or {}).get('commit')})",
        f"- new: `{n['path']}` (git {(n.get('git') or {}).get('commit')})",
        f"- test: {comparison['test']}, alpha {comparison['alpha']}; a change counts only when "
        "significant and beyond the noise band",
        f"- verdict: **{comparison['verdict']}** ({len(comparison['regressions'])} regressed, "
        f"{len(comparison['improvements'])} improved)",
        "",
    ]
    head = ["cell", "metric", "base", "new", "delta", "band", "p", "verdict"]
    rows = []
    for c in comparison["cells"]:
        if c["status"] != "compared":
            rows.append([c["id"], "-", "-", "-", "-", "-", "-", c["status"]])
            continue
        for m, r in c["metrics"].items():
            rows.append(
                [
                    c["id"],
                    m,
                    _num(r.get("base"), ".4g"),
                    _num(r.get("new"), ".4g"),
                    _num(r.get("delta_pct"), "+.1f") + "%",
                    _num(r.get("band_pct"), ".1f") + "%",
                    _num(r.get("p_value"), ".3g"),
                    r["verdict"],
                ]
            )
    order = {"regressed": 0, "improved": 1}
    rows.sort(key=lambda r: order.get(r[-1], 2))
    lines += _md_table((head, rows))
    gates = comparison.get("gates")
    if gates and gates["results"]:
        lines += [f"## Gates: {gates['status']}", ""]
        lines += _md_table(gates_table({"gates": gates}))
    path.write_text("\n".join(lines) + "\n")
