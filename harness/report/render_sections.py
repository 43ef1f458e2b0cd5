"""The report's optional sections as tables, each with the note that explains it: HF
baseline, MFU, Server-Timing, bursts, closed-loop steady rate, targets, engine settings.
:func:`extra_tables` lists the ones a report has content for, in the order both formats show
them.
"""

from __future__ import annotations

from harness.metrics import host
from harness.report.engines import ENGINES_NOTE, engines_table
from harness.report.model import Report, as_report
from harness.report.render import med_ci, num, ratio
from harness.report.render_replicas import REPLICAS_NOTE, replicas_table
from harness.report.render_stages import Table


def baseline_table(report: Report | dict) -> Table | None:
    """HF baseline per cell: its timing, the ratios, or why it was skipped / failed."""
    report = as_report(report)
    rows = []
    for c in report.cells:
        hf = c.hf
        if not hf:
            continue
        lat = c.median("latency_mean_ms")
        why = hf.get("hf_skipped") or hf.get("hf_error") or ""
        rows.append(
            [
                c.id,
                hf.get("status", "-"),
                f"{hf.get('hf_requests', '-')} x n={hf.get('beam_width', '-')}, "
                f"{hf.get('dtype', '-')}, {hf.get('device') or '-'}",
                num(hf.get("prompt_tokens_max"), "d") if hf.get("prompt_tokens_max") else "-",
                num(hf.get("kv_gib_estimate"), ".3g"),
                num(hf.get("hf_ms_per_request"), ".1f"),
                num(hf.get("hf_qps"), ".3g"),
                med_ci(c.metrics.get("qps")),
                num(lat, ".1f"),
                ratio(hf.get("speedup")),
                ratio(hf.get("latency_ratio")),
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


def mfu_table(report: Report | dict) -> Table | None:
    """FLOPs per request, achieved TFLOP/s and MFU per cell."""
    report = as_report(report)
    rows = []
    for c in report.cells:
        f = c.mfu
        if not f:
            continue
        m = c.metrics
        ceiling = f.get("ceiling_tflops")
        key = f" ({f['by']}={f['ceiling_key']})" if f.get("ceiling_key") else ""
        rows.append(
            [
                c.id,
                num(f.get("linear_params", 0) / 1e9, ".4g") if "linear_params" in f else "-",
                str(f.get("decode_rows", "-")),
                med_ci(m.get("tflop_per_request"), ".4g"),
                med_ci(m.get("achieved_tflops"), ".4g"),
                ("-" if ceiling is None else f"{ceiling:g}") + key,
                med_ci(m.get("mfu"), ".3f"),
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


# harness.metrics.host.SERVER_METRICS as columns
CPU_HEADS = {
    "server_cpu_ms_per_request": "server CPU ms / request (all its processes)",
    "server_main_cpu_ms_per_request": "server process CPU ms / request",
    "server_main_cpu_cores": "server process CPU cores",
}


def server_timing_table(report: Report | dict) -> Table | None:
    """Where a request's latency goes, from the server's Server-Timing header (the
    ``respond`` column only where some cell has it)."""
    report = as_report(report)
    cells = [c for c in report.cells if "server_engine_ms_mean" in (c.metrics or {})]
    if not cells:
        return None
    respond = any("server_respond_ms_mean" in c.metrics for c in cells)
    handoff = any("server_handoff_ms_mean" in c.metrics for c in cells)
    body_cpu = any("server_body_cpu_ms_mean" in c.metrics for c in cells)
    ipc = any("server_ipc_ms_mean" in c.metrics for c in cells)
    gc = any("server_gc_pause_ms" in c.metrics for c in cells)
    other = any("host_other_cpu_cores" in c.metrics for c in cells)
    client = any("harness_cpu_cores" in c.metrics for c in cells)
    cpu = [k for k in host.SERVER_METRICS if any(k in c.metrics for c in cells)]
    keys = ["latency_mean_ms", "server_tokenize_ms_mean", "server_queue_ms_mean"]
    keys += ["server_engine_ms_mean"] + (["server_ipc_ms_mean"] if ipc else [])
    keys += ["server_respond_ms_mean"] if respond else []
    keys += ["server_handoff_ms_mean"] if handoff else []
    keys += ["server_body_cpu_ms_mean"] if body_cpu else []
    keys += ["outside_server_ms_mean"] + (["server_gc_pause_ms"] if gc else [])
    fmt = dict.fromkeys(("host_other_cpu_cores", "harness_cpu_cores", *host.SERVER_METRICS), ".2f")
    keys += cpu
    keys += ["host_other_cpu_cores"] if other else []
    keys += ["harness_cpu_cores"] if client else []
    rows = [
        [c.id]
        + [med_ci(c.metrics.get(k), fmt.get(k, ".1f")) if k in c.metrics else "-" for k in keys]
        for c in cells
    ]
    head = ["cell", "client latency ms", "tokenize", "queue", "engine"]
    head += (["ipc"] if ipc else []) + (["respond"] if respond else [])
    head += ["of respond: hand-off"] if handoff else []
    head += (["after it: event-loop CPU"] if body_cpu else []) + ["outside the server"]
    head += ["server GC pauses ms / round"] if gc else []
    head += [CPU_HEADS[k] for k in cpu]
    head += ["other processes' CPU cores"] if other else []
    head += ["load generator CPU cores"] if client else []
    return head, rows


def burst_table(report: Report) -> Table | None:
    """Cells of a ``burst`` load: latency per request next to the bursts' makespans."""
    cells = [c for c in report.cells if "burst_ms_mean" in (c.metrics or {})]
    if not cells:
        return None
    keys = ("latency_mean_ms", "latency_p50_ms", "latency_p99_ms", "burst_ms_mean", "burst_ms_max")
    rows = [
        [c.id] + [med_ci(c.metrics.get(k), ".1f") if k in c.metrics else "-" for k in keys]
        for c in cells
    ]
    head = ["cell", "latency mean ms", "p50", "p99", "burst makespan mean ms", "longest burst ms"]
    return head, rows


def closed_table(report: Report) -> Table | None:
    """Cells of a ``closed`` load with a steady-state rate: the round's QPS (first send -> last
    answer) next to the rate while every client had a request in flight."""
    cells = [c for c in report.cells if "qps_steady" in (c.metrics or {})]
    if not cells:
        return None
    rows = []
    for c in cells:
        m = c.metrics
        q, st = c.median("qps"), c.median("qps_steady")
        share = f"{100 * (1 - q / st):.1f}%" if q and st else "-"
        rows.append([c.id, med_ci(m.get("qps")), med_ci(m.get("qps_steady")), share])
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


def _attention(eng: dict) -> str:
    """The attention backend, and where the decode's prompt part left the Triton kernel
    (``--decode-prompt-attention``), what it runs instead."""
    name = str(eng.get("attention_backend", "-"))
    prompt = eng.get("decode_prompt_attention")
    return f"{name} (decode prompt: {prompt})" if prompt and prompt != "triton" else name


def engine_settings_table(report: Report | dict) -> Table | None:
    """What each FlashRec server ran with, as its ``/get_server_info`` reports it after the
    auto knobs resolved on the device (cells whose server says nothing of it are left out)."""
    report = as_report(report)
    rows = []
    for c in report.cells:
        eng = (((c.server or {}).get("info") or {}).get("engine")) or {}
        eff = eng.get("effective")
        if not isinstance(eff, dict):
            continue
        step = "off"
        if eff.get("step_graph"):
            sizes = eff.get("step_graph_sizes") or []
            step = f"on ({_sizes(sizes)})" if sizes else "on (eager)"
        rows.append(
            [
                c.id,
                f"{eng.get('device', '-')}, {eng.get('dtype', '-')}".replace("torch.", ""),
                "yes" if eng.get("fp8") else "no",
                str(eng.get("kv_cache_dtype", "-")).replace("torch.", ""),
                _attention(eng),
                _sizes(eff.get("decode_graph_sizes") or []),
                step,
                str(eff.get("prefill_graph_max_tokens", "-")),
                str(eff.get("piecewise_prefill_max_tokens", "-")),
                {True: "on", False: "off"}.get(eff.get("overlap_results"), "-"),
                "on" if "engine_process_pid" in eng else "off",
                _start(c.server or {}),
            ]
        )
    if not rows:
        return None
    head = ["cell", "device, dtype", "FP8 GEMMs", "KV cache", "attention", "decode graphs"]
    head += ["whole-step graph", "prefill graph tokens", "piecewise prefill tokens"]
    return head + ["overlapped results", "engine process", "server start s"], rows


def _start(server: dict) -> str:
    """The cell's server's launch -> healthy seconds ("-": an external or reused server's)."""
    s = server.get("startup_s")
    return f"{s:.1f}" if isinstance(s, int | float) else "-"


def targets_table(report: Report | dict) -> Table | None:
    """Every target x matching cell: met, or missed by how much."""
    report = as_report(report)
    rows = []
    for r in report.targets.results:
        for c in r.checks:
            rows.append([r.name, c.cell, "met" if c.met else "MISSED", c.text])
        for cell in r.missing:
            why = (r.missing_why or {}).get(cell) or "cell failed or metric missing"
            rows.append([r.name, cell, "no data", why])
        if not r.checks and not r.missing:
            rows.append([r.name, "-", "no data", "no cell matches"])
    if not rows:
        return None
    return ["target", "cell", "status", "detail"], rows


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
    "hand-off to the event loop and JSON encoding). Of respond, hand-off (where the server "
    "reports it): the part up to the request's handler holding the result on the event "
    "loop, the rest being the answer's encoding; after it, event-loop CPU (where the server "
    "reports it): the event loop thread's CPU time over that rest, so that the rest less it "
    "is time the loop waited (for the GIL, or its core) rather than ran. Outside the server "
    "= client latency - their sum (neither detail counted again): HTTP and event-loop time "
    "on both sides (and, "
    "for servers without respond, the answer's encoding). Server GC pauses: the server's "
    "garbage-collector time during the round (its /metrics before and after), which stops "
    "every server thread. Server "
    "CPU: its process group's CPU time during the round per request sent; the server "
    "process's own share (a launched FlashRec server: with --engine-process, the HTTP side "
    "alone), per request and in cores: near one core, that process's GIL is the limit. Other "
    "processes' CPU cores: the host's busy CPU time during the round minus the server's "
    "process group's and the harness's, over the round's wall time (a launched server on "
    "Linux); well above 0, the round shared the host's CPUs with other work."
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
    "server that does not report it), whether the engine ran in a process of its own, and "
    "how long its server took from launch to answering /health (- for a server the run did "
    "not launch)."
)
TARGETS_NOTE = (
    "Targets are goals: a missed one is reported with the shortfall, the ratio actual / target "
    "and the factor still needed; it changes the exit code only with fail_run: true."
)


def _targets_title(report: Report) -> str:
    return f"Targets: {report.targets.status}"


# (title or title(report), table builder, note) of the optional sections, in report order
SECTIONS = (
    ("Engines side by side", engines_table, ENGINES_NOTE),
    ("HF transformers baseline (same run)", baseline_table, BASELINE_NOTE),
    ("Model-FLOP utilisation", mfu_table, MFU_NOTE),
    ("Where the latency goes (Server-Timing)", server_timing_table, SERVER_TIMING_NOTE),
    ("Bursts (requests sent together)", burst_table, BURST_NOTE),
    ("Closed loop: round QPS and the steady rate", closed_table, CLOSED_NOTE),
    ("Prefix cache and replicas", replicas_table, REPLICAS_NOTE),
    (_targets_title, targets_table, TARGETS_NOTE),
    ("Engine settings (from /get_server_info)", engine_settings_table, ENGINE_SETTINGS_NOTE),
)


def extra_tables(report: Report | dict) -> list[tuple[str, Table, str]]:
    """(title, table, note) of the HF baseline, MFU and targets sections that have content."""
    report = as_report(report)
    out = []
    for title, build, note in SECTIONS:
        table = build(report)
        if table:
            out.append((title if isinstance(title, str) else title(report), table, note))
    return out
