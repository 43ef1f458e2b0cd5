"""The A/B gate's outcome (``flashrec-bench gate``, :mod:`harness.cli.gate`): from the paired
comparison of the two sides (:mod:`harness.judge.paired`) and the matrix's gates on it, pass,
fail, error, or skip (the baseline cannot serve the matrix), with its exit code."""

from __future__ import annotations

from pathlib import Path

from harness.report.model import Gates
from harness.spec.matrix import MatrixSpec

EXIT_OK, EXIT_GATE, EXIT_USAGE, EXIT_CELLS = 0, 1, 2, 3


def ab_outcome(
    spec: MatrixSpec,
    comparison: dict,
    gates: Gates,
    failed: dict[str, list[str]],
    named: list[str],
    cut: dict,
    commit: str,
    out: Path,
) -> tuple[str, str, int]:
    """(status, reason, exit code) of an A/B run: ``error`` when a cell was cut before 3
    pairs, a candidate cell failed, a named metric or a gate had nothing to judge; ``skip``
    when the baseline's cells failed (skipped with --allow-no-baseline, else an error);
    ``fail`` when a gate failed or, without a regression gate that judged a cell, any metric
    (or a ``named`` one) regressed; else ``pass``. ``failed``: the failed cell ids per side;
    ``cut``: ``{cut: why the run stopped early or "", short: the cells with < 3 pairs}``."""
    if cut["short"]:  # a cell cut before 3 pairs cannot be judged: no pass on what did not run
        return (
            "error",
            f"{cut['cut']}; too few pairs to judge: {', '.join(cut['short'])}",
            EXIT_CELLS,
        )
    if failed["candidate"]:
        return "error", f"candidate cells failed: {failed['candidate']}", EXIT_CELLS
    if failed["baseline"]:
        reason = f"baseline {commit[:12]} cannot serve the matrix: {failed['baseline']}"
        return "skip", reason, EXIT_CELLS
    unjudged = [
        f"{c['id']}: {m}"
        for c in comparison["cells"]
        if c.get("status") == "compared"
        for m in named
        if c["metrics"].get(m, {}).get("verdict", "n/a") == "n/a"
    ]
    if unjudged:  # a named metric judged in no pair of a cell would pass on nothing
        return "error", f"--metrics with no paired rounds: {'; '.join(unjudged)}", EXIT_USAGE
    # a gate with a selected cell that ran but left it nothing to check would pass on the
    # others (or on nothing): the change is not judged there
    unmeasured = [
        f"{r.name}: nothing to check in {', '.join(r.missing)}" for r in gates.results if r.missing
    ]
    if unmeasured:
        return "error", f"gates with nothing to check: {'; '.join(unmeasured)}", EXIT_CELLS
    # regression gates that judged some cell; with none (e.g. --only left them no cell), any
    # regression of the comparison fails, as with no regression gate at all
    regression_gates = [
        g
        for g, r in zip(spec.gates, gates.results)
        if g.max_regression_pct is not None and r.checks
    ]
    named_regressed = [r for r in comparison["regressions"] if r["metric"] in named]
    bad = (
        gates.status == "fail"
        or (not regression_gates and comparison["regressions"])
        or bool(named_regressed)
    )
    reason = (
        f"{len(comparison['regressions'])} regressed, {len(comparison['improvements'])} "
        f"improved metric(s); gates {gates.status}; {out}/compare.md"
    )
    if cut["cut"]:
        ab = comparison["ab"]
        reason += f" (cut after {ab['pairs']} of {ab['pairs_planned']} pairs: {cut['cut']})"
    return ("fail", reason, EXIT_GATE) if bad else ("pass", reason, EXIT_OK)
