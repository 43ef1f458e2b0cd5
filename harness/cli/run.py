"""``flashrec-bench MATRIX``: run a matrix and write its report, the straight path
spec (:mod:`harness.spec.load`) -> run (:mod:`harness.run.campaign`) -> build
(:mod:`harness.report.build`) -> judge (:mod:`harness.judge.report`) -> write."""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from pathlib import Path

from harness.cli.commands import COMMANDS, EXIT_CELLS, EXIT_GATE, EXIT_INTERRUPT, EXIT_USAGE
from harness.spec.matrix import SpecError


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


def main(argv: list[str]) -> int:
    """Run a matrix and write its report."""
    from harness.judge.report import judge
    from harness.report.build import build_report, write_report
    from harness.report.model import Interrupted, Report
    from harness.run.campaign import ResumeError, RunInterrupted, RunOptions, plan, run_matrix
    from harness.run.progress import Progress
    from harness.run.stages import names as stage_names
    from harness.servers.launch import install_signal_handlers
    from harness.spec.cells import select
    from harness.spec.load import load_cells
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

    def report_of(results, stages, model, interrupted: Interrupted | None = None) -> Report:
        """The run's report, built, judged (gates and targets), then written into ``out``."""
        report = build_report(spec, results, stages, model, out.name, args.matrix, interrupted)
        return write_report(judge(report, spec), results, out)

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
                for n in stage_names("run")
                if getattr(spec, n) is not None and getattr(spec, n).enabled
            }
            interrupted = Interrupted(stop.cause, len(stop.results), stop.selected)
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
    s = report.summary
    print(
        f"report: {out}/REPORT.md ({s.ok} ok, {s.failed} failed of {s.cells} cells; "
        f"gates {report.gates.status}; targets {report.targets.status})",
        file=sys.stderr,
    )
    if report.gates.status == "fail" or report.targets.fail_run:
        return EXIT_GATE
    return EXIT_CELLS if s.failed else 0
