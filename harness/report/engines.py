"""Engines side by side (a matrix of several ``engines``): per cell every engine's QPS, p50,
p99, invalid-SID and duplicate rates and beams per answer, and each engine's ratio to the first
engine with its bootstrap interval (rounds paired where ``load.interleave_engines`` ran them
seconds apart). A cell an engine could not serve stays in the table with its error and the
last line of its log."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.metrics.stats import finite, ratio_ci, wider_band
from harness.report.model import Cell, Metric, Report
from harness.report.render import med_ci, num, pct
from harness.report.render_stages import Table

RATIO_METRICS = ("qps", "latency_p50_ms", "latency_p99_ms")
SHOWN = (*RATIO_METRICS, "invalid_rate", "duplicate_rate", "beams_mean")
HIGHER_IS_BETTER = {"qps": True, "latency_p50_ms": False, "latency_p99_ms": False}


def point_of(cell_id: str) -> str:
    """A cell id without its engine (``flashrec,beam_width=50`` -> ``beam_width=50``)."""
    return cell_id.split(",", 1)[1] if "," in cell_id else ""


def log_line(tail: str) -> str:
    """The last non-empty line of a log tail (what a failed cell's row shows)."""
    lines = [x.strip() for x in (tail or "").splitlines() if x.strip()]
    return lines[-1][:300] if lines else ""


def _rounds(cell: Cell, metric: str) -> dict[int, float]:
    return {
        int(r["round"]): float(r[metric])
        for r in cell.round_metrics or []
        if r.get(metric) is not None and int(r.get("round", -1)) >= 0
    }


def _reach(r: dict) -> float:
    """How far an A/A control's interval reaches from 1, relative (NaN without one): the
    spread two servers of one setting show in this run."""
    lo, hi = r.get("ci_low"), r.get("ci_high")
    return max(abs(1 - lo), abs(hi - 1)) if finite(lo) and finite(hi) else float("nan")


def _band(metric: str, b: Cell, o: Cell, reach: float) -> tuple[float, str]:
    """The relative change a verdict must exceed on ``metric``: the wider of the two cells'
    noise bands and the A/A controls' reach, with which of them it is."""
    noise = wider_band(
        *(c.metrics[metric].noise_band for c in (b, o) if c.metrics.get(metric) is not None)
    )
    if finite(reach) and reach >= noise:
        return reach, "A/A spread"
    return noise, "noise band"


def _verdict(metric: str, r: dict, base: str, other: str, band: float, band_from: str,
             controlled: bool) -> str:  # fmt: skip
    """Who is ahead on ``metric`` by the ratio other / base: only when its interval excludes 1
    and the ratio lies beyond ``band`` (the noise band or the A/A spread); ``level`` else."""
    ratio, lo, hi = r["ratio"], r["ci_low"], r["ci_high"]
    if not (finite(ratio) and finite(lo) and finite(hi)):
        return "no data"
    if lo <= 1 <= hi:
        return "level (interval holds 1)"
    if abs(ratio - 1) <= band:
        return f"level within the {band_from} (±{100 * band:.1f}%)"
    better = HIGHER_IS_BETTER[metric]
    ahead = other if (ratio > 1) == better else base
    return f"{ahead} ahead" + ("" if controlled else " (no A/A control)")


def _ratio(b: Cell, o: Cell, metric: str, interleaved: bool, confidence: float,
           n_boot: int) -> dict[str, Any]:  # fmt: skip
    """other / base on ``metric`` with its bootstrap interval, paired by round where both
    engines' rounds were interleaved."""
    rb, ro = _rounds(b, metric), _rounds(o, metric)
    shared = sorted(set(rb) & set(ro))
    paired = interleaved and len(shared) >= 2
    xs = [rb[i] for i in shared] if paired else list(rb.values())
    ys = [ro[i] for i in shared] if paired else list(ro.values())
    r, lo, hi = ratio_ci(xs, ys, paired, confidence, n_boot)
    return {"ratio": r, "ci_low": lo, "ci_high": hi, "paired": paired, "rounds": len(xs)}


def engine_comparison(cells: Sequence[Cell], engines: list[str], interleaved: bool,
                      confidence: float = 0.95, n_boot: int = 2000,
                      controls: Sequence[str] = ()) -> dict[str, Any] | None:  # fmt: skip
    """report.json's ``engines`` section (None with fewer than two engines): ``base`` (the
    first engine), ``controls`` (A/A repeats of it), ``interleaved``, and one row per point
    with each engine's entry and each other engine's ``ratios`` (other / base per metric:
    ``ratio``, ``ci_low``, ``ci_high``, ``paired``, ``rounds``, ``verdict``; for an engine
    under test also ``band``, the relative change its verdict had to exceed, and
    ``band_from``)."""
    if len(engines) < 2:
        return None
    base = engines[0]
    controls = set(controls or ())
    by_point: dict[str, dict[str, Cell]] = {}
    for c in cells:
        by_point.setdefault(point_of(c.id), {})[str(c.engine)] = c
    rows = []
    for point, got in by_point.items():
        entries = {}
        for name in engines:
            c = got.get(name)
            if c is None:
                entries[name] = {"status": "not run"}
                continue
            m = c.metrics
            entries[name] = {
                "id": c.id,
                "status": c.status,
                **(
                    {"error": c.error, "log_line": log_line(c.log_tail or "")} if not c.ok else {}
                ),  # fmt: skip
                **{k: m[k].to_json() for k in SHOWN if m.get(k) is not None},
            }
        ratios: dict[str, dict] = {}
        b = got.get(base)
        for name in engines[1:]:
            o = got.get(name)
            if not b or not o or not b.ok or not o.ok:
                continue
            ratios[name] = {m: _ratio(b, o, m, interleaved, confidence, n_boot)
                            for m in RATIO_METRICS}  # fmt: skip
        reach = {m: max((x for x in (_reach(ratios[c][m]) for c in controls if c in ratios)
                         if finite(x)), default=float("nan")) for m in RATIO_METRICS}  # fmt: skip
        for name, per in ratios.items():
            for metric, r in per.items():
                if name in controls:
                    r["verdict"] = f"A/A control (reach ±{100 * _reach(r):.1f}%)"
                    continue
                band, band_from = _band(metric, b, got[name], reach[metric])
                r.update(band=band, band_from=band_from)
                r["verdict"] = _verdict(metric, r, base, name, band, band_from,
                                        finite(reach[metric]))  # fmt: skip
        rows.append({"point": point, "engines": entries, "ratios": ratios})
    return {"base": base, "engines": engines, "controls": sorted(controls),
            "interleaved": interleaved, "rows": rows}  # fmt: skip


def _metric(entry: dict | None) -> Metric | None:
    """A metric of the ``engines`` section (its JSON) as a :class:`Metric`."""
    return Metric.from_json(entry) if entry else None


def _ratio_text(r: dict | None) -> str:
    if not r or r.get("ratio") is None:
        return "-"
    return f"{num(r['ratio'], '.3f')} [{num(r['ci_low'], '.3f')}, {num(r['ci_high'], '.3f')}]"


def engines_table(report: Report) -> Table | None:
    """One row per point x engine; the ratio columns are the engine's to the first engine."""
    sec = report.engines
    if not sec:
        return None
    base = sec["base"]
    head = ["cell", "engine", "status", "QPS", "p50 ms", "p99 ms", "invalid", "dup",
            "beams/answer", f"QPS / {base}", f"p50 / {base}", f"p99 / {base}", "QPS verdict"]  # fmt: skip
    rows = []
    for row in sec["rows"]:
        for name, e in row["engines"].items():
            r = row["ratios"].get(name) or {}
            status = e["status"]
            if status != "ok" and e.get("error"):
                status += f": {e['error'][:160]}" + (
                    f" (log: {e['log_line']})" if e.get("log_line") else ""
                )
            rows.append([
                row["point"] or "-", name, status, med_ci(_metric(e.get("qps"))),
                med_ci(_metric(e.get("latency_p50_ms")), ".1f"),
                med_ci(_metric(e.get("latency_p99_ms")), ".1f"),
                pct((e.get("invalid_rate") or {}).get("median")),
                pct((e.get("duplicate_rate") or {}).get("median")),
                num((e.get("beams_mean") or {}).get("median"), ".1f"),
                *[_ratio_text(r.get(m)) for m in RATIO_METRICS],
                (r.get("qps") or {}).get("verdict", "-" if name != base else "(base)"),
            ])  # fmt: skip
    return head, rows


ENGINES_NOTE = (
    "Every engine on the same cells, the same prompts and load. Ratios are this engine's median "
    "over the first engine's, with a bootstrap interval: paired by round where the rounds were "
    "interleaved (load.interleave_engines: each round of one engine seconds from the other's), "
    "else resampled per engine. A verdict names an engine ahead only when the interval excludes "
    "1 and the ratio lies beyond the wider of the two cells' noise bands and the A/A spread: how "
    "far the interval of a control (an engine with control: true, the first engine's settings "
    "in a server of its own) reaches from 1. Without a control the spread between two servers "
    "of one setting is unmeasured, and an engine ahead says so. A cell an engine could not "
    "serve shows its error and the last line of its log."
)
