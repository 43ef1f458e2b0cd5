"""The report's shared pieces: value formats, the header lines, the cells, quality and gates
tables, and the parity / determinism stage sections, as ``(header, rows)`` tables.

Each output format lays them out in a module of its own: :mod:`harness.report.render_md`
(REPORT.md), :mod:`harness.report.render_html` (report.html),
:mod:`harness.report.render_compare` (compare.md); the optional sections (HF baseline, MFU,
Server-Timing, ...) are in :mod:`harness.report.render_sections`, the stage and trace tables in
:mod:`harness.report.render_stages`.
"""

from __future__ import annotations

from harness.report.model import Environment, Gates, Metric, Report, as_report
from harness.report.render_stages import Table, determinism_blocks, parity_blocks, stage_line
from harness.run.environment import SOURCE_COMMIT_ENV


def num(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def med_ci(m: Metric | None, fmt: str = ".2f") -> str:
    if not m:
        return "-"
    return f"{num(m.median, fmt)} [{num(m.ci95_low, fmt)}, {num(m.ci95_high, fmt)}]"


def median(metrics: dict[str, Metric], name: str) -> float | None:
    """The median of metric ``name`` among ``metrics`` (None when absent)."""
    m = metrics.get(name)
    return m.median if m else None


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def ratio(x) -> str:
    return "-" if x is None else f"{x:.1f}x"


def _host_line(env: Environment) -> str:
    probe = env.host_probe or {}
    ms = probe.get("json_256_beams_ms")
    return (
        f"host CPU: {probe.get('cpu_model') or '?'}; host probe "
        + (f"{ms:.3f} ms" if ms is not None else "-")
        + " per json.dumps of a built 256-beam body, one thread: a yardstick of the host's"
        " speed (host phases of two runs compare through it), not the served body, which is"
        " built too"
    )


def header_lines(report: Report | dict) -> list[str]:
    report = as_report(report)
    env = report.environment
    git = env.git
    gpus = ", ".join(g["name"] for g in env.gpus or []) or "none"
    v = env.versions or {}
    dirty = " (dirty)" if git.dirty else ""
    if git.tree:  # a dirty checkout: the files it ran, as a git tree id
        dirty = f" (dirty; files = tree {git.tree})"
    stop = report.interrupted
    first = []
    if stop:  # a run cut short: say so before anything else
        first = [
            f"INTERRUPTED ({stop.cause}) after {stop.cells_done} of "
            f"{stop.cells_selected} selected cells: only the cells that finished are "
            "reported, later stages (parity, determinism) did not run; `--resume --out` with "
            "this directory runs the rest"
        ]
    return first + [
        f"run `{report.run_id}`, created {report.created}",
        f"git {git.commit or '?'}{dirty}"
        + (
            f"; declared source commit {git.declared} ({SOURCE_COMMIT_ENV}, not checked "
            "against the files)"
            if git.declared
            else ""
        ),
        f"GPU: {gpus}; driver {env.driver or '-'}; CPUs {env.cpu_count}",
        _host_line(env),
        f"torch {v.get('torch')}, flashinfer {v.get('flashinfer-python')}, triton "
        f"{v.get('triton')}, transformers {v.get('transformers')}",
        f"matrix hash {env.matrix_hash}, model hash {env.model_hash}",
    ]


def cells_table(report: Report | dict) -> Table:
    report = as_report(report)
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
        "HF ms/req",
        "vs HF (QPS)",
        "MFU",
        "notes",
    ]
    rows = []
    for c in report.cells:
        m = c.metrics
        hf = c.hf
        qps = m.get("qps")
        rows.append(
            [
                c.id,
                c.status,
                str(c.rounds),
                med_ci(qps),
                pct(qps.cv if qps else None),
                num(median(m, "latency_p50_ms"), ".1f"),
                num(median(m, "latency_p99_ms"), ".1f"),
                pct(median(m, "error_rate")),
                pct(median(m, "invalid_rate")),
                str(c.excluded_requests["count"]),
                _hf_short(hf),
                ratio(hf.get("speedup")),
                pct((c.mfu or {}).get("mfu")),
                "; ".join(c.notes) or (c.error if c.status != "ok" else ""),
            ]
        )
    return head, rows


def _hf_short(hf: dict) -> str:
    if not hf:
        return "-"
    if hf.get("status") == "ok":
        return num(hf.get("hf_ms_per_request"), ".1f")
    return hf.get("status", "-")


def quality_table(report: Report | dict) -> Table | None:
    report = as_report(report)
    names: list[str] = []
    for c in report.cells:
        names += [k for k in c.metrics if "@" in k and k not in names]
    if not names:
        return None
    rows = [
        [c.id, *[num(c.median(n), ".4f") for n in names]] for c in report.cells if c.status == "ok"
    ]
    return ["cell", *names], rows


def gates_table(gates: Gates) -> Table:
    rows = [
        [
            g.name,
            g.status,
            "; ".join(f"{c.target}: {c.shown}" for c in g.checks or () if not c.ok)
            or g.reason
            or "",
        ]
        for g in gates.results
    ]
    return ["gate", "status", "failing"], rows


STAGE_BLOCKS = {"parity": parity_blocks, "determinism": determinism_blocks}


def stage_blocks(report: Report, name: str) -> tuple[str, list[tuple[str, Table]]]:
    """A stage section's outcome line and its tables (none when it did not run)."""
    stage = report.stage(name).body
    return stage_line(stage), STAGE_BLOCKS[name](stage)
