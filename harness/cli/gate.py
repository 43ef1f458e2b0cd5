"""``flashrec-bench gate MATRIX``: the A/B performance gate of a change (the running in :mod:`harness.run.sides`, the
judging in :mod:`harness.judge.ab`).

Outcomes (exit codes as for a matrix run):

    0  pass     no gate failed (regressions within tolerance, or none)
    0  skipped  with --allow-no-baseline: the baseline ref names no commit, predates the
                matrix file, or cannot serve it (its servers fail while the candidate's run)
    1  fail     a gate failed: e.g. a regression significant, beyond the noise band and past
                ``max_regression_pct``; without regression gates in the matrix, any regression
    2  usage    bad matrix or arguments, not a git checkout, a missing baseline (no flag)
    3  cells    candidate cells failed (or baseline cells, without --allow-no-baseline), or
                --max-wall-s cut the run before a cell had 3 pairs
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

from harness.judge.ab import EXIT_CELLS, EXIT_OK, EXIT_USAGE, ab_outcome
from harness.judge.gates import evaluate_gates
from harness.judge.paired import compare_paired
from harness.names import is_metric, metric_names
from harness.report.build import build_report, write_report
from harness.report.model import Report
from harness.report.render_compare import (
    print_regressions,
    write_compare_markdown,
    write_gate_outcome,
)
from harness.run.environment import git_info, take_host_probe
from harness.run.sides import (
    DEFAULT_REF,
    PIN_FILE,
    ABRun,
    Side,
    cpu_split,
    pinned_ref,
    repo_root,
    resolve_commit,
)
from harness.run.sides import worktree as baseline_worktree
from harness.servers.launch import install_signal_handlers
from harness.spec.cells import select
from harness.spec.load import load_cells, unknown
from harness.spec.matrix import SpecError
from harness.spec.model import ModelError, ResolvedModel, resolve_model


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashrec-bench gate",
        description="A/B performance gate: serve the baseline ref (a temporary git worktree) "
        "and this checkout side by side, rounds interleaved, and compare them pair by pair.",
    )
    p.add_argument("matrix", help="matrix YAML (e.g. matrices/ci_gate.yaml)")
    p.add_argument(
        "--baseline-ref",
        help=f"git ref of the baseline (default: the ref pinned in {PIN_FILE}, else {DEFAULT_REF})",
    )
    p.add_argument("--out", type=Path, help="output dir (default reports/<time>-gate-<name>/)")
    p.add_argument("--pairs", type=int, help="A/B pairs of rounds (default: load.rounds)")
    p.add_argument(
        "--sessions",
        type=int,
        help="restart both servers this many times, splitting the pairs evenly; with >= 3 the "
        "statistics use the sessions as units (default: pairs // 10, between 1 and 6)",
    )
    p.add_argument("--only", action="append", metavar="FILTER", help="run only matching cells")
    p.add_argument(
        "--metrics",
        default="",
        metavar="NAME[,NAME...]",
        help="judge these metrics too, pair by pair, e.g. server_tokenize_ms_mean for a change to "
        "prompt building: informational ones (Server-Timing phases, GC pauses, server CPU) in "
        "their natural direction; a named metric that regresses fails the gate, and one that "
        "a cell lacks is an error",
    )
    p.add_argument(
        "--max-wall-s",
        type=float,
        metavar="S",
        help="the gate's time budget: no server start or pair begins that would end past it "
        "(judged by the last ones); the pairs done are compared if every cell has 3, else "
        "the gate is an error (exit 3) that says how far it got",
    )
    p.add_argument(
        "--allow-no-baseline",
        action="store_true",
        help="pass (exit 0, 'skipped') when the baseline is missing, predates the matrix or "
        "cannot serve it; for CI",
    )
    p.add_argument(
        "--pin-cpus",
        action="store_true",
        help="pin the servers of both sides to one CPU (the last) and the client to the others, "
        "so that both sides meet the same core and its other load (small CPU-only machines)",
    )
    for name in ("candidate", "baseline"):
        p.add_argument(
            f"--{name}-env",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"extra environment of the {name} servers (repeatable); e.g. a test plant: "
            "FLASHREC_TEST_STEP_DELAY_MS=0.3 sleeps after every engine step where tests/plants "
            "is on PYTHONPATH",
        )
    return p


def _env(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _finish(out: Path, comparison: dict, status: str, reason: str, code: int) -> int:
    """Write ``compare.json`` (and the A/B section of ``compare.md``) with the gate's outcome."""
    write_gate_outcome(out, comparison, status, reason)
    print(f"gate: {status.upper()}: {reason}", file=sys.stderr)
    return code


def _skip(args, out: Path, reason: str, code: int, comparison: dict | None = None) -> int:
    """No comparison possible: 'skipped' (exit 0) with --allow-no-baseline, else ``code``."""
    comparison = comparison or {}
    if args.allow_no_baseline:
        return _finish(out, comparison, "skipped", reason, EXIT_OK)
    return _finish(out, comparison, "error", reason, code)


def _absolute(model: ResolvedModel | None) -> ResolvedModel | None:
    """Model paths made absolute: the servers run in other working directories."""
    if model is None:
        return None
    fix = lambda p: str(Path(p).resolve()) if p else p  # noqa: E731
    named = tuple((n, fix(p), h) for n, p, h in model.catalogs)
    return dataclasses.replace(
        model, path=fix(model.path), catalog=fix(model.catalog), catalogs=named
    )


def main(argv: list[str]) -> int:
    """Entry point of ``flashrec-bench gate``."""
    args = parser().parse_args(argv)
    deadline = None if args.max_wall_s is None else time.monotonic() + args.max_wall_s
    try:
        extra = {"candidate": _env(args.candidate_env), "baseline": _env(args.baseline_env)}
        spec, cells = load_cells(args.matrix)
    except (SpecError, ValueError) as exc:
        print(f"gate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    root = repo_root(Path.cwd())
    pairs = args.pairs or spec.load.rounds
    cells = select(spec, cells, args.only)
    named = [m.strip() for m in args.metrics.split(",") if m.strip()]
    ks = list(spec.quality.ks)
    bad_names = [unknown(m, metric_names(ks), "a metric") for m in named if not is_metric(m, ks)]
    external = sorted({c.engine.name for c in cells if not c.engine.launched})
    sessions = args.sessions or max(1, min(6, pairs // 10))
    problems = [
        (root is None, "not inside a git checkout"),
        (pairs < 3, f"--pairs must be >= 3 (got {pairs})"),
        (not 1 <= sessions <= pairs, f"--sessions must be in 1..pairs (got {sessions})"),
        (not cells, "no cell matches --only"),
        (bool(external), f"engines {external} are external: the gate launches both sides"),
        (bool(bad_names), f"--metrics: {'; '.join(bad_names)}"),
        (args.max_wall_s is not None and args.max_wall_s <= 0, "--max-wall-s must be > 0"),
    ]
    for bad, why in problems:
        if bad:
            print(f"gate: {why}", file=sys.stderr)
            return EXIT_USAGE
    assert root is not None
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or Path("reports") / f"{stamp}-gate-{spec.name or Path(args.matrix).stem}"
    ref = args.baseline_ref or pinned_ref(root) or DEFAULT_REF
    commit = resolve_commit(root, ref)
    if commit is None:
        return _skip(args, out, f"no baseline: {ref!r} names no commit", EXIT_USAGE)
    install_signal_handlers()
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    log(
        f"gate: baseline {ref} = {commit[:12]}, candidate = {root} (this checkout); "
        f"{pairs} pairs in {sessions} session(s)"
    )
    with baseline_worktree(root, commit) as tree:
        matrix = Path(args.matrix).resolve()
        if matrix.is_relative_to(root) and not (tree / matrix.relative_to(root)).is_file():
            rel = matrix.relative_to(root)
            return _skip(args, out, f"baseline {commit[:12]} predates {rel}", EXIT_USAGE)
        sides = [
            Side("baseline", tree, extra["baseline"]),
            Side("candidate", root, extra["candidate"]),
        ]
        engines = {c.engine.name: c.engine for c in cells if c.engine.kind == "flashrec"}
        for side in sides:
            for e in engines.values():
                origin = side.flashrec_origin(e)
                if side.name == "baseline" and origin.startswith("<import failed"):
                    reason = f"baseline {commit[:12]} cannot import flashrec: {origin[-200:]}"
                    return _skip(args, out, reason, EXIT_CELLS)
                if not origin.startswith(str(side.tree)):
                    print(f"gate: {side.name} imports flashrec from {origin}", file=sys.stderr)
                    return EXIT_USAGE
        try:
            model = _absolute(resolve_model(spec, log=log))
        except ModelError as exc:
            print(f"gate: {exc}", file=sys.stderr)
            return EXIT_USAGE
        split = cpu_split() if args.pin_cpus else None
        before = os.sched_getaffinity(0)
        if split:
            os.sched_setaffinity(0, split[1])
            log(f"gate: servers pinned to CPU {sorted(split[0])}, client to {sorted(split[1])}")
        take_host_probe()  # before any server runs beside it
        try:
            cpus = split[0] if split else None
            run = ABRun(spec, cells, sides, pairs, out, model, log, cpus, sessions, deadline)
            results = asyncio.run(run.run())
            short = _cut_short(run, results)
        finally:
            os.sched_setaffinity(0, before)
        reports = {
            side.name: dataclasses.replace(
                build_report(
                    spec,
                    results[side.name],
                    {},
                    model,
                    f"{out.name}-{side.name}",
                    git=git_info(str(side.tree)),
                ),
                source=str(out / side.name / "report.json"),
            )
            for side in sides
        }
    ab = {"cut": run.cut, "short": short}
    return _verdict(args, spec, out, (ref, commit), results, reports, run.session_of, named, ab)


def _cut_short(run: ABRun, results: dict) -> list[str]:
    """After a run cut by --max-wall-s: the cells with fewer than 3 pairs on either side,
    marked skipped (they cannot be judged); none when the run was whole."""
    if not run.cut:
        return []
    short = []
    for name, cells in results.items():
        for c in cells:
            if c.status == "ok" and c.rounds_done < 3:
                c.status, c.error = "skipped", f"{run.cut}: {c.rounds_done} pair(s) done"
                short.append(f"{name} {c.id} ({c.rounds_done} pairs)")
    return short


def _verdict(
    args,
    spec,
    out: Path,
    baseline: tuple[str, str],
    results: dict,
    reports: dict[str, Report],
    session_of: dict[int, int],
    named: list[str],
    cut: dict,
) -> int:
    """Judge the two sides (paired comparison, the matrix's gates on the candidate), write
    both reports and compare.json / compare.md, then the gate's outcome."""
    ref, commit = baseline
    base, cand = reports["baseline"], reports["candidate"]
    comparison = compare_paired(base, cand, sessions=session_of, also=named)
    done = max((c.rounds for c in cand.cells), default=0)
    comparison["ab"] = {
        "baseline_ref": ref,
        "baseline_commit": commit,
        "pairs": done if cut["cut"] else len(session_of),
        "pairs_planned": len(session_of),
        "cut": cut["cut"],
        "sessions": max(session_of.values()) + 1,
        "order": "A/B on even pairs, B/A on odd pairs",
        "candidate_env": args.candidate_env,
        "baseline_env": args.baseline_env,
    }
    cand = dataclasses.replace(cand, gates=evaluate_gates(spec.gates, cand, comparison))
    reports["candidate"] = cand
    comparison["gates"] = cand.gates.to_json()
    for name, rep in reports.items():
        write_report(dataclasses.replace(rep, source=None), results[name], out / name)
    (out / "compare.json").write_text(json.dumps(comparison, indent=1, default=str))
    write_compare_markdown(comparison, out / "compare.md")
    print_regressions(comparison)
    failed = {n: [c.id for c in r.cells if not c.ok] for n, r in reports.items()}
    status, reason, code = ab_outcome(spec, comparison, cand.gates, failed, named, cut, commit, out)
    if status == "skip":
        return _skip(args, out, reason, code, comparison)
    return _finish(out, comparison, status, reason, code)
