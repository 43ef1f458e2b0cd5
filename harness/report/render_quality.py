"""The quality: section in the report: a per-cell table of quality beside speed, and inline SVG
charts of QPS and p99 latency against recall@k, one colour per precision, each point labelled
with its beam width, the Pareto front (no other cell both faster and better) marked."""

from __future__ import annotations

import html
import math

from harness.report.model import Cell, Report, as_report
from harness.report.render_stages import Table

PRECISION_KEYS = ("quantization", "precision", "dtype")
BEAM_KEYS = ("n", "beam_width")
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


def _param(params: dict, keys: tuple[str, ...]) -> str | None:
    for k in keys:
        if k in params:
            return str(params[k])
    return None


def _median(cell: Cell, name: str) -> float | None:
    v = cell.median(name)
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def recall_metric(report: Report | dict) -> str | None:
    """The recall the charts use: ``recall@K`` at the largest K some evaluated cell has."""
    report = as_report(report)
    names = {m for c in report.cells if c.quality for m in c.metrics}
    ks = sorted(int(m.split("@")[1]) for m in names if m.startswith("recall@"))
    return f"recall@{ks[-1]}" if ks else None


def quality_eval_table(report: Report | dict) -> Table | None:
    """One row per evaluated cell: precision, beams, recall / pass with their 95% intervals,
    invalid rate, QPS and p99 (None when no cell carries a quality eval)."""
    report = as_report(report)
    cells = [c for c in report.cells if c.quality]
    rec = recall_metric(report)
    if not cells:
        return None
    k = rec.split("@")[1] if rec else "?"
    head = ["cell", "precision", "beams", f"recall@{k}", f"pass@{k}", "position1_pass@1",
            "invalid", "qps", "p99 ms", "status"]  # fmt: skip
    rows = []
    for c in cells:
        q = c.quality
        if q.get("status") != "ok":
            rows.append([c.id, "", "", "", "", "", "", "", "", q.get("error", "error")[:80]])
            continue
        m = q["overall"]["metrics"]

        def ci(name: str, m=m) -> str:
            x = m.get(name)
            return "" if x is None else f"{x['value']:.4f} [{x['ci_low']:.4f}, {x['ci_high']:.4f}]"

        qps, p99 = _median(c, "qps"), _median(c, "latency_p99_ms")
        rows.append([
            c.id, _param(c.params, PRECISION_KEYS) or "", q["protocol"]["beam_width"],
            ci(f"recall@{k}"), ci(f"pass@{k}"), ci("position1_pass@1"),
            # without a catalog the invalid rate was not measured: "-", never a 0
            f"{q['overall']['invalid_rate']['value']:.4f}" if q.get("catalog_checked") else "-",
            "" if qps is None else f"{qps:.1f}", "" if p99 is None else f"{p99:.1f}",
            "ok" + (f" (plant {q['plant']['expected']['recall']:.3f})" if q.get("plant") else ""),
        ])  # fmt: skip
    return head, rows


def pareto(points: list[tuple[float, float]], higher_y: bool) -> list[int]:
    """Indices of the points no other point beats on both recall (x, higher) and y."""
    out = []
    for i, (x, y) in enumerate(points):
        beaten = any(
            x2 >= x and (y2 >= y if higher_y else y2 <= y) and (x2, y2) != (x, y)
            for j, (x2, y2) in enumerate(points)
            if j != i
        )
        if not beaten:
            out.append(i)
    return out


def _scale(lo: float, hi: float, a: float, b: float):
    span = (hi - lo) or 1.0
    return lambda v: a + (v - lo) / span * (b - a)


def pareto_svg(report: Report | dict, y_metric: str = "qps") -> str | None:
    """An inline SVG of ``y_metric`` (qps: higher is better; a latency: lower) against recall@k
    over the evaluated cells; None with fewer than two such cells."""
    report = as_report(report)
    rec = recall_metric(report)
    pts = []
    for c in report.cells:
        x, y = (_median(c, rec) if rec else None), _median(c, y_metric)
        if c.status == "ok" and x is not None and y is not None:
            prec = _param(c.params, PRECISION_KEYS) or "all"
            pts.append((x, y, prec, _param(c.params, BEAM_KEYS) or c.id))
    if len(pts) < 2:
        return None
    higher = y_metric == "qps"
    front = set(pareto([(p[0], p[1]) for p in pts], higher))
    w, h, left, right, top, bottom = 560, 340, 60, 130, 20, 45
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    fx = _scale(min(xs), max(xs), left, w - right)
    fy = _scale(min(ys), max(ys), h - bottom, top)
    series = sorted({p[2] for p in pts})
    colour = {s: _COLOURS[i % len(_COLOURS)] for i, s in enumerate(series)}
    e = html.escape
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-size='11'>"]
    out.append(f"<rect x='{left}' y='{top}' width='{w - left - right}' height='{h - top - bottom}' fill='none' stroke='#999'/>")  # fmt: skip
    for v in (min(xs), max(xs)):
        out.append(f"<text x='{fx(v):.1f}' y='{h - bottom + 14}' text-anchor='middle'>{v:.4f}</text>")  # fmt: skip
    for v in (min(ys), max(ys)):
        out.append(f"<text x='{left - 4}' y='{fy(v) + 4:.1f}' text-anchor='end'>{v:.1f}</text>")
    out.append(f"<text x='{(left + w - right) / 2}' y='{h - 8}' text-anchor='middle'>{e(rec or '')}</text>")  # fmt: skip
    ylabel = "QPS (higher is better)" if higher else f"{y_metric} (lower is better)"
    out.append(f"<text x='12' y='{top + (h - top - bottom) / 2}' transform='rotate(-90 12 {top + (h - top - bottom) / 2})' text-anchor='middle'>{e(ylabel)}</text>")  # fmt: skip
    line = sorted((pts[i][0], pts[i][1]) for i in front)
    if len(line) > 1:
        path = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in line)
        out.append(f"<polyline points='{path}' fill='none' stroke='#555' stroke-dasharray='4 3'/>")
    for i, (x, y, prec, beams) in enumerate(pts):
        cx, cy = fx(x), fy(y)
        if i in front:
            out.append(f"<circle cx='{cx:.1f}' cy='{cy:.1f}' r='8' fill='none' stroke='#000'/>")
        out.append(f"<circle cx='{cx:.1f}' cy='{cy:.1f}' r='4.5' fill='{colour[prec]}'><title>{e(f'{prec} n={beams}: {rec} {x:.4f}, {y_metric} {y:.2f}')}</title></circle>")  # fmt: skip
        out.append(f"<text x='{cx + 7:.1f}' y='{cy - 6:.1f}'>n={e(beams)}</text>")
    for j, s in enumerate(series):
        ly = top + 14 + 16 * j
        out.append(f"<circle cx='{w - right + 16}' cy='{ly - 4}' r='4.5' fill='{colour[s]}'/><text x='{w - right + 26}' y='{ly}'>{e(s)}</text>")  # fmt: skip
    ly = top + 14 + 16 * len(series)
    out.append(f"<circle cx='{w - right + 16}' cy='{ly - 4}' r='8' fill='none' stroke='#000'/><text x='{w - right + 28}' y='{ly}'>Pareto front</text>")  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def quality_html(report: Report, html_table) -> list[str]:
    """The report.html parts of the quality eval: its table and the two Pareto charts."""
    table = quality_eval_table(report)
    if table is None:
        return []
    parts = ["<h2>Quality beside speed</h2>", html_table(table)]
    for metric, title in (("qps", "QPS"), ("latency_p99_ms", "p99 latency")):
        svg = pareto_svg(report, metric)
        if svg:
            parts += [f"<h3>{title} against {html.escape(recall_metric(report) or '')}</h3>", svg]
    return parts


def quality_md(report: Report, md_table) -> list[str]:
    """The REPORT.md lines of the quality eval (the charts are in report.html)."""
    table = quality_eval_table(report)
    if table is None:
        return []
    note = "95% intervals over samples (Wilson for pass rates, bootstrap for recall); the "
    note += "QPS / p99 against recall Pareto charts are in report.html."
    return ["## Quality beside speed", "", note, ""] + md_table(table)
