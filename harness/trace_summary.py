"""A summary of a chrome trace (torch profiler JSON): where the time went, in a few numbers.

GPU fields: busy fraction (union of kernel / memcpy / memset time over the span from the first
to the last of them), the largest gaps between them, CUDA-graph replays (``cudaGraphLaunch``
runtime calls; ``decode_graph_replay`` counts only those inside FlashRec's decode spans, since
prefill replays graphs too), top kernels by time and whether the GEMMs are FP8 kernels. On a CPU-only trace
those fields are ``"n/a"`` and the CPU operator time is what the summary reports.

Where the GPU waits (``gpu_idle_by_host``): every gap between GPU operations is charged to the
outermost host annotation (``record_function`` span, e.g. ``flashrec.prefill``) running at its
midpoint, or to ``(no host span)`` when none is: then the host was outside annotated code,
e.g. an engine waiting for requests. ``limit`` reads the result: ``gpu-bound`` when the GPU is
busy >= 80% of the window (naming, where the trace has device-side spans, the span with most
GPU time and its leading kernel), else ``host-bound`` naming the host span it waited on most.

Where the GPU works (``gpu_time_by_span``): every kernel / memcpy / memset is charged to the
outermost device-side annotation it starts in (``gpu_user_annotation``: the profiler's device
copy of a host span such as ``flashrec.prefill`` or ``flashrec.decode_step``; a CUDA-graph
replay's kernels fall in the span that launched it), with each span's top kernels by time,
their launch count, mean and longest launch, and the registers per thread the profiler
recorded (255 on NVIDIA GPUs is the ceiling: a kernel there likely spills).

Also: ``host_stalls`` (allocator calls and synchronizations, count and time) and the decode
cadence (``decode_steps``, mean decode span, mean interval between decode starts).

One span's inside (``span_breakdown``, ``--span NAME`` on the command line): every occurrence
of a host annotation, its direct children on its thread (nested annotations, operators,
runtime calls; each counted once, at the outermost level inside the span) by total time, the
span's own time outside them, and the GPU work it launched (kernels / copies whose runtime
call, matched by correlation id, ran inside it; a graph replay's kernels count for the span
that launched the graph).
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

NA = "n/a"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
GEMM = re.compile(r"gemm|matmul|cutlass|xmma|nvjet|cublas|scaled_mm|_mm_|wgmma", re.I)
# attention kernels also use wgmma / gemm-like names: never count them as GEMMs
ATTENTION = re.compile(r"sdpa|fmha|flash|attention|attn|beam_decode", re.I)
# cuBLASLt "nvjet_sm90_qq..." kernels take two e4m3 operands (what torch._scaled_mm launches)
FP8 = re.compile(r"fp8|e4m3|e5m2|scaled_mm|f8f8|nvjet_sm\d+_qq", re.I)
GRAPH_LAUNCH = {"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"}
STEP_SPANS = ("flashrec.schedule", "flashrec.step")
# FlashRec's decode host spans: a graph launch inside one is a decode replay (the prefill
# graphs launch inside flashrec.prefill)
DECODE_SPANS = ("flashrec.decode", "flashrec.decode_step")
# host spans that launch one model forward: GPU idle inside them is launch overhead
FORWARD_SPANS = ("flashrec.prefill", *DECODE_SPANS, "flashrec.layer")
KERNEL_LAUNCH = {"cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"}
NO_SPAN = "(no host span)"
GAP_THRESHOLD_US = 300.0  # GPU gaps longer than this are counted and summed (gaps_over)
GPU_BOUND_BUSY = 0.8  # busy fraction from which a trace reads as GPU-bound


def load_events(path: str | Path) -> list[dict]:
    """The ``traceEvents`` of a chrome trace file (``.json`` or ``.json.gz``)."""
    p = Path(path)
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt") as f:
        data = json.load(f)
    return data.get("traceEvents", []) if isinstance(data, dict) else list(data)


def _union(intervals: list[tuple[float, float, str]]) -> list[tuple[float, float, str, str]]:
    """Merged busy intervals (start, end, first name, last name), sorted."""
    merged: list[list[Any]] = []
    for start, end, name in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1][1], merged[-1][3] = end, name
        else:
            merged.append([start, end, name, name])
    return [tuple(m) for m in merged]


def _top(totals: dict[str, list[float]], total: float, k: int) -> list[dict]:
    rows = sorted(totals.items(), key=lambda kv: -kv[1][0])[:k]
    return [
        {
            "name": name[:160],
            "total_us": round(t, 1),
            "count": int(c),
            "pct": round(100 * t / total, 2) if total else None,
        }
        for name, (t, c) in rows
    ]


def _gpu_spans(events: list[dict]) -> list[tuple[float, float, str]]:
    """(start, end, name) of every kernel / memcpy / memset."""
    return [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), str(e.get("name", "")))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS
    ]


def _decode_spans(events: list[dict]) -> list[tuple[float, float, str]]:
    """(start, end, name) of FlashRec's decode host spans, by start."""
    return sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), str(e["name"]))
        for e in events
        if e.get("ph") == "X" and e.get("name") in DECODE_SPANS
    )


def _decode_graph_launches(events: list[dict]) -> int | None:
    """Graph launches inside FlashRec's decode spans; None when the trace has no decode span
    (another engine's trace, or one without decode steps)."""
    decode = _decode_spans(events)
    if not decode:
        return None
    merged = _union(decode)
    starts = [m[0] for m in merged]
    n = 0
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in GRAPH_LAUNCH:
            ts = float(e.get("ts", 0))
            i = bisect.bisect_right(starts, ts) - 1
            n += i >= 0 and ts <= merged[i][1]
    return n


def _gpu(
    events: list[dict], spans: list[tuple[float, float, str]], merged: list, top_k: int, gaps_k: int
) -> dict[str, Any]:
    runtime = [e.get("name") for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    graph = sum(1 for n in runtime if n in GRAPH_LAUNCH)
    launches = sum(1 for n in runtime if n in KERNEL_LAUNCH)
    decode = _decode_graph_launches(events)
    # FlashRec traces: replays inside decode spans; others: any graph launch
    replay = decode > 0 if decode is not None else graph > 0
    decode_field = decode if decode is not None else NA
    if not spans:
        return {
            "gpu_busy_fraction": NA,
            "largest_gaps_us": NA,
            "gaps_over": NA,
            "cuda_graph_launches": graph if runtime else NA,
            "decode_graph_launches": decode_field if runtime else NA,
            "kernel_launches": launches if runtime else NA,
            "decode_graph_replay": replay if runtime else NA,
            "top_kernels": NA,
            "gemm": NA,
        }
    busy = sum(m[1] - m[0] for m in merged)
    span = merged[-1][1] - merged[0][0]
    between = [(b[0] - a[1], a, b) for a, b in zip(merged, merged[1:])]  # (gap, before, after)
    gaps = sorted(
        (
            {
                "gap_us": round(gap, 1),
                "at_us": round(a[1] - merged[0][0], 1),
                "before": a[3][:120],
                "after": b[2][:120],
            }
            for gap, a, b in between
        ),
        key=lambda g: -g["gap_us"],
    )[:gaps_k]
    # every gap over GAP_THRESHOLD_US: how often and how long the GPU waited (a step boundary
    # waiting for the host shows up here; the launch-sized gaps between kernels do not)
    long = [gap for gap, _, _ in between if gap > GAP_THRESHOLD_US]
    gaps_over = {
        "threshold_us": GAP_THRESHOLD_US,
        "count": len(long),
        "total_us": round(sum(long), 1),
        "fraction": round(sum(long) / span, 4) if span > 0 else NA,
    }
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for start, end, name in spans:
        kernels[name][0] += end - start
        kernels[name][1] += 1
    gemms = {n: v for n, v in kernels.items() if GEMM.search(n) and not ATTENTION.search(n)}
    gemm_us = sum(v[0] for v in gemms.values())
    fp8_us = sum(v[0] for n, v in gemms.items() if FP8.search(n))
    return {
        "gpu_busy_fraction": round(busy / span, 4) if span > 0 else NA,
        "largest_gaps_us": gaps,
        "gaps_over": gaps_over,
        "cuda_graph_launches": graph,
        "decode_graph_launches": decode_field,
        "kernel_launches": launches,
        "decode_graph_replay": replay,
        "top_kernels": _top(kernels, busy, top_k),
        "gemm": {
            "total_us": round(gemm_us, 1),
            "fp8_us": round(fp8_us, 1),
            "fp8_fraction": round(fp8_us / gemm_us, 4) if gemm_us else NA,
            "is_fp8": bool(gemm_us) and fp8_us / gemm_us > 0.5,
            "top": _top(gemms, gemm_us, 5),
        },
    }


def _outermost_spans(
    events: list[dict], cat: str = "user_annotation"
) -> list[tuple[float, float, str]]:
    """Annotations of category ``cat`` (host ones by default) not nested in a longer one that
    started before them, by start."""
    spans = sorted(
        (
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), str(e.get("name", "")))
            for e in events
            if e.get("ph") == "X"
            and e.get("cat") == cat
            and not str(e.get("name", "")).startswith("ProfilerStep#")
        ),
        key=lambda s: (s[0], -s[1]),
    )
    out: list[tuple[float, float, str]] = []
    for sp in spans:
        if out and sp[1] <= out[-1][1]:
            continue  # inside the previous outer span
        out.append(sp)
    return out


def idle_by_host(events: list[dict], top_k: int = 6, merged: list | None = None) -> dict[str, Any]:
    """GPU idle time (the gaps of the merged GPU busy intervals) by the outermost host span
    running at each gap's midpoint; ``limit`` as in the module docstring. {} without GPU ops.
    ``merged``: the union of the GPU spans when the caller has it already."""
    if merged is None:
        merged = _union(_gpu_spans(events))
    if not merged:
        return {}
    window = merged[-1][1] - merged[0][0]
    busy = sum(m[1] - m[0] for m in merged)
    outer = _outermost_spans(events)
    starts = [sp[0] for sp in outer]
    idle: dict[str, float] = defaultdict(float)
    for a, b in zip(merged, merged[1:]):
        gap = b[0] - a[1]
        if gap <= 0:
            continue
        mid = a[1] + gap / 2
        i = bisect.bisect_right(starts, mid) - 1
        # the latest span starting before mid, or an earlier long one still running
        name = NO_SPAN
        for j in range(i, max(-1, i - 8), -1):
            if outer[j][0] <= mid <= outer[j][1]:
                name = outer[j][2]
                break
        idle[name] += gap
    total = sum(idle.values())
    rows = [
        {"span": n, "idle_us": round(t, 1), "pct_of_window": round(100 * t / window, 2)}
        for n, t in sorted(idle.items(), key=lambda kv: -kv[1])[:top_k]
    ]
    frac = busy / window if window > 0 else 1.0
    if frac >= GPU_BOUND_BUSY or not rows:
        limit = f"gpu-bound: the GPU is busy {100 * frac:.1f}% of the traced window"
    else:
        top = rows[0]
        where = (
            "while no annotated host work runs (e.g. the engine waiting for requests)"
            if top["span"] == NO_SPAN
            else f"while the host is in {top['span']}"
        )
        if top["span"] in FORWARD_SPANS:
            kind = "launch-bound: the host launching a forward's kernels"
        elif top["span"] == NO_SPAN:
            kind = "between steps"
        else:
            kind = "host work between forwards"
        limit = (
            f"host-bound ({kind}): the GPU waits {100 * (1 - frac):.1f}% of the traced "
            f"window, most {where} ({top['pct_of_window']:.1f}% of the window)"
        )
    return {"gpu_idle_us": round(total, 1), "gpu_idle_by_host": rows, "limit": limit}


def gpu_time_by_span(
    events: list[dict], top_spans: int = 6, top_kernels: int = 4
) -> dict[str, Any]:
    """GPU time by the outermost device-side annotation each GPU operation starts in (see the
    module docstring); ``n/a`` without GPU operations or without device-side annotations."""
    ops = sorted(
        (float(e["ts"]), float(e.get("dur", 0)), str(e.get("name", "")), e.get("args") or {})
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS
    )
    outer = _outermost_spans(events, "gpu_user_annotation")
    if not ops or not outer:
        return {"gpu_time_by_span": NA}
    starts = [sp[0] for sp in outer]
    # span -> [total, count, {kernel -> [total, count, longest, registers]}]
    by: dict[str, list[Any]] = {}
    for ts, dur, name, args in ops:
        i = bisect.bisect_right(starts, ts) - 1
        span = outer[i][2] if i >= 0 and ts <= outer[i][1] else NO_SPAN
        row = by.setdefault(span, [0.0, 0, {}])
        row[0] += dur
        row[1] += 1
        k = row[2].setdefault(name, [0.0, 0, 0.0, None])
        k[0] += dur
        k[1] += 1
        k[2] = max(k[2], dur)
        regs = args.get("registers per thread")
        if isinstance(regs, (int, float)):
            k[3] = max(k[3] or 0, int(regs))
    busy = sum(r[0] for r in by.values())
    rows = []
    for span, (total, count, kernels) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top_spans]:
        tops = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top_kernels]
        rows.append(
            {
                "span": span,
                "gpu_us": round(total, 1),
                "ops": count,
                "pct": round(100 * total / busy, 2) if busy else None,
                "top": [
                    {
                        "name": n[:160],
                        "total_us": round(t, 1),
                        "count": c,
                        "mean_us": round(t / c, 1),
                        "max_us": round(mx, 1),
                        "registers": regs,
                    }
                    for n, (t, c, mx, regs) in tops
                ],
            }
        )
    return {"gpu_time_by_span": rows}


def _cpu(events: list[dict], top_k: int) -> dict[str, Any]:
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    per_thread: dict[tuple, list[tuple[float, float, str]]] = defaultdict(list)
    spans: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), str(e.get("name", ""))
        dur = float(e.get("dur", 0))
        if cat == "cpu_op":
            ops[name][0] += dur
            ops[name][1] += 1
            ts = float(e["ts"])
            per_thread[(e.get("pid"), e.get("tid"))].append((ts, ts + dur, name))
        elif cat == "user_annotation" and not name.startswith("ProfilerStep#"):
            spans[name][0] += dur
            spans[name][1] += 1
    cpu_time = sum(sum(m[1] - m[0] for m in _union(iv)) for iv in per_thread.values())
    return {
        "cpu_op_time_us": round(cpu_time, 1),
        "top_cpu_ops": _top(ops, cpu_time, top_k),
        "annotations": _top(spans, 0.0, top_k),
    }


def _steps(events: list[dict]) -> dict[str, Any]:
    """Profiler steps: ``ProfilerStep#N`` markers, else FlashRec's per-step scheduler spans."""
    marked = {
        str(e.get("name")) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
    }
    if marked:
        return {"steps": len(marked), "steps_from": "ProfilerStep#"}
    for span in STEP_SPANS:
        n = sum(1 for e in events if e.get("ph") == "X" and e.get("name") == span)
        if n:
            return {"steps": n, "steps_from": span}
    return {"steps": 0, "steps_from": None}


# host calls that stall the host or the device mid-run: allocator traffic (a caching
# allocator that misses calls cudaMalloc / cudaFree; cudaFree synchronizes) and explicit syncs
STALL_CALLS = ("cudaMalloc", "cudaMallocAsync", "cudaFree", "cudaFreeAsync", "cudaHostAlloc",
               "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")  # fmt: skip


def host_stalls(events: list[dict]) -> dict[str, Any]:
    """Allocator calls and synchronizations by runtime call: count and total time (``n/a`` on a
    trace without CUDA runtime events). A steady-state step should show none of the allocator
    calls and one synchronization (the results' copy); many of either are the first things to
    look at when the GPU waits."""
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    if not runtime:
        return {"host_stalls": NA}
    out: dict[str, dict[str, float]] = {}
    for e in runtime:
        name = str(e.get("name", ""))
        if name in STALL_CALLS:
            row = out.setdefault(name, {"count": 0, "total_us": 0.0})
            row["count"] += 1
            row["total_us"] = round(row["total_us"] + float(e.get("dur", 0)), 1)
    return {"host_stalls": out}


def decode_cadence(events: list[dict]) -> dict[str, Any]:
    """FlashRec's decode steps: how many, how long each host span took on average, the mean
    time from one decode step's start to the next (the cadence), and the duty cycle (mean span
    over mean cadence: the share of the time between steps the host spends in decode; a low
    one means the rest goes to prefill, results or waiting)."""
    spans = _decode_spans(events)
    if not spans:
        return {"decode_steps": 0}
    gaps = [b[0] - a[0] for a, b in zip(spans, spans[1:])]
    span = sum(end - start for start, end, _ in spans) / len(spans)
    cadence = sum(gaps) / len(gaps) if gaps else 0.0
    return {
        "decode_steps": len(spans),
        "decode_span_us_mean": round(span, 1),
        "decode_interval_us_mean": round(cadence, 1) if gaps else NA,
        "decode_duty": round(min(1.0, span / cadence), 4) if cadence > 0 else NA,
    }


def idle_by_python(events: list[dict], merged: list, top_k: int = 8) -> dict[str, Any]:
    """GPU idle time by the innermost Python frame running at each gap's midpoint on the
    threads that run FlashRec's host spans (the engine thread). Needs a trace recorded with
    Python stacks (``with_stack``: ``python_function`` events); ``n/a`` otherwise. Finer than
    ``gpu_idle_by_host``: it names the function the host was in, e.g. a kernel's launcher."""
    engine_threads = {
        (e.get("pid"), e.get("tid"))
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("flashrec.")
    }
    frames = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), str(e.get("name", "")))
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "python_function"
        and (not engine_threads or (e.get("pid"), e.get("tid")) in engine_threads)
    )
    if not frames or not merged:
        return {"gpu_idle_by_python": NA}
    window = merged[-1][1] - merged[0][0]
    gaps = sorted(
        (a[1] + (b[0] - a[1]) / 2, b[0] - a[1]) for a, b in zip(merged, merged[1:]) if b[0] > a[1]
    )
    idle: dict[str, float] = defaultdict(float)
    stack: list[tuple[float, float, str]] = []  # the frames open at the sweep point, nested
    i = 0
    for mid, gap in gaps:
        while i < len(frames) and frames[i][0] <= mid:
            while stack and stack[-1][1] < frames[i][0]:
                stack.pop()
            stack.append(frames[i])
            i += 1
        while stack and stack[-1][1] < mid:
            stack.pop()
        idle[stack[-1][2] if stack else NO_SPAN] += gap
    rows = [
        {"frame": n[:160], "idle_us": round(t, 1), "pct_of_window": round(100 * t / window, 2)}
        for n, t in sorted(idle.items(), key=lambda kv: -kv[1])[:top_k]
    ]
    return {"gpu_idle_by_python": rows}


def summarize_events(events: list[dict], top_k: int = 10, gaps_k: int = 5) -> dict[str, Any]:
    """Summary of a list of chrome trace events (see the module docstring)."""
    spans = _gpu_spans(events)
    merged = _union(spans)
    gpu = _gpu(events, spans, merged, top_k, gaps_k)
    idle = idle_by_host(events, merged=merged)
    by_span = gpu_time_by_span(events)
    rows = by_span["gpu_time_by_span"]
    if str(idle.get("limit", "")).startswith("gpu-bound") and isinstance(rows, list) and rows:
        # a GPU-bound limit names where the GPU works: the span with most GPU time, its kernel
        top = rows[0]
        lead = top["top"][0] if top["top"] else None
        idle["limit"] += f"; most GPU time in {top['span']} ({top['pct']:.0f}%)" + (
            f", led by {lead['name'][:60]} ({100 * lead['total_us'] / top['gpu_us']:.0f}% of it)"
            if lead and top["gpu_us"]
            else ""
        )
    return {
        "events": len(events),
        **_steps(events),
        "device": "cpu" if gpu["gpu_busy_fraction"] == NA else "gpu",
        **gpu,
        **idle,
        **idle_by_python(events, merged),
        **by_span,
        **host_stalls(events),
        **decode_cadence(events),
        **_cpu(events, top_k),
    }


HOST_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"}


def span_breakdown(events: list[dict], name: str, top_k: int = 10) -> dict[str, Any]:
    """The inside of host annotation ``name`` (see the module docstring): occurrences, host
    time, direct children by total time, self time, and the GPU work launched from inside.
    ``{"span": name, "count": 0}`` when the trace has no such span."""
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in HOST_CATS]
    spans = [e for e in host if e.get("cat") == "user_annotation" and e.get("name") == name]
    if not spans:
        return {"span": name, "count": 0}
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in host:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    starts: dict[tuple, list[float]] = {}
    for key, evs in by_thread.items():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        starts[key] = [float(e["ts"]) for e in evs]
    children: dict[str, list[float]] = {}
    correlations: set = set()
    total = inside = 0.0
    for sp in spans:
        a, b = float(sp["ts"]), float(sp["ts"]) + float(sp.get("dur", 0))
        total += b - a
        key = (sp.get("pid"), sp.get("tid"))
        evs = by_thread[key]
        i = bisect.bisect_left(starts[key], a)
        end = a  # the end of the last direct child: later events inside it are nested
        for e in evs[i:]:
            ts = float(e["ts"])
            if ts > b:
                break
            te = ts + float(e.get("dur", 0))
            if e is sp or te > b:
                continue
            corr = (e.get("args") or {}).get("correlation")
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and corr is not None:
                correlations.add(corr)
            if ts < end:
                continue  # nested in an earlier child
            row = children.setdefault(str(e.get("name", "")), [0.0, 0])
            row[0] += te - ts
            row[1] += 1
            inside += te - ts
            end = te
    gpu: dict[str, list[float]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            if (e.get("args") or {}).get("correlation") in correlations:
                row = gpu.setdefault(str(e.get("name", "")), [0.0, 0])
                row[0] += float(e.get("dur", 0))
                row[1] += 1
    gpu_total = sum(r[0] for r in gpu.values())
    return {
        "span": name,
        "count": len(spans),
        "host_us": round(total, 1),
        "host_us_mean": round(total / len(spans), 1),
        "self_us": round(total - inside, 1),
        "children": [
            {
                "name": n[:160],
                "total_us": round(t, 1),
                "count": c,
                "pct": round(100 * t / total, 2) if total else None,
            }
            for n, (t, c) in sorted(children.items(), key=lambda kv: -kv[1][0])[:top_k]
        ],  # fmt: skip
        "gpu_us": round(gpu_total, 1),
        "gpu_ops": sum(int(r[1]) for r in gpu.values()),
        "gpu_top": [
            {"name": n[:160], "total_us": round(t, 1), "count": c}
            for n, (t, c) in sorted(gpu.items(), key=lambda kv: -kv[1][0])[:top_k]
        ],
    }


def summarize_trace(path: str | Path, top_k: int = 10, gaps_k: int = 5) -> dict[str, Any]:
    """Summary of one trace file, with its path and size; ``error`` when it cannot be read."""
    p = Path(path)
    out: dict[str, Any] = {"path": str(p), "size_bytes": p.stat().st_size if p.exists() else 0}
    try:
        out.update(summarize_events(load_events(p), top_k, gaps_k))
    except (OSError, ValueError, EOFError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.trace_summary TRACE...``: each trace's summary as JSON."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m harness.trace_summary",
        description="Summarize chrome traces (.json / .json.gz): GPU busy share, gaps by host "
        "span, graph replays, top kernels, FP8 GEMMs.",
    )
    p.add_argument("traces", nargs="+", help="trace files")
    p.add_argument("--top", type=int, default=10, help="top kernels / ops to list")
    p.add_argument(
        "--span",
        action="append",
        metavar="NAME",
        help="print the inside of this host span instead (e.g. flashrec.prefill): its direct "
        "children by time, its own time, the GPU work it launched; repeatable",
    )
    args = p.parse_args(argv)
    for path in args.traces:
        if args.span:
            events = load_events(path)
            out: Any = [span_breakdown(events, n, args.top) for n in args.span]
        else:
            out = summarize_trace(path, top_k=args.top)
        print(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
