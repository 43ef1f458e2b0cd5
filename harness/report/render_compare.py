"""compare.md and the REGRESSED lines on stderr: two runs' comparison
(:func:`harness.judge.runs.compare_reports`) as Markdown."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from harness.report.model import Gates
from harness.report.render import gates_table, num
from harness.report.render_md import md_table


def change_pct(base: float | None, new: float | None) -> float | None:
    """The change from ``base`` to ``new`` in % of ``|base|``: its sign is that of ``new -
    base`` (a base of 0: 0 or an infinity); None without both values."""
    if not all(isinstance(x, int | float) and math.isfinite(x) for x in (base, new)):
        return None
    if base == 0:
        return 0.0 if new == 0 else math.copysign(math.inf, new)  # type: ignore[arg-type]
    return 100 * (new - base) / abs(base)  # type: ignore[operator]


def _pct(x: float | None) -> str:
    return num(x, "+.1f") + ("%" if x is not None else "")


def _p_text(r: dict) -> str:
    """``p 0.012`` or, after a correction, ``p 0.012, Holm 0.048``."""
    text = f"p {num(r.get('p_value'), '.3g')}"
    return text + (f", Holm {num(r['p_adjusted'], '.3g')}" if "p_adjusted" in r else "")


def print_regressions(comparison: dict) -> None:
    """One stderr line per regressed metric of a comparison."""
    paired = comparison.get("paired")
    for r in comparison["regressions"]:
        change = f"{_pct(change_pct(r['base'], r['new']))} medians"
        if paired:  # the verdict's own estimate, named: its sign can differ from the medians'
            change += f", paired change {r['delta_pct']:+.1f}%"
        print(
            f"REGRESSED {r['cell']} {r['metric']}: {r['base']:.4g} -> {r['new']:.4g} "
            f"({change}, band {r['band_pct']:.1f}%, {_p_text(r)})",
            file=sys.stderr,
        )


def _correction_text(comparison: dict) -> str:
    c = comparison.get("correction") or {}
    if c.get("method") == "holm":
        return (
            f"; p Holm-adjusted over the {c['tests']} tests of this comparison (any false "
            f"verdict in the table at most alpha)"
        )
    return "; each metric tested at alpha on its own (no multiple-test correction)"


def _between_runs_text(info: dict) -> str:
    """What a two-run comparison knows about the variation between its runs."""
    parts = ["not interleaved (two separate runs)"]
    if info.get("same_setup"):
        parts.append(f"the same code ({info['same_code'][:7]}) and setup: an A/A pair")
    probe = info.get("host_probe_pct")
    parts.append("no host probe in both" if probe is None else f"host probe {probe:+.1f}%")
    band = info.get("between_run_band_pct")
    if band is None:
        parts.append("no between-run band recorded (stats.between_run_band_pct)")
    else:
        parts.append(f"between-run band {band:g}%")
    return (
        "; ".join(parts) + ". A change the rounds support is called only beyond the between-run "
        "band plus the probe's difference, never in an A/A pair; else it is inconclusive. "
        "`flashrec-bench gate` interleaves the two sides for a decision"
    )


PAIRED_NOTE = (
    "base and new are medians over the rounds (for a quality metric, means over the samples); "
    "the change of medians is new / base - 1 of those. The paired change is what the verdict "
    "and the gates judge: round i of both sides ran back to back, and it is the geometric mean "
    "of the pairs' new / base ratios - 1 (with the Wilcoxon test their median; for a metric "
    "with zeros, the mean of the pairs' differences over the base's mean). The two can differ "
    "in sign: a mean of ratios is not a ratio of medians"
)


def write_compare_markdown(comparison: dict, path: Path) -> None:
    """compare.md: every compared metric with its verdict, regressions first."""
    b, n = comparison["base"], comparison["new"]
    lines = [
        "# flashrec-bench compare",
        "",
        f"- base: `{b['path']}` (git {(b.get('git') or {}).get('commit')})",
        f"- new: `{n['path']}` (git {(n.get('git') or {}).get('commit')})",
        f"- test: {comparison['test']}, alpha {comparison['alpha']}; a change counts only when "
        f"significant and beyond the noise band{_correction_text(comparison)}",
        f"- verdict: **{comparison['verdict']}** ({len(comparison['regressions'])} regressed, "
        f"{len(comparison['improvements'])} improved, "
        f"{len(comparison.get('inconclusive', []))} inconclusive)",
    ]
    if "between_runs" in comparison:
        lines.append(f"- between runs: {_between_runs_text(comparison['between_runs'])}")
    diffs = comparison.get("comparability") or []
    if diffs:
        lines.append(
            "- **not comparable**: the runs differ in "
            + "; ".join(f"{d['field']} ({d['base']!r} -> {d['new']!r})" for d in diffs)
            + ". Numbers from different models, workloads or loads do not measure the change."
        )
    paired = bool(comparison.get("paired"))
    if paired:
        lines.append(f"- {PAIRED_NOTE}")
    lines.append("")
    head = ["cell", "metric", "base", "new", "change of medians"]
    head += ["paired change", "band (of the paired change)"] if paired else ["band"]
    head += ["p", "p (Holm)", "verdict"]
    rows = []
    for c in comparison["cells"]:
        if c["status"] != "compared":
            rows.append([c["id"], *["-"] * (len(head) - 2), c["status"]])
            continue
        for m, r in c["metrics"].items():
            row = [c["id"], m, num(r.get("base"), ".4g"), num(r.get("new"), ".4g")]
            row.append(_pct(change_pct(r.get("base"), r.get("new"))))
            row += [_pct(r.get("delta_pct"))] if paired else []
            row.append(num(r.get("band_pct"), ".1f") + "%")
            row += [num(r.get("p_value"), ".3g"), num(r.get("p_adjusted"), ".3g"), r["verdict"]]
            rows.append(row)
    order = {"regressed": 0, "improved": 1, "inconclusive": 2}
    rows.sort(key=lambda r: order.get(r[-1], 3))
    lines += md_table((head, rows))
    gates = comparison.get("gates")
    if gates and gates["results"]:
        lines += [f"## Gates: {gates['status']}", ""]
        lines += md_table(gates_table(Gates.from_json(gates)))
    path.write_text("\n".join(lines) + "\n")


def write_gate_outcome(out: Path, comparison: dict, status: str, reason: str) -> None:
    """compare.json with the A/B gate's outcome (``gate``), and its section of compare.md."""
    out.mkdir(parents=True, exist_ok=True)
    comparison["gate"] = {"status": status, "reason": reason}
    (out / "compare.json").write_text(json.dumps(comparison, indent=1, default=str))
    md = out / "compare.md"
    if md.is_file():
        ab = comparison.get("ab", {})
        lines = [
            "",
            f"## A/B gate: {status}",
            "",
            f"- {reason}",
            f"- baseline {ab.get('baseline_ref')} = `{ab.get('baseline_commit')}` (worktree), "
            f"candidate = this checkout; {ab.get('pairs')} pairs in {ab.get('sessions')} "
            f"session(s) of fresh servers, {ab.get('order')}",
            f"- {comparison.get('test')} over "
            f"{'sessions' if comparison.get('sessions', 1) >= 3 else 'pairs'}: paired change = "
            "geometric mean of the pairs' candidate / baseline ratios - 1 (what the verdicts "
            f"and gates judge); band = {comparison.get('band_k')} x its standard error; change "
            "of medians = candidate median / baseline median - 1",
        ]
        md.write_text(md.read_text() + "\n".join(lines) + "\n")
