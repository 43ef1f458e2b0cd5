"""Chrome trace events (torch profiler JSON) and the interval helpers every trace field is
built on: loading a trace, GPU operations and FlashRec's decode spans as intervals, their union,
outermost annotations, top-k tables."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

NA = "n/a"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}

# FlashRec's decode host spans: a graph launch inside one is a decode replay (the prefill
# graphs launch inside flashrec.prefill)
DECODE_SPANS = ("flashrec.decode", "flashrec.decode_step")


def load_events(path: str | Path) -> list[dict]:
    """The ``traceEvents`` of a chrome trace file (``.json`` or ``.json.gz``)."""
    return load_trace(path)[0]


def load_trace(path: str | Path) -> tuple[list[dict], float | None]:
    """The ``traceEvents`` of a chrome trace file and the Unix time (s) its ``ts`` count from:
    torch.profiler's files carry it as ``baseTimeNanoseconds``; None without it."""
    p = Path(path)
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        return list(data), None
    base = data.get("baseTimeNanoseconds")
    base_s = base / 1e9 if isinstance(base, (int, float)) and not isinstance(base, bool) else None
    return data.get("traceEvents", []), base_s


def union(intervals: list[tuple[float, float, str]]) -> list[tuple[float, float, str, str]]:
    """Merged busy intervals (start, end, first name, last name), sorted."""
    merged: list[list[Any]] = []
    for start, end, name in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1][1], merged[-1][3] = end, name
        else:
            merged.append([start, end, name, name])
    return [tuple(m) for m in merged]


def top_rows(totals: dict[str, list[float]], total: float, k: int) -> list[dict]:
    """The ``k`` largest of ``{name: [time, count]}`` as rows, with their share of ``total``."""
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


def gpu_spans(events: list[dict]) -> list[tuple[float, float, str]]:
    """(start, end, name) of every kernel / memcpy / memset."""
    return [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), str(e.get("name", "")))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS
    ]


def decode_spans(events: list[dict]) -> list[tuple[float, float, str]]:
    """(start, end, name) of FlashRec's decode host spans, by start."""
    return sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), str(e["name"]))
        for e in events
        if e.get("ph") == "X" and e.get("name") in DECODE_SPANS
    )


def outermost_spans(
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
