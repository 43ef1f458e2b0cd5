"""A soak's report: the trend of every resource, the verdict, and the files in ``--out``.

``soak.json`` (everything: config, trends, probe log, actions, errors, idle gauges, the
rows), ``samples.csv`` (one row per interval, one column per resource; per process
``rss_mib[role-pid]`` etc.) and ``REPORT.md``. A soak fails (exit 1) when a gated resource
grows (:mod:`harness.soak.trend`), the probe's answer changed or failed, any request or action
failed, or the slot / KV gauges did not come back to 0 after the load.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from harness.soak.actions import PHASES
from harness.soak.config import SoakConfig
from harness.soak.probe import Probe
from harness.soak.run import GAUGES, State
from harness.soak.trend import Trend, fit

_NOT_FITTED = {
    "t_s",
    "requests",
    "sent",
    "rate",
    "ok",
    "errors",
    "errors_total",
    "warmup",
    "final",
    "probe",
    "max_ms",
}


def kind(column: str) -> str:
    """``rss_mib[engine-42]`` -> ``rss_mib``."""
    return column.split("[", 1)[0]


def trends(rows: list[dict], tolerances: dict[str, tuple[float, float]]) -> list[Trend]:
    """A trend per resource column over the rows under load (warm-up and final rows out)."""
    used = [r for r in rows if not r["warmup"] and not r["final"]]
    columns: list[str] = []
    for r in used:
        columns += [c for c in r if c not in _NOT_FITTED and c not in columns]
    x = [r["requests"] for r in used]
    out = []
    for c in columns:
        if c in GAUGES and all(r.get(c) is None for r in used):
            continue
        tol, allow = tolerances.get(kind(c), (math.inf, 0.0))
        out.append(fit(c, x, [r.get(c) for r in used], tol, allow))
    return out


def verdict(state: State, probe: Probe, fitted: list[Trend]) -> list[str]:
    """Why the soak fails, one line per reason (empty: it passes)."""
    out = [
        f"{t.resource} grows: {t.slope:+.3g} per 1,000 requests "
        f"[{t.low:+.3g}, {t.high:+.3g}] > {t.tolerance:g} (run allowance {t.allowance:g})"
        for t in fitted
        if t.grows
    ]
    if probe.changes:
        first = probe.changes[0]
        out.append(
            f"the probe's answer changed {len(probe.changes)} time(s), first at "
            f"{first['t_s']:.0f} s: {'; '.join(first['diff'][:3])}"
        )
    if state.errors:
        out.append(f"{state.errors} error(s); first: {state.error_log[0]['error'][:120]}")
    leaked = {k: v for k, v in state.idle.items() if v}
    if leaked:
        out.append(f"not idle after the load: {leaked}")
    if probe.sent == 0:
        out.append("no probe answered")
    if state.interrupted:
        out.append(f"interrupted after {state.elapsed_s:.0f} s")
    return out


def summary_line(cfg: SoakConfig, state: State, probe: Probe, fitted, failures) -> str:
    gated = [t for t in fitted if math.isfinite(t.tolerance)]
    rate = state.done / state.elapsed_s if state.elapsed_s else 0.0
    probe_word = "changed" if probe.changes else "unchanged"
    word = "INTERRUPTED" if state.interrupted else ("FAIL" if failures else "PASS")
    return (
        f"soak {state.elapsed_s / 60:.1f} min: {state.done} requests ({rate:.2f}/s, asked "
        f"{cfg.rate:g}/s), {state.errors} errors, probe {probe_word} ({probe.sent} sent), "
        f"{len(state.actions)} actions, {sum(t.grows for t in gated)} of {len(gated)} gated "
        f"trends grow: {word}"
    )


def _process(resource: str) -> str | None:
    """``"proc-7"`` of a per-process resource ``"rss_mib[proc-7]"``; None for the others."""
    return resource[resource.index("[") + 1 : -1] if resource.endswith("]") else None


def brief_processes(fitted: list[Trend]) -> list[str]:
    """The processes every resource of which is ``n/a`` (too few samples to fit: a child that
    lived a moment), in first-seen order: one line in the report instead of a row each."""
    verdicts: dict[str, set[str]] = {}
    for t in fitted:
        name = _process(t.resource)
        if name is not None:
            verdicts.setdefault(name, set()).add(t.verdict)
    return [n for n, v in verdicts.items() if v == {"n/a"}]


def _num(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.3g}"


AFTER_S = 5.0  # the window after an action whose requests are reported beside it


def latency_window(started: np.ndarray, took: np.ndarray, lo: float, hi: float, ref: float) -> dict:
    """The answered requests (their starts and latencies, s) in flight at any time in
    ``[lo, hi]``: how many, p50 / p99 / max (ms), and when the slowest started, in s from
    ``ref`` (an action's start)."""
    hit = (started <= hi) & (started + took >= lo)
    if not hit.any():
        return {"requests": 0}
    lat, at = took[hit] * 1000.0, started[hit]
    p50, p99 = np.percentile(lat, [50, 99])
    k = int(np.argmax(lat))
    return {
        "requests": int(hit.sum()), "p50_ms": round(float(p50), 3),
        "p99_ms": round(float(p99), 3), "max_ms": round(float(lat[k]), 3),
        "slowest_started_s": round(float(at[k] - ref), 3),
    }  # fmt: skip


def phase_at(at_s: float, took_s: float, timings: dict[str, float], order) -> str | None:
    """The phase of an action running at ``at_s`` s from its start: its answer's last phases
    (``order``, :data:`harness.soak.actions.PHASES`) counted back from the answer at
    ``took_s``, "before" them, or "after" the answer; None without every phase's time."""
    if not order or any(k not in timings for k in order):
        return None
    if at_s > took_s:
        return "after"
    end = took_s
    for k in reversed(order):
        start = end - timings[k] / 1e3
        if at_s >= start:
            return k.removesuffix("_ms")
        end = start
    return "before"


def around_actions(state: State) -> list[dict]:
    """Per action: the requests in flight while it ran (``during``) and in the ``AFTER_S``
    after it answered (``after``), from every answered request's start and latency; where the
    answer gives its phases' times, the phase the slowest request started in."""
    started, took = np.asarray(state.started, float), np.asarray(state.took, float)
    out = []
    for a in state.actions:
        t0, t1 = a["t_s"], a["t_s"] + a["took_s"]
        during = latency_window(started, took, t0, t1, t0)
        if during["requests"]:
            phase = phase_at(during["slowest_started_s"], a["took_s"],
                             a.get("timings_ms") or {}, PHASES.get(a["action"], ()))  # fmt: skip
            if phase is not None:
                during["slowest_phase"] = phase
        out.append({
            "t_s": a["t_s"], "action": a["action"], "arg": a["arg"], "took_s": a["took_s"],
            "during": during, "after": latency_window(started, took, t1, t1 + AFTER_S, t0),
        })  # fmt: skip
    return out


def write_samples(out: Path, rows: list[dict]) -> None:
    """``samples.csv``: one row per interval, one column per resource (rewritten whole: a
    process seen later adds its columns)."""
    columns: list[str] = []
    for r in rows:
        columns += [c for c in r if c not in columns]
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "samples.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    tmp.replace(out / "samples.csv")


def write(out: Path, cfg: SoakConfig, state: State, probe: Probe, meta: dict) -> tuple[str, bool]:
    """Write soak.json, samples.csv and REPORT.md into ``out``; (summary line, passed)."""
    out.mkdir(parents=True, exist_ok=True)
    fitted = trends(state.rows, cfg.tolerances)
    failures = verdict(state, probe, fitted)
    line = summary_line(cfg, state, probe, fitted, failures)
    write_samples(out, state.rows)
    around = around_actions(state)
    config = dataclasses.asdict(cfg)
    config["tolerances"] = {
        k: [v if math.isfinite(v) else "inf" for v in pair] for k, pair in cfg.tolerances.items()
    }
    doc = {
        "summary": line,
        "passed": not failures,
        "failures": failures,
        "meta": meta,
        "config": config,
        "requests": state.done,
        "sent": state.sent,
        "errors": state.errors,
        "elapsed_s": round(state.elapsed_s, 3),
        "trends": [t.row() for t in fitted],
        "probe": probe.summary,
        "actions": state.actions,
        "around_actions": around,
        "error_log": state.error_log,
        "idle_after": state.idle,
        "processes": {str(p): n for p, n in state.names.items()},
        "notes": state.notes,
        "samples": state.rows,
    }
    (out / "soak.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "REPORT.md").write_text(markdown(line, failures, fitted, state, probe, meta, around))
    return line, not failures


def markdown(
    line, failures, fitted, state: State, probe: Probe, meta: dict, around: list[dict]
) -> str:
    md = ["# Soak", "", f"**{line}**", ""]
    md += [f"- {k}: `{v}`" for k, v in meta.items()] + [""]
    if failures:
        md += ["## Failures", ""] + [f"- {f}" for f in failures] + [""]
    md += [
        "## Trends (per 1,000 requests, 95% interval; warm-up and final rows left out)",
        "",
        "| resource | samples | first | last | slope | 95% interval | tolerance (run) | verdict |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    brief = brief_processes(fitted)
    for t in fitted:
        if _process(t.resource) in brief:
            continue
        tol = f"{t.tolerance:g} ({t.allowance:g})" if math.isfinite(t.tolerance) else "report only"
        md.append(
            f"| `{t.resource}` | {t.samples} | {t.first:.4g} | {t.last:.4g} | "
            f"{_num(t.slope)} | [{_num(t.low)}, {_num(t.high)}] | {tol} | "
            f"{'**grows**' if t.grows else t.verdict} |"
        )
    if brief:
        md += [
            "",
            f"Processes seen in too few samples to fit (every resource n/a; in `soak.json`): "
            f"{', '.join(f'`{n}`' for n in brief)}.",
        ]
    md += [
        "",
        f"## Probe: {probe.sent} sent, {len(probe.changes)} changes, {len(probe.errors)} errors",
        "",
        f"Largest score move of a beam two answers share: {probe.max_move:.4g} (a change "
        f"beyond {probe.tol:g}).",
        "",
    ]
    md += [f"- {c['t_s']:.0f} s: {'; '.join(c['diff'])}" for c in probe.changes[:20]]
    if state.actions:
        md += [
            "",
            "## Actions",
            "",
            "| t (s) | action | ok | took (s) | the answer's times (ms) | answer |",
            "| ---: | --- | --- | ---: | --- | --- |",
        ]
        md += [
            f"| {a['t_s']:.0f} | {a['action']} {a['arg'] or ''} | {a['ok']} | "
            f"{a['took_s']:.2f} | {_timings(a.get('timings_ms') or {})} | "
            f"{a['detail'][:80].replace('|', '/')} |"
            for a in state.actions
        ]
        md += [
            "",
            f"## Latency around actions (requests in flight while each ran, and in the "
            f"{AFTER_S:g} s after it; the slowest one's start in s from the action's, and the "
            f"phase of the action it fell in where the answer times them)",
            "",
            "| t (s) | action | took (s) | during: requests | p50 / p99 / max ms | slowest at "
            "| after: requests | p50 / p99 / max ms |",
            "| ---: | --- | ---: | ---: | --- | ---: | ---: | --- |",
        ]
        md += [_around_row(a) for a in around]
    if state.error_log:
        md += ["", "## Errors (first 20)", ""]
        md += [f"- {e['t_s']:.0f} s {e['kind']}: {e['error'][:160]}" for e in state.error_log[:20]]
    md += ["", f"Idle after the load: {state.idle}", ""]
    md += [f"Note: {n}" for n in state.notes]
    md += ["", "Samples: `samples.csv`; everything: `soak.json`.", ""]
    return "\n".join(md)


def _timings(ms: dict[str, float]) -> str:
    """An answer's phase times, in its order: ``load 3650, copy 420, hash 3150, swap 15.8``."""
    if not ms:
        return "-"
    return ", ".join(f"{k.removesuffix('_ms')} {v:.{1 if v < 100 else 0}f}" for k, v in ms.items())


def _around_row(a: dict) -> str:
    def cells(w: dict) -> str:
        if not w["requests"]:
            return "0 | -"
        return f"{w['requests']} | {w['p50_ms']:.0f} / {w['p99_ms']:.0f} / {w['max_ms']:.0f}"

    during, after = a["during"], a["after"]
    at = f"{during['slowest_started_s']:+.2f}" if during["requests"] else "-"
    if "slowest_phase" in during:
        at += f" ({during['slowest_phase']})"
    return (
        f"| {a['t_s']:.0f} | {a['action']} {a['arg'] or ''} | {a['took_s']:.2f} | "
        f"{cells(during)} | {at} | {cells(after)} |"
    )
