"""Records -> metrics: per-round values, then per-cell summaries over rounds.

Only measured, non-excluded records count. Warm-up, priming and traced-round records are kept
in the records file (with their phase) but never enter a metric.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from harness.load.client import Record
from harness.metrics.stats import summarize
from harness.names import (  # noqa: F401  (the metric names, re-exported)
    DIRECTIONS,
    NAMED_DIRECTIONS,
    QUALITY_PREFIXES,
    direction,
    named_direction,
)
from harness.spec.matrix import StatsSpec
from harness.trace.summary import traced_work

NAN = float("nan")

SERVER_PHASES = ("tokenize", "queue", "engine")
OPTIONAL_SERVER_PHASES = ("ipc", "respond")  # counted where every timed request of a round has it
# details of a phase (the part of it named), reported beside it, never summed with the phases
DETAIL_SERVER_PHASES = {"handoff": "respond", "body_cpu": "respond"}
KEY_METRICS = (
    "qps",
    "latency_mean_ms",
    "latency_p50_ms",
    "latency_p90_ms",
    "latency_p99_ms",
    "error_rate",
)


def counted(records: list[Record]) -> list[Record]:
    """The records that enter the statistics: measured and not excluded."""
    return [r for r in records if r.phase == "measure" and not r.excluded]


def _ratio(num: float, den: float) -> float:
    return num / den if den else NAN


# extra(ok records of a round, the round's metrics so far) -> more metrics of that round
Extra = Callable[[list[Record], dict[str, float]], dict[str, float]]


def burst_extra(size: int) -> Extra:
    """Round metrics of a ``burst`` load of ``size`` requests per burst: the mean and the
    longest makespan (first send -> last answer) over the round's bursts whose every request
    succeeded and counts (a burst with a failed or excluded request has no makespan)."""

    def extra(ok: list[Record], out: dict[str, float]) -> dict[str, float]:
        bursts: dict[int, list[Record]] = defaultdict(list)
        for r in ok:
            bursts[r.index // size].append(r)
        spans = [
            (max(r.t_end for r in rs) - min(r.t_send for r in rs)) * 1000.0
            for rs in bursts.values()
            if len(rs) == size
        ]
        if not spans:
            return {}
        return {"burst_ms_mean": float(np.mean(spans)), "burst_ms_max": float(max(spans))}

    return extra


def busy_extra(trace: dict | None) -> Extra | None:
    """Round metric ``gpu_busy_implied``: the GPU's busy share that the traced round's GPU work
    per request (``trace.files[i].gpu_ms_per_request``, harness.trace.summary.work_per_request)
    implies at the round's QPS. The traced round's own busy share is lower where the
    profiler slows the host; this reads the unprofiled rounds. None without that figure."""
    traced = traced_work(trace)
    if traced is None:
        return None
    work = traced["gpu_ms_per_request"]

    def extra(ok: list[Record], out: dict[str, float]) -> dict[str, float]:
        qps = out.get("qps")
        return {"gpu_busy_implied": work * qps / 1000.0} if qps else {}

    return extra


def closed_extra(clients: int) -> Extra:
    """Round metrics of a ``closed`` load of ``clients`` clients: ``qps_steady``, the rate of
    answers between the ``clients``-th and the ``(N - clients)``-th of the round's N answers
    (by arrival), i.e. while every client has a request in flight. A round's ``qps`` (first
    send -> last answer) also holds its start, when nothing has finished yet, and its drain,
    when fewer and fewer requests are left; with a few requests per client those take a large
    share of the round. Needs N >= 3 x clients (at least one client-wide wave inside the window);
    absent otherwise."""

    def extra(ok: list[Record], out: dict[str, float]) -> dict[str, float]:
        n = len(ok)
        if clients < 1 or n < 3 * clients:
            return {}
        ends = sorted(r.t_end for r in ok)
        a, b = ends[clients - 1], ends[n - clients - 1]
        if b <= a:
            return {}
        return {"qps_steady": (n - 2 * clients) / (b - a)}

    return extra


def round_metrics(records: list[Record], extra: Extra | None = None) -> dict[str, float]:
    """The metrics of one round from its counted records (plus ``extra``'s derived ones)."""
    used = counted(records)
    if not used:
        return {}
    ok = [r for r in used if r.ok]
    wall = max(r.t_end for r in used) - min(r.t_send for r in used)
    lat = np.array([r.latency * 1000.0 for r in ok]) if ok else np.array([])
    beams = sum(r.beams for r in ok)
    out = {
        "qps": _ratio(len(ok), wall),
        "latency_mean_ms": float(lat.mean()) if lat.size else NAN,
        "latency_p50_ms": float(np.percentile(lat, 50)) if lat.size else NAN,
        "latency_p90_ms": float(np.percentile(lat, 90)) if lat.size else NAN,
        "latency_p99_ms": float(np.percentile(lat, 99)) if lat.size else NAN,
        "error_rate": (len(used) - len(ok)) / len(used),
        "beams_mean": _ratio(beams, len(ok)),
    }
    # measured only where they can be: invalid SIDs against a catalog, duplicates among more
    # than one beam of an answer (harness.metrics.checked says why not, for the report)
    if ok and all(r.sids_checked for r in ok):
        out["invalid_rate"] = _ratio(sum(r.invalid for r in ok), beams)
    if any(r.beams > 1 for r in ok):
        out["duplicate_rate"] = _ratio(sum(r.duplicates for r in ok), beams)
    prompt = [r for r in ok if r.prompt_tokens]
    if prompt:
        out["prompt_tokens_mean"] = sum(r.prompt_tokens for r in prompt) / len(prompt)
        cached = [r for r in prompt if r.cached_tokens is not None]
        if cached:
            out["cached_frac"] = _ratio(
                sum(r.cached_tokens for r in cached), sum(r.prompt_tokens for r in cached)
            )
    timed = [r for r in ok if all(p in r.server_ms for p in SERVER_PHASES)]
    if timed:
        phases = SERVER_PHASES + tuple(
            p for p in OPTIONAL_SERVER_PHASES if all(p in r.server_ms for r in timed)
        )
        for p in phases:
            out[f"server_{p}_ms_mean"] = float(np.mean([r.server_ms[p] for r in timed]))
        for p, of in DETAIL_SERVER_PHASES.items():
            if of in phases and all(p in r.server_ms for r in timed):
                out[f"server_{p}_ms_mean"] = float(np.mean([r.server_ms[p] for r in timed]))
        out["outside_server_ms_mean"] = float(
            np.mean([r.latency * 1000.0 - sum(r.server_ms[p] for p in phases) for r in timed])
        )
        # everything but the engine's own time: what the request spends on the host path
        # (tokenize, queue, pipe, respond, HTTP and the client), while its GPU work waits
        out["host_path_ms_mean"] = float(
            np.mean([r.latency * 1000.0 - r.server_ms["engine"] for r in timed])
        )
    sums: dict[str, list[float]] = defaultdict(list)
    for r in ok:
        for k, v in r.quality.items():
            sums[k].append(v)
    out.update({k: float(np.mean(v)) for k, v in sums.items()})
    if extra is not None:
        out.update(extra(ok, out))
    return out


def by_round(records: list[Record]) -> dict[int, list[Record]]:
    """Records grouped by round number (measured rounds only)."""
    rounds: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        if r.phase == "measure":
            rounds[r.round].append(r)
    return dict(sorted(rounds.items()))


def cell_metrics(
    records: list[Record], stats: StatsSpec, extra: Extra | None = None
) -> dict[str, dict]:
    """Each metric's summary over the measured rounds (see
    :func:`harness.metrics.stats.summarize`)."""
    per_round = [round_metrics(recs, extra) for recs in by_round(records).values()]
    per_round = [m for m in per_round if m]
    names: list[str] = []
    for m in per_round:
        names += [k for k in m if k not in names]
    out = {}
    for name in names:
        values = [m.get(name, NAN) for m in per_round]
        values = [v for v in values if not math.isnan(v)]
        if values:
            out[name] = summarize(
                values, stats.confidence, stats.bootstrap, stats.seed, stats.band_k
            )
    return out


SHORT_ROUND_LOSS = 0.05  # round QPS this far below qps_steady: the cell gets a note


def notes(metrics: dict[str, dict], stats: StatsSpec) -> list[str]:
    """Why a cell's numbers may not support a conclusion (too few or too noisy rounds)."""
    out = []
    qps = metrics.get("qps")
    rounds = qps["n"] if qps else 0
    if rounds < stats.min_rounds:
        out.append(
            f"only {rounds} measured round(s) (< {stats.min_rounds}): no noise band, no conclusion"
        )
    for name in ("qps", "latency_p50_ms"):
        m = metrics.get(name)
        if m and math.isfinite(m["cv"]) and m["cv"] > stats.max_cv:
            out.append(
                f"{name} CV {100 * m['cv']:.1f}% > {100 * stats.max_cv:.0f}%: "
                "too noisy to support a conclusion"
            )
    err = metrics.get("error_rate")
    if err and err["median"] > 0:
        out.append(f"error rate {100 * err['median']:.1f}%")
    inv = metrics.get("invalid_rate")
    if inv and inv["median"] > 0:
        out.append(f"invalid SID rate {100 * inv['median']:.2f}%")
    steady = metrics.get("qps_steady")
    if qps and steady and steady["median"] > 0:
        lost = 1.0 - qps["median"] / steady["median"]
        if lost > SHORT_ROUND_LOSS:
            out.append(
                f"round QPS {100 * lost:.1f}% below the rate while every client was busy "
                f"({steady['median']:.2f}): the rounds are short for this concurrency, so start "
                "and drain weigh on the round QPS; more requests per round measure the rate"
            )
    return out
