"""REPORT.md and report.html from a report dict (the same tables in both)."""

from __future__ import annotations

import base64
import html
import sys
from pathlib import Path

from harness.client import Record
from harness.environment import SOURCE_COMMIT_ENV
from harness.plots import all_plots
from harness.render_stages import (
    Table,
    determinism_blocks,
    parity_blocks,
    stage_line,
    trace_blocks,
    trace_lines,
)


def _num(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _med_ci(m: dict | None, fmt: str = ".2f") -> str:
    if not m:
        return "-"
    return f"{_num(m['median'], fmt)} [{_num(m['ci95_low'], fmt)}, {_num(m['ci95_high'], fmt)}]"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


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
                _med_ci(m.get("qps")),
                _pct((m.get("qps") or {}).get("cv")),
                _num((m.get("latency_p50_ms") or {}).get("median"), ".1f"),
                _num((m.get("latency_p99_ms") or {}).get("median"), ".1f"),
                _pct((m.get("error_rate") or {}).get("median")),
                _pct((m.get("invalid_rate") or {}).get("median")),
                str(c["excluded_requests"]["count"]),
                _hf_short(hf),
                _ratio(hf.get("speedup")),
                _pct((c.get("mfu") or {}).get("mfu")),
                "; ".join(c["notes"]) or (c["error"] if c["status"] != "ok" else ""),
            ]
        )
    return head, rows


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.1f}x"


def _hf_short(hf: dict) -> str:
    if not hf:
        return "-"
    if hf.get("status") == "ok":
        return _num(hf.get("hf_ms_per_request"), ".1f")
    return hf.get("status", "-")


def baseline_table(report: dict) -> Table | None:
    """HF baseline per cell: its timing, the ratios, or why it was skipped / failed."""
    rows = []
    for c in report["cells"]:
        hf = (c.get("baseline") or {}).get("hf")
        if not hf:
            continue
        lat = (c["metrics"].get("latency_mean_ms") or {}).get("median")
        why = hf.get("hf_skipped") or hf.get("hf_error") or ""
        rows.append(
            [
                c["id"],
                hf.get("status", "-"),
                f"{hf.get('hf_requests', '-')} x n={hf.get('beam_width', '-')}, "
                f"{hf.get('dtype', '-')}, {hf.get('device') or '-'}",
                _num(hf.get("prompt_tokens_max"), "d") if hf.get("prompt_tokens_max") else "-",
                _num(hf.get("kv_gib_estimate"), ".3g"),
                _num(hf.get("hf_ms_per_request"), ".1f"),
                _num(hf.get("hf_qps"), ".3g"),
                _med_ci(c["metrics"].get("qps")),
                _num(lat, ".1f"),
                _ratio(hf.get("speedup")),
                _ratio(hf.get("latency_ratio")),
                why.splitlines()[0][:300] if why else "",
            ]
        )
    if not rows:
        return None
    head = [
        "cell",
        "HF status",
        "HF requests",
        "prompt tokens (max)",
        "HF KV GiB (est.)",
        "HF ms/request",
        "HF QPS",
        "FlashRec QPS",
        "FlashRec mean ms",
        "speedup (QPS)",
        "latency ratio (HF / FlashRec)",
        "skipped / error",
    ]
    return head, rows


def mfu_table(report: dict) -> Table | None:
    """FLOPs per request, achieved TFLOP/s and MFU per cell."""
    rows = []
    for c in report["cells"]:
        f = c.get("mfu")
        if not f:
            continue
        m = c["metrics"]
        ceiling = f.get("ceiling_tflops")
        key = f" ({f['by']}={f['ceiling_key']})" if f.get("ceiling_key") else ""
        rows.append(
            [
                c["id"],
                _num(f.get("linear_params", 0) / 1e9, ".4g") if "linear_params" in f else "-",
                str(f.get("decode_rows", "-")),
                _med_ci(m.get("tflop_per_request"), ".4g"),
                _med_ci(m.get("achieved_tflops"), ".4g"),
                ("-" if ceiling is None else f"{ceiling:g}") + key,
                _med_ci(m.get("mfu"), ".3f"),
                f.get("error", ""),
            ]
        )
    if not rows:
        return None
    head = [
        "cell",
        "linear params (B)",
        "decode rows / request",
        "TFLOP / request",
        "achieved TFLOP/s",
        "ceiling TFLOP/s",
        "MFU",
        "note",
    ]
    return head, rows


def server_timing_table(report: dict) -> Table | None:
    """Where a request's latency goes, from the server's Server-Timing header (the
    ``respond`` column only where some cell has it)."""
    cells = [c for c in report["cells"] if "server_engine_ms_mean" in (c.get("metrics") or {})]
    if not cells:
        return None
    respond = any("server_respond_ms_mean" in c["metrics"] for c in cells)
    ipc = any("server_ipc_ms_mean" in c["metrics"] for c in cells)
    gc = any("server_gc_pause_ms" in c["metrics"] for c in cells)
    keys = ["latency_mean_ms", "server_tokenize_ms_mean", "server_queue_ms_mean"]
    keys += ["server_engine_ms_mean"] + (["server_ipc_ms_mean"] if ipc else [])
    keys += ["server_respond_ms_mean"] if respond else []
    keys += ["outside_server_ms_mean"] + (["server_gc_pause_ms"] if gc else [])
    rows = [
        [c["id"]]
        + [_med_ci(c["metrics"].get(k), ".1f") if k in c["metrics"] else "-" for k in keys]
        for c in cells
    ]
    head = ["cell", "client latency ms", "tokenize", "queue", "engine"]
    head += (["ipc"] if ipc else []) + (["respond"] if respond else []) + ["outside the server"]
    head += ["server GC pauses ms / round"] if gc else []
    return head, rows


def burst_table(report: dict) -> Table | None:
    """Cells of a ``burst`` load: latency per request next to the bursts' makespans."""
    cells = [c for c in report["cells"] if "burst_ms_mean" in (c.get("metrics") or {})]
    if not cells:
        return None
    keys = ("latency_mean_ms", "latency_p50_ms", "latency_p99_ms", "burst_ms_mean", "burst_ms_max")
    rows = [
        [c["id"]]
        + [_med_ci(c["metrics"].get(k), ".1f") if k in c["metrics"] else "-" for k in keys]
        for c in cells
    ]
    head = ["cell", "latency mean ms", "p50", "p99", "burst makespan mean ms", "longest burst ms"]
    return head, rows


def closed_table(report: dict) -> Table | None:
    """Cells of a ``closed`` load with a steady-state rate: the round's QPS (first send -> last
    answer) next to the rate while every client had a request in flight."""
    cells = [c for c in report["cells"] if "qps_steady" in (c.get("metrics") or {})]
    if not cells:
        return None
    rows = []
    for c in cells:
        m = c["metrics"]
        q, st = (m.get("qps") or {}).get("median"), (m.get("qps_steady") or {}).get("median")
        share = f"{100 * (1 - q / st):.1f}%" if q and st else "-"
        rows.append([c["id"], _med_ci(m.get("qps")), _med_ci(m.get("qps_steady")), share])
    head = ["cell", "QPS (round)", "QPS while every client is busy", "round time in start / drain"]
    return head, rows


def _sizes(sizes: list) -> str:
    if not sizes:
        return "eager"
    return (
        f"{len(sizes)} sizes, {sizes[0]}..{sizes[-1]} rows"
        if len(sizes) > 1
        else f"{sizes[0]} rows"
    )


def engine_settings_table(report: dict) -> Table | None:
    """What each FlashRec server ran with, as its ``/get_server_info`` reports it after the
    auto knobs resolved on the device (cells whose server says nothing of it are left out)."""
    rows = []
    for c in report["cells"]:
        eng = (((c.get("server") or {}).get("info") or {}).get("engine")) or {}
        eff = eng.get("effective")
        if not isinstance(eff, dict):
            continue
        step = "off"
        if eff.get("step_graph"):
            sizes = eff.get("step_graph_sizes") or []
            step = f"on ({_sizes(sizes)})" if sizes else "on (eager)"
        rows.append(
            [
                c["id"],
                f"{eng.get('device', '-')}, {eng.get('dtype', '-')}".replace("torch.", ""),
                "yes" if eng.get("fp8") else "no",
                str(eng.get("kv_cache_dtype", "-")).replace("torch.", ""),
                str(eng.get("attention_backend", "-")),
                _sizes(eff.get("decode_graph_sizes") or []),
                step,
                str(eff.get("prefill_graph_max_tokens", "-")),
                str(eff.get("piecewise_prefill_max_tokens", "-")),
                {True: "on", False: "off"}.get(eff.get("overlap_results"), "-"),
                "on" if "engine_process_pid" in eng else "off",
            ]
        )
    if not rows:
        return None
    head = ["cell", "device, dtype", "FP8 GEMMs", "KV cache", "attention", "decode graphs"]
    head += ["whole-step graph", "prefill graph tokens", "piecewise prefill tokens"]
    return head + ["overlapped results", "engine process"], rows


def targets_table(report: dict) -> Table | None:
    """Every target x matching cell: met, or missed by how much."""
    t = report.get("targets") or {}
    rows = []
    for r in t.get("results", []):
        for c in r["checks"]:
            rows.append([r["name"], c["cell"], "met" if c["met"] else "MISSED", c["text"]])
        for cell in r["missing"]:
            rows.append([r["name"], cell, "no data", "cell failed or metric missing"])
        if not r["checks"] and not r["missing"]:
            rows.append([r["name"], "-", "no data", "no cell matches"])
    if not rows:
        return None
    return ["target", "cell", "status", "detail"], rows


def quality_table(report: dict) -> Table | None:
    names: list[str] = []
    for c in report["cells"]:
        names += [k for k in c["metrics"] if "@" in k and k not in names]
    if not names:
        return None
    rows = [
        [c["id"], *[_num((c["metrics"].get(n) or {}).get("median"), ".4f") for n in names]]
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


BASELINE_NOTE = (
    "HF = transformers generate(num_beams=n) with the same catalog constraint, on the cell's "
    "first measured prompts, one request at a time, in its own process after the cell's server "
    "stopped; HF QPS = 1000 / ms per request; speedup = FlashRec QPS median / HF QPS; latency "
    "ratio = HF ms per request / FlashRec mean latency."
)
MFU_NOTE = (
    "FLOPs per request = 2 x linear-layer parameters x (prefilled prompt tokens + decode rows), "
    "decode rows = n x (min(max_tokens, SID levels) - 1); attention score FLOPs not counted. "
    "Achieved TFLOP/s = FLOPs per request x QPS (per round); MFU = achieved / ceiling."
)
SERVER_TIMING_NOTE = (
    "Means per round (median [95% CI] over rounds) of the phases the server reports in its "
    "Server-Timing header: tokenize (prompt built from the messages), queue (submitted -> "
    "admitted for prefill), engine (admitted -> ranked beams on the host), ipc (a server "
    "with its engine in a process of its own: beams on the engine's host -> the server "
    "process), respond (where the server reports it: from there -> answer text built, i.e. "
    "result objects, the "
    "hand-off to the event loop and JSON encoding). Outside the server = client latency - "
    "their sum: HTTP and event-loop time on both sides (and, for servers without respond, "
    "the answer's encoding). Server GC pauses: the server's garbage-collector time during "
    "the round (its /metrics before and after), which stops every server thread."
)
BURST_NOTE = (
    "Load mode burst: each burst sends `concurrency` requests at once and the next burst "
    "starts when all of them are answered. Latency is per request; the makespan of a burst "
    "runs from its first send to its last answer (bursts whose every request succeeded). "
    "Medians [95% CI] over rounds."
)
CLOSED_NOTE = (
    "Closed loop: the QPS of a round runs from its first send to its last answer, so it also "
    "holds the start (nothing answered yet) and the drain (fewer and fewer requests left). The "
    "steady rate counts the answers between the c-th and the (N-c)-th of the round's N (c "
    "clients), while every client had a request in flight; the last column is how much of the "
    "round's time start and drain cost against that rate (negative when the middle of the round "
    "ran slower than the whole, as when clients move in waves). Rounds of a few requests per "
    "client lose most. The cells table and the targets use the round QPS. Medians [95% CI] over "
    "rounds."
)
ENGINE_SETTINGS_NOTE = (
    "What each server reported at start, after its auto knobs resolved on the device: decode "
    "CUDA graphs and their batch sizes, the whole-step decode graph, the largest buckets of "
    "the one-prompt and piecewise prefill graphs (0 = off), whether finished requests' "
    "results were handed back one step later while the GPU ran on (--overlap-results; - = a "
    "server that does not report it), and whether the engine ran in a process of its own."
)
TARGETS_NOTE = (
    "Targets are goals: a missed one is reported with the shortfall, the ratio actual / target "
    "and the factor still needed; it changes the exit code only with fail_run: true."
)


def _extra_tables(report: dict) -> list[tuple[str, Table, str]]:
    """(title, table, note) of the HF baseline, MFU and targets sections that have content."""
    out = []
    b = baseline_table(report)
    if b:
        out.append(("HF transformers baseline (same run)", b, BASELINE_NOTE))
    m = mfu_table(report)
    if m:
        out.append(("Model-FLOP utilisation", m, MFU_NOTE))
    st = server_timing_table(report)
    if st:
        out.append(("Where the latency goes (Server-Timing)", st, SERVER_TIMING_NOTE))
    bt = burst_table(report)
    if bt:
        out.append(("Bursts (requests sent together)", bt, BURST_NOTE))
    ct = closed_table(report)
    if ct:
        out.append(("Closed loop: round QPS and the steady rate", ct, CLOSED_NOTE))
    t = targets_table(report)
    if t:
        status = (report.get("targets") or {}).get("status")
        out.append((f"Targets: {status}", t, TARGETS_NOTE))
    es = engine_settings_table(report)
    if es:
        out.append(("Engine settings (from /get_server_info)", es, ENGINE_SETTINGS_NOTE))
    return out


STAGE_BLOCKS = {"parity": parity_blocks, "determinism": determinism_blocks}


def _stage_blocks(report: dict, name: str) -> tuple[str, list[tuple[str, Table]]]:
    """A stage section's outcome line and its tables (none when it did not run)."""
    stage = report.get(name) or {}
    return stage_line(stage), STAGE_BLOCKS[name](stage)


# --------------------------------------------------------------------------- markdown


def _md_table(t: Table) -> list[str]:
    head, rows = t
    esc = [[str(x).replace("|", "\\|").replace("\n", " ") for x in r] for r in rows]
    return (
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        + ["| " + " | ".join(r) + " |" for r in esc]
        + [""]
    )


def write_markdown(report: dict, path: Path) -> None:
    name = report["matrix"].get("name") or "matrix"
    lines = [f"# flashrec-bench: {name}", ""] + [f"- {x}" for x in header_lines(report)] + [""]
    lines += (
        ["## How it was measured", ""] + [f"- {r}" for r in report["measurement"]["rules"]] + [""]
    )
    lines += ["## Cells", ""] + _md_table(cells_table(report))
    q = quality_table(report)
    if q:
        lines += ["## Quality", ""] + _md_table(q)
    for title, table, note in _extra_tables(report):
        lines += [f"## {title}", "", note, ""] + _md_table(table)
    traces = trace_lines(report)
    lines += ["## Traces", ""] + (traces or ["no traced cells"]) + [""]
    for c in report["cells"]:
        if c["status"] == "failed":
            lines += [
                f"## Failed: {c['id']}",
                "",
                c["error"],
                "",
                "```",
                c["log_tail"].rstrip() or "(empty log)",
                "```",
                "",
            ]
    for stage in ("parity", "determinism"):
        line, blocks = _stage_blocks(report, stage)
        lines += [f"## {stage.title()}", "", line, ""]
        for title, table in blocks:
            lines += [f"### {title}", ""] + _md_table(table)
    lines += [f"## Gates: {report['gates']['status']}", ""]
    if report["gates"]["results"]:
        lines += _md_table(gates_table(report))
    path.write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- html


def _html_table(t: Table) -> str:
    head, rows = t
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


_CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;"
    "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}"
    "th{background:#eee}pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}"
)


def write_html(report: dict, records: list[Record], path: Path) -> None:
    name = html.escape(report["matrix"].get("name") or "matrix")
    parts = [
        f"<html><head><meta charset='utf-8'><title>{name}</title><style>{_CSS}</style>"
        f"</head><body><h1>flashrec-bench: {name}</h1><ul>"
    ]
    parts += [f"<li>{html.escape(x)}</li>" for x in header_lines(report)] + ["</ul>"]
    parts += (
        ["<h2>How it was measured</h2><ul>"]
        + [f"<li>{html.escape(r)}</li>" for r in report["measurement"]["rules"]]
        + ["</ul>"]
    )
    parts += ["<h2>Cells</h2>", _html_table(cells_table(report))]
    q = quality_table(report)
    if q:
        parts += ["<h2>Quality</h2>", _html_table(q)]
    for title, table, note in _extra_tables(report):
        parts += [f"<h2>{html.escape(title)}</h2><p>{html.escape(note)}</p>", _html_table(table)]
    plots = all_plots(report, records)
    parts.append(
        "<h2>Plots</h2>"
        if plots
        else "<h2>Plots</h2><p>none (matplotlib missing or nothing to plot)</p>"
    )
    for title, png in plots:
        b64 = base64.b64encode(png).decode()
        parts.append(f"<h3>{html.escape(title)}</h3><img src='data:image/png;base64,{b64}'/>")
    parts.append("<h2>Traces</h2>")
    traces = trace_blocks(report)
    parts += [] if traces else ["<p>no traced cells</p>"]
    for title, table in traces:
        parts += [f"<h3>{html.escape(title)}</h3>", _html_table(table)]
    for c in report["cells"]:
        if c["status"] == "failed":
            parts += [
                f"<h2>Failed: {html.escape(c['id'])}</h2><p>{html.escape(c['error'])}</p>"
                f"<pre>{html.escape(c['log_tail'])}</pre>"
            ]
    for stage in ("parity", "determinism"):
        line, blocks = _stage_blocks(report, stage)
        parts.append(f"<h2>{stage.title()}</h2><p>{html.escape(line)}</p>")
        for title, table in blocks:
            parts += [f"<h3>{html.escape(title)}</h3>", _html_table(table)]
    parts.append(f"<h2>Gates: {html.escape(report['gates']['status'])}</h2>")
    if report["gates"]["results"]:
        parts.append(_html_table(gates_table(report)))
    parts.append("</body></html>")
    path.write_text("\n".join(parts))


def _p_text(r: dict) -> str:
    """``p 0.012`` or, after a correction, ``p 0.012, Holm 0.048``."""
    text = f"p {_num(r.get('p_value'), '.3g')}"
    return text + (f", Holm {_num(r['p_adjusted'], '.3g')}" if "p_adjusted" in r else "")


def print_regressions(comparison: dict) -> None:
    """One stderr line per regressed metric of a comparison."""
    for r in comparison["regressions"]:
        print(
            f"REGRESSED {r['cell']} {r['metric']}: {r['base']:.4g} -> {r['new']:.4g} "
            f"({r['delta_pct']:+.1f}%, band {r['band_pct']:.1f}%, {_p_text(r)})",
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
    lines.append("")
    head = ["cell", "metric", "base", "new", "delta", "band", "p", "p (Holm)", "verdict"]
    rows = []
    for c in comparison["cells"]:
        if c["status"] != "compared":
            rows.append([c["id"], "-", "-", "-", "-", "-", "-", "-", c["status"]])
            continue
        for m, r in c["metrics"].items():
            rows.append(
                [
                    c["id"],
                    m,
                    _num(r.get("base"), ".4g"),
                    _num(r.get("new"), ".4g"),
                    _num(r.get("delta_pct"), "+.1f") + "%",
                    _num(r.get("band_pct"), ".1f") + "%",
                    _num(r.get("p_value"), ".3g"),
                    _num(r.get("p_adjusted"), ".3g"),
                    r["verdict"],
                ]
            )
    order = {"regressed": 0, "improved": 1, "inconclusive": 2}
    rows.sort(key=lambda r: order.get(r[-1], 3))
    lines += _md_table((head, rows))
    gates = comparison.get("gates")
    if gates and gates["results"]:
        lines += [f"## Gates: {gates['status']}", ""]
        lines += _md_table(gates_table({"gates": gates}))
    path.write_text("\n".join(lines) + "\n")
