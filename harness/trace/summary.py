"""A summary of a chrome trace (torch profiler JSON): where the time went, in a few numbers.

:func:`summarize_events` puts together the GPU fields (:mod:`harness.trace.gpu`: busy fraction,
gaps, graph replays, top kernels, time by kind of kernel, FP8 GEMMs, where the GPU waits and
where it works) and the host fields (:mod:`harness.trace.host`: CPU operator time, steps, host
stalls, decode cadence).
On a CPU-only trace the GPU fields are ``"n/a"`` and the CPU operator time is what the summary
reports. ``python -m harness.trace.summary TRACE... [--span NAME]`` prints each trace's summary
(or one span's inside, :func:`harness.trace.host.span_breakdown`) as JSON.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from pathlib import Path
from typing import Any

from harness.trace.events import NA, gpu_spans, load_events, load_trace, union
from harness.trace.gpu import gpu_summary, gpu_time_by_span, idle_by_host, idle_by_python
from harness.trace.host import (
    cpu_summary,
    decode_cadence,
    host_stalls,
    profiler_steps,
    span_breakdowns,
)


def summarize_events(
    events: list[dict],
    top_k: int = 10,
    gaps_k: int = 5,
    classes: tuple = (),
    spans: tuple[str, ...] = (),
    busy_out: list | None = None,
) -> dict[str, Any]:
    """Summary of a list of chrome trace events (see the module docstring); ``classes``:
    extra ``(name, regex)`` kernel classes, tried before the built-in ones; ``spans``: host
    annotations broken down (``span_breakdown``, one entry each, ``count`` 0 when absent);
    ``busy_out``: a list that receives the GPU's merged busy intervals ``(start, end)`` in
    ``ts`` (for :func:`work_per_request`; too many to keep in a summary)."""
    intervals = gpu_spans(events)
    merged = union(intervals)
    if busy_out is not None:
        busy_out.extend((m[0], m[1]) for m in merged)
    gpu = gpu_summary(events, intervals, merged, top_k, gaps_k, classes)
    idle = idle_by_host(events, merged=merged)
    by_span = gpu_time_by_span(events, classes=classes)
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
        **profiler_steps(events),
        "device": "cpu" if gpu["gpu_busy_fraction"] == NA else "gpu",
        **gpu,
        **idle,
        **idle_by_python(events, merged),
        **by_span,
        **host_stalls(events),
        **decode_cadence(events),
        **cpu_summary(events, top_k),
        **({"span_breakdown": span_breakdowns(events, list(spans), top_k)} if spans else {}),
    }


def summarize_trace(
    path: str | Path,
    top_k: int = 10,
    gaps_k: int = 5,
    classes: tuple = (),
    spans: tuple[str, ...] = (),
    busy_out: list | None = None,
) -> dict[str, Any]:
    """Summary of one trace file, with its path and size; ``error`` when it cannot be read
    (``busy_out`` as in :func:`summarize_events`)."""
    p = Path(path)
    out: dict[str, Any] = {"path": str(p), "size_bytes": p.stat().st_size if p.exists() else 0}
    try:
        events, base_s = load_trace(p)
        out.update(summarize_events(events, top_k, gaps_k, classes, spans, busy_out))
    except (OSError, ValueError, EOFError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    window = out.get("gpu_window_us")
    if base_s is not None and isinstance(window, list):  # the GPU's window in Unix time
        out["gpu_window_unix"] = [base_s + window[0] / 1e6, base_s + window[1] / 1e6]
    return out


def traced_work(trace: dict | None) -> dict[str, Any] | None:
    """The first file of a cell's ``trace`` entry that has a GPU work per request
    (:func:`work_per_request`'s fields), or None."""
    files = trace.get("files") if isinstance(trace, dict) else None
    for f in files or []:
        if isinstance(f, dict) and isinstance(f.get("gpu_ms_per_request"), (int, float)):
            return f
    return None


def busy_between(busy: list[tuple[float, float]], lo: float, hi: float) -> float:
    """GPU busy time (us) of the merged intervals ``busy`` inside ``[lo, hi]`` (trace ``ts``)."""
    i = bisect.bisect_right(busy, (lo, math.inf)) - 1  # the interval that may hold lo
    total = 0.0
    for start, end in busy[max(i, 0) :]:
        if start >= hi:
            break
        total += max(0.0, min(end, hi) - max(start, lo))
    return total


CLUSTER_GAP = 4.0  # answers after a gap this many times the median one start a new wave


def _spans(inside: list[float]) -> list[tuple[float, float]]:
    """Candidate ``(T1, T2)`` spans over the answers inside the window, each from one answer
    to a later one at the same point of the answers' rhythm, best first. Answers that come in
    waves (a batch retiring together: a gap over ``CLUSTER_GAP`` x the median starts a wave)
    are measured from the first big wave's first answer to the last big wave's (big: at least
    half the largest wave; the stragglers between waves repeat with them), then from the
    first answer to the last wave's first answer, then (one request at a time, where a pause
    made a lone long gap) from the first answer to the last; a steady stream (one wave) from
    the first answer to the last."""
    gaps = [b - a for a, b in zip(inside, inside[1:])]
    median = sorted(gaps)[len(gaps) // 2]
    waves = [[inside[0]]]
    for t, gap in zip(inside[1:], gaps):
        if gap > CLUSTER_GAP * median:
            waves.append([t])
        else:
            waves[-1].append(t)
    if len(waves) == 1:
        return [(inside[0], inside[-1])]
    big = [w for w in waves if 2 * len(w) >= max(map(len, waves))]
    return [(big[0][0], big[-1][0]), (inside[0], waves[-1][0]), (inside[0], inside[-1])]


def work_per_request(
    summary: dict[str, Any],
    requests: list[tuple[float, float, float]],
    busy: list[tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """The GPU work per request of a traced window. ``requests``: the traced round's answered
    requests as ``(engine start, engine end, answer)`` in Unix s (the engine span from the
    server's timing, or the whole request where it gives none); ``busy``: the GPU's merged
    busy intervals (:func:`summarize_trace`'s ``busy_out``).

    ``estimate: "between answers"``: the GPU's busy time from one answer inside the window to
    a later one at the same point of the answers' rhythm (:func:`_spans`), over the answers
    in between. One request at a time every request's work lies between the answer before it
    and its own, so this is exact, and whole waves of a batched load keep it so. The first
    span that covers at least half the window is used. Else (one wave of answers,
    or a single answer) ``"engine spans"``: the window's whole busy time over the requests'
    share of it, each request counted by the part of its engine span inside the window (work
    assumed spread evenly over the span). The time per kernel class is the window's split,
    scaled to the time counted. {} without the window (a trace without a base time, or no GPU
    operations)."""
    window = summary.get("gpu_window_unix")
    total = summary.get("gpu_busy_us")
    origin = summary.get("gpu_window_us")
    if not isinstance(window, list) or not isinstance(total, (int, float)) or total <= 0:
        return {}
    lo, hi = window
    inside = sorted(end for _, _, end in requests if lo <= end <= hi)
    work, n, estimate = 0.0, 0.0, ""
    if busy and len(inside) >= 2 and isinstance(origin, list):
        for t1, t2 in _spans(inside):
            counted = sum(1 for t in inside if t1 < t <= t2)
            if counted and t2 - t1 >= (hi - lo) / 2:
                base_s = lo - origin[0] / 1e6  # the trace's ts 0 in Unix s
                work = busy_between(busy, (t1 - base_s) * 1e6, (t2 - base_s) * 1e6)
                n, estimate = float(counted), "between answers"
                break
    if not estimate:
        n = sum(
            max(0.0, min(b, hi) - max(a, lo)) / (b - a) if b > a else float(lo <= b <= hi)
            for a, b, _ in requests
        )
        work, estimate = total, "engine spans"
    if n < 1 or work <= 0:  # less than one request's work to share it by
        return {"requests_in_window": len(inside)}
    classes = summary.get("gpu_time_by_class")
    summed = sum(c["total_us"] for c in classes) if isinstance(classes, list) else 0.0
    by_class = (
        {c["name"]: round(c["total_us"] * work / summed / 1e3 / n, 3) for c in classes}
        if isinstance(classes, list) and summed > 0
        else {}
    )
    return {
        "requests_in_window": len(inside),
        "requests_counted": round(n, 2),
        "estimate": estimate,
        "gpu_ms_per_request": round(work / 1e3 / n, 3),
        "gpu_ms_per_request_by_class": by_class,
        # the QPS this GPU work allows with the GPU never idle
        "qps_at_full_busy": round(n / (work / 1e6), 2),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.trace.summary TRACE...``: each trace's summary as JSON."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m harness.trace.summary",
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
    p.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="NAME=REGEX",
        help="a kernel class for gpu_time_by_class, tried before the built-in ones (e.g. "
        "'attention=^my_attn'); repeatable",
    )
    args = p.parse_args(argv)
    classes = []
    for c in args.classes:
        name, eq, rx = c.partition("=")
        try:
            re.compile(rx)
        except re.error as exc:
            p.error(f"--class {c!r}: bad regex: {exc}")
        if not eq or not name.strip() or not rx:
            p.error(f"--class {c!r}: expected NAME=REGEX")
        classes.append((name.strip(), rx))
    for path in args.traces:
        if args.span:
            events = load_events(path)
            out: Any = span_breakdowns(events, args.span, args.top)
        else:
            out = summarize_trace(path, top_k=args.top, classes=tuple(classes))
        print(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
