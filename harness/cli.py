"""``flashrec-bench``: run a matrix, or compare two reports. Thin: it only wires modules.

Exit codes: 0 ok; 1 a gate failed, a ``fail_run`` target was missed or
``--fail-on-regression`` found a regression; 2 usage or
matrix error; 3 one or more cells failed (report still written); 130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import re
import sys
from pathlib import Path

from harness.spec.matrix import SpecError

# subcommand -> "module:function"; the function takes argv (list[str]) and returns an exit code.
# Later stages register theirs here (e.g. the A/B ``gate``).
COMMANDS: dict[str, str] = {
    "compare": "harness.cli:compare_main",
    "determinism": "harness.determinism:main",
    "eval": "harness.quality.cli:main",
    "eval-dataset": "harness.quality.generate:main",
    "gate": "harness.ab.gate:main",
    "quick": "harness.quick:main",
    "reference-server": "harness.servers.reference_server:main",
    "witness": "harness.witness.run:main",
}
EXIT_GATE, EXIT_USAGE, EXIT_CELLS, EXIT_INTERRUPT = 1, 2, 3, 130


def run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashrec-bench",
        description="Run a benchmark matrix (YAML). Subcommands: "
        + ", ".join(sorted(COMMANDS))
        + " (flashrec-bench SUBCOMMAND --help). Reference: docs/harness.md.",
    )
    p.add_argument("matrix", help="matrix YAML file")
    p.add_argument("--out", type=Path, help="report directory (default reports/<run-id>/)")
    p.add_argument(
        "--only",
        action="append",
        metavar="FILTER",
        help="run only matching cells: 'key=value,...' or a cell-id substring/glob; repeat for OR",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    p.add_argument("--resume", action="store_true", help="skip cells already done in --out")
    p.add_argument(
        "--max-wall-s",
        type=float,
        help="time budget of the run: no cell (or HF baseline) starts that would end past it, "
        "by the mean wall time of the cells finished so far; the report then holds the "
        "finished cells, marked INTERRUPTED, and --resume finishes the rest",
    )
    p.add_argument("--rounds", type=int, help="override load.rounds")
    return p


def run_id(spec_name: str | None, matrix: str) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", spec_name or Path(matrix).stem)
    return f"{stamp}-{name}"


def run_main(argv: list[str]) -> int:
    """Run a matrix and write its report."""
    from harness.gate.gates import evaluate_gates, load_cells
    from harness.gate.targets import evaluate_targets
    from harness.report.build import build_report, write_report
    from harness.run.campaign import ResumeError, RunInterrupted, RunOptions, plan, run_matrix
    from harness.run.progress import Progress
    from harness.servers.launch import install_signal_handlers
    from harness.spec.cells import select
    from harness.spec.model import ModelError

    args = run_parser().parse_args(argv)
    try:
        spec, cells = load_cells(args.matrix)
    except SpecError as exc:
        print(f"matrix error:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.rounds is not None and args.rounds < 1:
        print("--rounds must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        print(plan(spec, select(spec, cells, args.only), None))
        return 0
    if args.resume and args.out is None:
        print("--resume needs --out DIR (the run to resume)", file=sys.stderr)
        return EXIT_USAGE
    rid = run_id(spec.name, args.matrix)
    out = args.out or Path("reports") / rid
    if args.max_wall_s is not None and args.max_wall_s <= 0:
        print("--max-wall-s must be > 0", file=sys.stderr)
        return EXIT_USAGE
    opts = RunOptions(out, args.only, args.rounds, args.resume, False, args.matrix, args.max_wall_s)
    chosen = select(spec, cells, args.only)
    if not chosen:
        print("no cell matches --only", file=sys.stderr)
        return EXIT_USAGE

    def report_of(results, stages, model, interrupted: dict | None = None) -> dict:
        """The run's report (gates and targets judged), written into ``out``."""
        report = build_report(spec, results, stages, model, out.name, args.matrix)
        if interrupted is not None:
            report["interrupted"] = interrupted
        report["gates"] = evaluate_gates(spec.gates, report)
        report["targets"] = evaluate_targets(spec.targets, report)
        write_report(report, results, out)
        return report

    install_signal_handlers()
    progress = Progress(len(chosen))
    try:
        results, stages, model = run_matrix(spec, cells, opts, progress)
    except RunInterrupted as stop:
        # a report of the cells that finished (marked as such), never none: a run cut by a time
        # limit still leaves its numbers in REPORT.md, and --resume finishes it
        if stop.results:
            skipped = {"status": "skipped", "reason": f"the run was interrupted ({stop.cause})"}
            stages = {
                n: skipped
                for n in ("parity", "determinism")
                if getattr(spec, n) is not None and getattr(spec, n).enabled
            }
            interrupted = {
                "cause": stop.cause,
                "cells_done": len(stop.results),
                "cells_selected": stop.selected,
            }
            report_of(stop.results, stages, stop.model, interrupted)
        print(
            f"\ninterrupted ({stop.cause}) after {len(stop.results)} of {stop.selected} cells; "
            + (f"their report: {out}/REPORT.md; " if stop.results else "")
            + f"rerun with --resume --out {out} to finish",
            file=sys.stderr,
        )
        return stop.exit_code
    except KeyboardInterrupt:
        print(
            f"\ninterrupted; finished cells are in {out} (rerun with --resume --out {out})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPT
    except (ResumeError, ModelError) as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    report = report_of(results, stages, model)
    s = report["summary"]
    print(
        f"report: {out}/REPORT.md ({s['ok']} ok, {s['failed']} failed of {s['cells']} cells; "
        f"gates {report['gates']['status']}; targets {report['targets']['status']})",
        file=sys.stderr,
    )
    if report["gates"]["status"] == "fail" or report["targets"]["fail_run"]:
        return EXIT_GATE
    return EXIT_CELLS if s["failed"] else 0


def compare_main(argv: list[str]) -> int:
    """``flashrec-bench compare BASE NEW``: verdict per cell and metric (``inconclusive`` where
    the change cannot be told from drift between the two runs); gates with a baseline."""
    from harness.gate.compare import compare_reports, load_report, metrics_problem
    from harness.gate.gates import evaluate_gates
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
        base, new = load_report(args.base), load_report(args.new)
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
    gates = MatrixSpec.model_validate(new["matrix"]).gates if new.get("matrix") else []
    comparison["gates"] = evaluate_gates(gates, new, comparison)
    out = args.out or Path(new["_path"]).parent
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``flashrec-bench`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        module, func = COMMANDS[argv[0]].split(":")
        return int(getattr(importlib.import_module(module), func)(argv[1:]))
    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
