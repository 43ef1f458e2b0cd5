"""Server-side counters around each measured round, from the server's Prometheus ``/metrics``.

FlashRec exports its garbage-collector pauses (``flashrec_gc_*``). A full collection stops
every thread of the server, the engine's included, so a slow round with a long pause in it
has its explanation. The harness scrapes ``/metrics`` before and after each measured round
(outside the timed load) and keeps the deltas as round metrics:
``server_gc_pause_ms`` (every generation), ``server_gc_full_collections`` and
``server_gc_slow_pauses`` (>= 50 ms), summed over the server's processes (its engine
process's samples carry ``process="engine"``). From its ``flashrec_graph_*`` families, the
round's graph health: ``server_graph_eager_decode_forwards`` / ``..._prefill_forwards``
(forwards that left the CUDA graphs: a silent fall-back to eager halves QPS),
``server_graph_replay_decode_forwards`` / ``..._prefill_forwards`` and
``server_graph_captures_after_warmup`` (a total since the server's warm-up, not a delta), so a
matrix gate can require no eager decode and no capture while serving without a trace. A server
without these families (another engine, an older FlashRec) simply has none.
"""

from __future__ import annotations

import asyncio
import math

import aiohttp

from harness.metrics.rounds import Extra

GC_PAUSE = "flashrec_gc_pause_seconds_total"
GC_COLLECTIONS = "flashrec_gc_collections_total"
GC_SLOW = "flashrec_gc_slow_pauses_total"
FULL = 'generation="2"'  # the label of full collections


def parse_prometheus(text: str) -> dict[str, float]:
    """``{"name{labels}": value}`` of every sample line of a text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


async def scrape(session: aiohttp.ClientSession, base_url: str) -> dict[str, float] | None:
    """The server's ``/metrics`` samples; None when it has none (or does not answer)."""
    try:
        timeout = aiohttp.ClientTimeout(total=10)
        async with session.get(f"{base_url}/metrics", timeout=timeout) as r:
            if r.status != 200:
                return None
            return parse_prometheus(await r.text())
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, UnicodeDecodeError):
        return None


def _sum(samples: dict[str, float], family: str, label: str = "") -> float | None:
    """The sum of ``family``'s samples (with ``label`` among their labels, when given): a
    server with its engine in a process of its own exports both processes' GC samples, the
    engine's labelled ``process="engine"``."""
    vals = [
        v
        for k, v in samples.items()
        if (k == family or k.startswith(family + "{")) and (not label or label in k)
    ]
    return sum(vals) if vals else None


def gc_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """The round's server metrics from two scrapes: its GC pauses and its graph health
    (:func:`graph_delta`); {} without the families in both."""
    return {**_gc_only(before, after), **graph_delta(before, after)}


def _gc_only(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """The round's GC metrics from two scrapes ({} without the families in both)."""
    if not before or not after:
        return {}
    out: dict[str, float] = {}
    b, a = _sum(before, GC_PAUSE), _sum(after, GC_PAUSE)
    if b is not None and a is not None:
        out["server_gc_pause_ms"] = (a - b) * 1000.0
    for name, family, label in (
        ("server_gc_full_collections", GC_COLLECTIONS, FULL),
        ("server_gc_slow_pauses", GC_SLOW, ""),
    ):
        b, a = _sum(before, family, label), _sum(after, family, label)
        if b is not None and a is not None:
            out[name] = a - b
    return {k: v for k, v in out.items() if math.isfinite(v)}


GRAPH_EAGER = "flashrec_graph_eager_forwards_total"
GRAPH_REPLAYS = "flashrec_graph_replays_total"
GRAPH_LATE = "flashrec_graph_captures_after_warmup_total"
# round metric -> (family, label selecting its samples, a delta over the round or the total at
# its end): a capture after warm-up counts wherever it happened, between rounds included
GRAPH_METRICS = {
    "server_graph_eager_decode_forwards": (GRAPH_EAGER, 'phase="decode"', True),
    "server_graph_eager_prefill_forwards": (GRAPH_EAGER, 'phase="prefill"', True),
    "server_graph_replay_decode_forwards": (GRAPH_REPLAYS, 'phase="decode"', True),
    "server_graph_replay_prefill_forwards": (GRAPH_REPLAYS, 'phase="prefill"', True),
    "server_graph_captures_after_warmup": (GRAPH_LATE, "", False),
}


def graph_delta(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float]:
    """The round's graph health from two scrapes of FlashRec's ``flashrec_graph_*``
    families: decode and prefill forwards run eagerly (every reason) or replayed during the
    round, and the captures after the server's warm-up as of the round's end. A server
    without the families (another engine, an older FlashRec) gives none: a gate on them is
    then ``no_data`` (:mod:`harness.metrics.checked`), never a pass."""
    if not before or not after:
        return {}
    out: dict[str, float] = {}
    for name, (family, label, delta) in GRAPH_METRICS.items():
        a = _sum(after, family, label)
        b = _sum(before, family, label) if delta else 0.0
        if a is not None and b is not None:
            out[name] = a - b
    return {k: v for k, v in out.items() if math.isfinite(v)}


SLOTS_TOTAL = "flashrec_slots_total"
EAGER_DECODE = "flashrec_decode_eager_forwards_total"
GRAPH_DECODE = "flashrec_decode_graph_forwards_total"


def capacity_notes(
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    beam_width: int,
    concurrency: int,
) -> list[str]:
    """What the server's own counters say limited a round, as report notes:

    - beam rows: ``beam_width x concurrency`` above the server's slot budget
      (``flashrec_slots_total``, ``--batch-slots``) means fewer requests run at once than
      the load sends; the rest wait in the queue, and wide-beam throughput stops rising with
      concurrency;
    - eager decode: forwards that ran eagerly on a server that also replayed decode graphs
      (a request wider than ``--cuda-graph-max-bs``).

    Servers without these families (another engine, an older FlashRec) give no notes."""
    out: list[str] = []
    slots = (after or {}).get(SLOTS_TOTAL)
    rows = beam_width * concurrency
    if slots is not None and slots > 0 and rows > slots:
        fit = int(slots) // beam_width
        out.append(
            f"beam rows: n={beam_width} x concurrency {concurrency} = {rows} > the server's "
            f"{int(slots)} slots (--batch-slots): at most {fit} request(s) run at once, the "
            "rest queue; raise --batch-slots (and --cuda-graph-max-bs) to measure the "
            "concurrency asked for"
        )
    if before and after:
        b, a = _sum(before, EAGER_DECODE), _sum(after, EAGER_DECODE)
        gb, ga = _sum(before, GRAPH_DECODE), _sum(after, GRAPH_DECODE)
        if None not in (b, a, gb, ga) and a - b > 0 and ga - gb > 0:
            out.append(
                "eager decode: decode forwards ran eagerly beside graph replays in measured "
                "rounds (requests wider than --cuda-graph-max-bs; the server's "
                "flashrec_decode_eager_forwards_total counts them)"
            )
    return out


def round_extra(server_rounds: dict[int, dict[str, float]]) -> Extra | None:
    """An ``Extra`` adding each round's server deltas (keyed by the records' round)."""
    if not server_rounds:
        return None

    def extra(ok, out):
        return dict(server_rounds.get(ok[0].round, {})) if ok else {}

    return extra


def chain(*extras: Extra | None) -> Extra | None:
    """Several ``Extra`` functions as one (each sees the metrics of those before it)."""
    live = [e for e in extras if e is not None]
    if not live:
        return None

    def extra(ok, out):
        res: dict[str, float] = {}
        for e in live:
            res.update(e(ok, {**out, **res}))
        return res

    return extra
