"""The GPU fields of a trace summary.

Busy fraction (union of kernel / memcpy / memset time over the span from the first to the last
of them), the largest gaps between them, CUDA-graph replays (``cudaGraphLaunch`` runtime calls;
``decode_graph_replay`` counts only those inside FlashRec's decode spans, since prefill replays
graphs too), top kernels by time, the time by kind of kernel (``gpu_time_by_class``: attention,
GEMM, the norm / activation / quant kernels between them, copies, other; ``elementwise_pct``:
that middle class's share in percent) and whether the GEMMs are FP8 kernels. On a CPU-only
trace those fields are ``"n/a"``.

Where the GPU waits (``gpu_idle_by_host``): every gap between GPU operations is charged to the
outermost host annotation (``record_function`` span, e.g. ``flashrec.prefill``) running at its
midpoint, or to ``(no host span)`` when none is: then the host was outside annotated code,
e.g. an engine waiting for requests. ``limit`` reads the result: ``gpu-bound`` when the GPU is
busy >= 80% of the window (naming, where the trace has device-side spans, the span with most
GPU time and its leading kernel: :func:`harness.trace.summary.summarize_events` adds that),
else ``host-bound`` naming the host span it waited on most. ``gpu_idle_by_python`` charges the
same gaps to the innermost Python frame.

Where the GPU works (``gpu_time_by_span``): every kernel / memcpy / memset is charged to the
outermost device-side annotation it starts in (``gpu_user_annotation``: the profiler's device
copy of a host span such as ``flashrec.prefill`` or ``flashrec.decode_step``; a CUDA-graph
replay's kernels fall in the span that launched it), with each span's top kernels by time,
their launch count, mean and longest launch, and the registers per thread the profiler
recorded (255 on NVIDIA GPUs is the ceiling: a kernel there likely spills).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from typing import Any

from harness.trace.events import (
    DECODE_SPANS,
    GPU_CATS,
    NA,
    decode_spans,
    gpu_spans,
    outermost_spans,
    top_rows,
    union,
)

GEMM = re.compile(r"gemm|matmul|cutlass|xmma|nvjet|cublas|scaled_mm|_mm_|wgmma", re.I)
# attention kernels also use wgmma / gemm-like names: never count them as GEMMs
ATTENTION = re.compile(r"sdpa|fmha|flash|attention|attn|beam_decode", re.I)
# cuBLASLt "nvjet_sm90_qq..." kernels take two e4m3 operands (what torch._scaled_mm launches)
FP8 = re.compile(r"fp8|e4m3|e5m2|scaled_mm|f8f8|nvjet_sm\d+_qq", re.I)
GRAPH_LAUNCH = {"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"}
# the row-wise kernels between the GEMMs (RMSNorm, q/k norm + RoPE, SiLU-and-mul, FP8 quant)
NORM_ACT = re.compile(r"norm|rope|rotary|silu|gelu|swiglu|act_and_mul|quant", re.I)
COPY = re.compile(r"^mem(cpy|set)\b|direct_copy|copy_kernel|CatArray", re.I)
# gpu_time_by_class: an operation is the first class its name matches (attention first, as
# attention kernels carry GEMM-like names), else "other" (e.g. beam search's sort and gather)
ELEMENTWISE = "norm / activation / quant"
KERNEL_CLASSES = (
    ("attention", ATTENTION),
    ("GEMM", GEMM),
    (ELEMENTWISE, NORM_ACT),
    ("copy / memset", COPY),
)

# host spans that launch one model forward: GPU idle inside them is launch overhead
FORWARD_SPANS = ("flashrec.prefill", *DECODE_SPANS, "flashrec.layer")
KERNEL_LAUNCH = {"cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"}
NO_SPAN = "(no host span)"
GAP_THRESHOLD_US = 300.0  # GPU gaps longer than this are counted and summed (gaps_over)
GPU_BOUND_BUSY = 0.8  # busy fraction from which a trace reads as GPU-bound


def _decode_graph_launches(events: list[dict]) -> int | None:
    """Graph launches inside FlashRec's decode spans; None when the trace has no decode span
    (another engine's trace, or one without decode steps)."""
    decode = decode_spans(events)
    if not decode:
        return None
    merged = union(decode)
    starts = [m[0] for m in merged]
    n = 0
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in GRAPH_LAUNCH:
            ts = float(e.get("ts", 0))
            i = bisect.bisect_right(starts, ts) - 1
            n += i >= 0 and ts <= merged[i][1]
    return n


def gpu_time_by_class(items, classes: tuple[tuple[str, str], ...] = ()) -> list[dict]:
    """``(kernel name, us, count)`` items summed by class (``KERNEL_CLASSES``, after the
    ``(name, regex)`` pairs of ``classes``, which are tried first), largest first, with each
    class's share of the summed operation time."""
    rules = [(n, re.compile(rx)) for n, rx in classes] + list(KERNEL_CLASSES)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, us, count in items:
        kind = next((k for k, rx in rules if rx.search(name)), "other")
        totals[kind][0] += us
        totals[kind][1] += count
    return top_rows(totals, sum(v[0] for v in totals.values()), len(totals))


def gpu_summary(
    events: list[dict],
    spans: list[tuple[float, float, str]],
    merged: list,
    top_k: int,
    gaps_k: int,
    classes: tuple[tuple[str, str], ...] = (),
) -> dict[str, Any]:
    """The GPU fields (see the module docstring) of ``spans`` (every GPU operation) and
    ``merged`` (their union); ``classes``: extra ``gpu_time_by_class`` rules."""
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
            "gpu_busy_us": NA,
            "gpu_window_us": NA,
            "largest_gaps_us": NA,
            "gaps_over": NA,
            "cuda_graph_launches": graph if runtime else NA,
            "decode_graph_launches": decode_field if runtime else NA,
            "kernel_launches": launches if runtime else NA,
            "decode_graph_replay": replay if runtime else NA,
            "top_kernels": NA,
            "gpu_time_by_class": NA,
            "elementwise_pct": NA,
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
    by_class = gpu_time_by_class(((n, *v) for n, v in kernels.items()), classes)
    return {
        "gpu_busy_fraction": round(busy / span, 4) if span > 0 else NA,
        "gpu_busy_us": round(busy, 1),
        # first GPU operation's start, last one's end, in the trace's own clock (``ts``, us)
        "gpu_window_us": [merged[0][0], merged[-1][1]],
        "largest_gaps_us": gaps,
        "gaps_over": gaps_over,
        "cuda_graph_launches": graph,
        "decode_graph_launches": decode_field,
        "kernel_launches": launches,
        "decode_graph_replay": replay,
        "top_kernels": top_rows(kernels, busy, top_k),
        # classified once per kernel name, not per launch
        "gpu_time_by_class": by_class,
        # the norm / activation / quant class's share: what issue goals on fusing it name
        "elementwise_pct": next((c["pct"] for c in by_class if c["name"] == ELEMENTWISE), 0.0),
        "gemm": {
            "total_us": round(gemm_us, 1),
            "fp8_us": round(fp8_us, 1),
            "fp8_fraction": round(fp8_us / gemm_us, 4) if gemm_us else NA,
            "is_fp8": bool(gemm_us) and fp8_us / gemm_us > 0.5,
            "top": top_rows(gemms, gemm_us, 5),
        },
    }


def idle_by_host(events: list[dict], top_k: int = 6, merged: list | None = None) -> dict[str, Any]:
    """GPU idle time (the gaps of the merged GPU busy intervals) by the outermost host span
    running at each gap's midpoint; ``limit`` as in the module docstring. {} without GPU ops.
    ``merged``: the union of the GPU spans when the caller has it already."""
    if merged is None:
        merged = union(gpu_spans(events))
    if not merged:
        return {}
    window = merged[-1][1] - merged[0][0]
    busy = sum(m[1] - m[0] for m in merged)
    outer = outermost_spans(events)
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
    events: list[dict],
    top_spans: int = 6,
    top_kernels: int = 4,
    classes: tuple[tuple[str, str], ...] = (),
) -> dict[str, Any]:
    """GPU time by the outermost device-side annotation each GPU operation starts in (see the
    module docstring), with how many such annotations there are and the span's time by kind
    of kernel (``classes`` as in :func:`gpu_time_by_class`); ``n/a`` without GPU operations
    or without device-side annotations."""
    ops = sorted(
        (float(e["ts"]), float(e.get("dur", 0)), str(e.get("name", "")), e.get("args") or {})
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS
    )
    outer = outermost_spans(events, "gpu_user_annotation")
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
    occurrences: dict[str, int] = defaultdict(int)
    for sp in outer:
        occurrences[sp[2]] += 1
    rows = []
    for span, (total, count, kernels) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top_spans]:
        tops = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top_kernels]
        rows.append(
            {
                "span": span,
                "gpu_us": round(total, 1),
                "ops": count,
                "spans": occurrences.get(span, 0),  # 0 for NO_SPAN
                "pct": round(100 * total / busy, 2) if busy else None,
                "by_class": gpu_time_by_class(
                    ((n, v[0], v[1]) for n, v in kernels.items()), classes
                ),
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
