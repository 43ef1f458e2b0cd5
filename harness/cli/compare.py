"""``flashrec-bench compare BASE NEW``: two runs compared, cell by cell and metric by metric:
read (:func:`harness.report.model.read_report`) -> judge (:mod:`harness.judge.runs`, the
gates) -> write (compare.json, :mod:`harness.report.render_compare`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.cli.commands import EXIT_CELLS, EXIT_GATE, EXIT_USAGE


def main(argv: list[str]) -> int:
    """``flashrec-bench compare BASE NEW``: verdict per cell and metric (``inconclusive`` where
    the change cannot be told from drift between the two runs); gates with a baseline."""
    from harness.judge.gates import evaluate_gates
    from harness.judge.runs import compare_reports, metrics_problem
    from harness.report.model import read_report
    from harness.report.render_compare import print_regressions, write_compare_markdown
    from harness.spec.matrix import MatrixSpec

    p = argparse.ArgumentParser(
        prog="flashrec-bench compare", description="Compare two runs (report dirs or report.json)."
    )
    p.add_argument("base")
    p.add_argument("new")
    p.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when a metric regressed (significant and beyond the noise band)",
    )
    p.add_argument(
        "--require-comparable",
        action="store_true",
        help="exit 2 when the two runs differ in model, workload or load settings (the "
        "differences are always printed and written to compare.md)",
    )
    p.add_argument("--out", type=Path, help="where compare.json / compare.md go (default: NEW)")
    p.add_argument("--metrics", help="comma-separated metric names (default: all directional)")
    p.add_argument("--alpha", type=float, help="significance level (default: NEW's stats.alpha)")
    p.add_argument("--test", choices=["welch", "mannwhitney"], help="default: NEW's stats.test")
    p.add_argument(
        "--correction",
        choices=["holm", "none"],
        help="multiple-test correction of the verdicts over every cell x metric compared "
        "(default: NEW's stats.correction, else holm)",
    )
    p.add_argument(
        "--between-run-band-pct",
        type=float,
        metavar="PCT",
        help="how far two separate runs of one setup drift apart, in %% (default: NEW's "
        "stats.between_run_band_pct): a change is called only beyond it plus the host probe's "
        "difference; without one every supported change is 'inconclusive' (use "
        "flashrec-bench gate, which interleaves the two sides, for a decision)",
    )
    args = p.parse_args(argv)
    try:
        base, new = read_report(args.base), read_report(args.new)
    except (OSError, ValueError) as exc:
        print(f"cannot read report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    if metrics is not None and (why := metrics_problem(metrics, [base, new])):
        print(f"compare: --metrics: {why}", file=sys.stderr)
        return EXIT_USAGE
    comparison = compare_reports(
        base, new, metrics, args.alpha, args.test, args.correction, args.between_run_band_pct
    )
    gates = MatrixSpec.model_validate(new.matrix).gates if new.matrix else []
    comparison["gates"] = evaluate_gates(gates, new, comparison).to_json()
    out = args.out or Path(str(new.source)).parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(comparison, indent=1, default=str))
    write_compare_markdown(comparison, out / "compare.md")
    print_regressions(comparison)
    for d in comparison["comparability"]:
        print(f"NOT COMPARABLE {d['field']}: base {d['base']!r}, new {d['new']!r}", file=sys.stderr)
    undecided = comparison["inconclusive"]
    if undecided:
        print(
            f"INCONCLUSIVE {len(undecided)} metric(s) changed beyond the rounds' noise: "
            f"{undecided[0]['reason']}",
            file=sys.stderr,
        )
    print(
        f"compare: {comparison['verdict']}; gates {comparison['gates']['status']}; "
        f"{out}/compare.md",
        file=sys.stderr,
    )
    if args.require_comparable and comparison["comparability"]:
        return EXIT_USAGE
    if comparison["verdict"] == "no_data":  # two runs with no cell in common compared nothing
        print("compare: no cell of both runs was compared (failed or missing)", file=sys.stderr)
        return EXIT_CELLS
    if comparison["gates"]["status"] == "fail":
        return EXIT_GATE
    if args.fail_on_regression and comparison["regressions"]:
        return EXIT_GATE
    return 0
