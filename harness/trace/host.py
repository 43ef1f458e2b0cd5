"""The host fields of a trace summary, and one span's inside.

CPU operator time (the union per thread) with the top operators and annotations, the profiler
steps, ``host_stalls`` (allocator calls and synchronizations, count and time) and the decode
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
from collections import defaultdict
from typing import Any

from harness.trace.events import GPU_CATS, NA, decode_spans, top_rows, union

STEP_SPANS = ("flashrec.schedule", "flashrec.step")

# host calls that stall the host or the device mid-run: allocator traffic (a caching
# allocator that misses calls cudaMalloc / cudaFree; cudaFree synchronizes) and explicit syncs
STALL_CALLS = ("cudaMalloc", "cudaMallocAsync", "cudaFree", "cudaFreeAsync", "cudaHostAlloc",
               "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")  # fmt: skip
HOST_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"}


def cpu_summary(events: list[dict], top_k: int) -> dict[str, Any]:
    """CPU operator time (the union of ``cpu_op`` events per thread), the top operators and the
    host annotations by total time."""
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
    cpu_time = sum(sum(m[1] - m[0] for m in union(iv)) for iv in per_thread.values())
    return {
        "cpu_op_time_us": round(cpu_time, 1),
        "top_cpu_ops": top_rows(ops, cpu_time, top_k),
        "annotations": top_rows(spans, 0.0, top_k),
    }


def profiler_steps(events: list[dict]) -> dict[str, Any]:
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
    spans = decode_spans(events)
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


def span_breakdown(events: list[dict], name: str, top_k: int = 10) -> dict[str, Any]:
    """The inside of host annotation ``name`` (see the module docstring): occurrences, host
    time, direct children by total time, self time, and the GPU work launched from inside.
    ``{"span": name, "count": 0}`` when the trace has no such span."""
    return span_breakdowns(events, [name], top_k)[0]


def span_breakdowns(events: list[dict], names: list[str], top_k: int = 10) -> list[dict]:
    """:func:`span_breakdown` of each of ``names``, over one per-thread index of the host
    events (built once, not once per name)."""
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in HOST_CATS]
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in host:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    starts: dict[tuple, list[float]] = {}
    for key, evs in by_thread.items():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        starts[key] = [float(e["ts"]) for e in evs]
    gpu_ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    return [_breakdown(gpu_ops, host, by_thread, starts, n, top_k) for n in names]


def _breakdown(gpu_ops, host, by_thread, starts, name: str, top_k: int) -> dict[str, Any]:
    """One span's breakdown over the index of :func:`span_breakdowns` (``gpu_ops``: the
    trace's GPU operations, matched to the span's runtime calls by correlation id)."""
    spans = [e for e in host if e.get("cat") == "user_annotation" and e.get("name") == name]
    if not spans:
        return {"span": name, "count": 0}
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
    for e in gpu_ops:
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
