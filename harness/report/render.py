"""The report's shared pieces: value formats, the header lines, the cells, quality and gates
tables, and the parity / determinism stage sections, as ``(header, rows)`` tables.

Each output format lays them out in a module of its own: :mod:`harness.report.render_md`
(REPORT.md), :mod:`harness.report.render_html` (report.html),
:mod:`harness.report.render_compare` (compare.md); the optional sections (HF baseline, MFU,
Server-Timing, ...) are in :mod:`harness.report.render_sections`, the stage and trace tables in
:mod:`harness.report.render_stages`.
"""

from __future__ import annotations

from harness.report.render_stages import Table, determinism_blocks, parity_blocks, stage_line
from harness.run.environment import SOURCE_COMMIT_ENV


def num(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def med_ci(m: dict | None, fmt: str = ".2f") -> str:
    if not m:
        return "-"
    return f"{num(m['median'], fmt)} [{num(m['ci95_low'], fmt)}, {num(m['ci95_high'], fmt)}]"


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def ratio(x) -> str:
    return "-" if x is None else f"{x:.1f}x"


def _host_line(env: dict) -> str:
    probe = env.get("host_probe") or {}
    ms = probe.get("json_256_beams_ms")
    return (
        f"host CPU: {probe.get('cpu_model') or '?'}; host probe "
        + (f"{ms:.3f} ms" if ms is not None else "-")
        + " per 256-beam JSON body, one thread (host phases of two runs compare through it)"
    )


def header_lines(report: dict) -> list[str]:
    env = report["environment"]
    git = env.get("git") or {}
    gpus = ", ".join(g["name"] for g in env.get("gpus") or []) or "none"
    v = env.get("versions") or {}
    dirty = " (dirty)" if git.get("dirty") else ""
    if git.get("tree"):  # a dirty checkout: the files it ran, as a git tree id
        dirty = f" (dirty; files = tree {git['tree']})"
    stop = report.get("interrupted")
    first = []
    if stop:  # a run cut short: say so before anything else
        first = [
            f"INTERRUPTED ({stop['cause']}) after {stop['cells_done']} of "
            f"{stop['cells_selected']} selected cells: only the cells that finished are "
            "reported, later stages (parity, determinism) did not run; `--resume --out` with "
            "this directory runs the rest"
        ]
    return first + [
        f"run `{report['run_id']}`, created {report['created']}",
        f"git {git.get('commit') or '?'}{dirty}"
        + (
            f"; declared source commit {git['declared']} ({SOURCE_COMMIT_ENV}, not checked "
            "against the files)"
            if git.get("declared")
            else ""
        ),
        f"GPU: {gpus}; driver {env.get('driver') or '-'}; CPUs {env.get('cpu_count')}",
        _host_line(env),
        f"torch {v.get('torch')}, flashinfer {v.get('flashinfer-python')}, triton "
        f"{v.get('triton')}, transformers {v.get('transformers')}",
        f"matrix hash {env.get('matrix_hash')}, model hash {env.get('model_hash')}",
    ]


def cells_table(report: dict) -> Table:
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
    for c in report["cells"]:
        m = c["metrics"]
        hf = (c.get("baseline") or {}).get("hf") or {}
        rows.append(
            [
                c["id"],
                c["status"],
                str(c["rounds"]),
                med_ci(m.get("qps")),
                pct((m.get("qps") or {}).get("cv")),
                num((m.get("latency_p50_ms") or {}).get("median"), ".1f"),
                num((m.get("latency_p99_ms") or {}).get("median"), ".1f"),
                pct((m.get("error_rate") or {}).get("median")),
                pct((m.get("invalid_rate") or {}).get("median")),
                str(c["excluded_requests"]["count"]),
                _hf_short(hf),
                ratio(hf.get("speedup")),
                pct((c.get("mfu") or {}).get("mfu")),
                "; ".join(c["notes"]) or (c["error"] if c["status"] != "ok" else ""),
            ]
        )
    return head, rows


def _hf_short(hf: dict) -> str:
    if not hf:
        return "-"
    if hf.get("status") == "ok":
        return num(hf.get("hf_ms_per_request"), ".1f")
    return hf.get("status", "-")


def quality_table(report: dict) -> Table | None:
    names: list[str] = []
    for c in report["cells"]:
        names += [k for k in c["metrics"] if "@" in k and k not in names]
    if not names:
        return None
    rows = [
        [c["id"], *[num((c["metrics"].get(n) or {}).get("median"), ".4f") for n in names]]
        for c in report["cells"]
        if c["status"] == "ok"
    ]
    return ["cell", *names], rows


def gates_table(report: dict) -> Table:
    rows = [
        [
            g["name"],
            g["status"],
            "; ".join(
                f"{c['target']}: {c.get('value', c.get('worse_pct', c.get('better_pct')))}"
                for c in g.get("checks", [])
                if not c["ok"]
            )
            or g.get("reason", ""),
        ]
        for g in report["gates"]["results"]
    ]
    return ["gate", "status", "failing"], rows


STAGE_BLOCKS = {"parity": parity_blocks, "determinism": determinism_blocks}


def stage_blocks(report: dict, name: str) -> tuple[str, list[tuple[str, Table]]]:
    """A stage section's outcome line and its tables (none when it did not run)."""
    stage = report.get(name) or {}
    return stage_line(stage), STAGE_BLOCKS[name](stage)
