"""Prometheus text exposition (format 0.0.4), written by hand.

Two sources feed ``/metrics``: counters and histograms the HTTP layer keeps itself
(:class:`ServerMetrics`, updated only on the event-loop thread) and a snapshot of
``EngineLoop.stats()`` taken at scrape time (gauges and engine-side counters). With several
front-end processes (``--api-server-count``) the HTTP layer's counters are every front end's
summed (``ServerMetrics.merged``), whichever front end answers the scrape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
OUTCOMES = ("success", "invalid", "rejected", "too_large", "error", "cancelled")
ENDPOINTS = ("chat", "generate")

# (stats key, metric name, type, help)
ENGINE_METRICS = (
    ("queue_len", "flashrec_queue_length", "gauge", "Requests waiting for admission."),
    ("running_requests", "flashrec_running_requests", "gauge", "Requests holding beam rows."),
    ("used_slots", "flashrec_slots_used", "gauge", "Beam-row slots held by running requests."),
    ("total_slots", "flashrec_slots_total", "gauge", "Beam-row slot budget (--batch-slots)."),
    (
        "kv_used_tokens",
        "flashrec_kv_tokens_used",
        "gauge",
        "KV pool tokens held by running requests (prefix-cache-only tokens excluded).",
    ),
    (
        "kv_total_tokens",
        "flashrec_kv_tokens_total",
        "gauge",
        "KV pool size in tokens, less the slots reserved for prefill-graph padding.",
    ),
    (
        "kv_cached_tokens",
        "flashrec_kv_tokens_cached",
        "gauge",
        "KV pool tokens held by the radix prefix cache (referenced or not).",
    ),
    (
        "prefix_cache_nodes",
        "flashrec_prefix_cache_nodes",
        "gauge",
        "Nodes of the radix prefix cache (at most --prefix-cache-max-nodes besides those "
        "running requests hold).",
    ),
    (
        "prefix_hit_tokens_total",
        "flashrec_prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens served from the radix prefix cache.",
    ),
    (
        "prompt_tokens_total",
        "flashrec_prompt_tokens_total",
        "counter",
        "Prompt tokens of admitted requests.",
    ),
    ("steps_total", "flashrec_engine_steps_total", "counter", "Engine steps run."),
    (
        "decode_graph_forwards_total",
        "flashrec_decode_graph_forwards_total",
        "counter",
        "Decode forwards run as a CUDA-graph replay.",
    ),
    (
        "decode_eager_forwards_total",
        "flashrec_decode_eager_forwards_total",
        "counter",
        "Decode forwards run eagerly (always on CPU or with --disable-cuda-graph; with graphs, "
        "a request wider than the largest decode graph).",
    ),
    ("catalog_sids", "flashrec_catalog_sids", "gauge", "SIDs of the active catalog."),
    (
        "catalogs_live",
        "flashrec_catalogs_live",
        "gauge",
        "Catalogs alive: the active one and those running requests were admitted with.",
    ),
    (
        "catalog_reloads_ok_total",
        "flashrec_catalog_reloads_ok_total",
        "counter",
        "Catalog hot reloads swapped in (POST /update_catalog).",
    ),
    (
        "catalog_reloads_rejected_total",
        "flashrec_catalog_reloads_rejected_total",
        "counter",
        "Catalog hot reloads refused as invalid (400); the old catalog kept serving.",
    ),
    (
        "catalog_reloads_busy_total",
        "flashrec_catalog_reloads_busy_total",
        "counter",
        "Catalog hot reloads refused because another one was running (409).",
    ),
    (
        "catalog_last_swap_ms",
        "flashrec_catalog_last_swap_ms",
        "gauge",
        "Engine-thread time of the last catalog swap, in milliseconds.",
    ),
    (
        "catalog_rollbacks_ok_total",
        "flashrec_catalog_rollbacks_ok_total",
        "counter",
        "Catalog rollbacks to the previous version swapped in (POST /rollback_catalog).",
    ),
    (
        "catalog_rollbacks_rejected_total",
        "flashrec_catalog_rollbacks_rejected_total",
        "counter",
        "Catalog rollbacks refused: no previous version to return to (400).",
    ),
    (
        "catalog_rollbacks_busy_total",
        "flashrec_catalog_rollbacks_busy_total",
        "counter",
        "Catalog rollbacks refused because a reload or rollback was running (409).",
    ),
    (
        "decode_other_catalog_steps_total",
        "flashrec_decode_other_catalog_steps_total",
        "counter",
        "Decode batches expanded eagerly because they hold a request of a catalog other than "
        "the step graph's (after a catalog hot reload).",
    ),
    (
        "batch_failures_total",
        "flashrec_batch_failures_total",
        "counter",
        "Engine batches that raised; their requests got 500.",
    ),
    (
        "weights_version",
        "flashrec_weights_version",
        "gauge",
        "Weight updates swapped in since start-up (0: the start-up weights).",
    ),
    (
        "weight_updates_ok_total",
        "flashrec_weight_updates_ok_total",
        "counter",
        "Weight updates swapped in (POST /update_weights_from_disk).",
    ),
    (
        "weight_updates_rejected_total",
        "flashrec_weight_updates_rejected_total",
        "counter",
        "Weight updates refused (400): the old weights kept serving.",
    ),
    (
        "weight_updates_busy_total",
        "flashrec_weight_updates_busy_total",
        "counter",
        "Weight updates refused because another one was running (409).",
    ),
    (
        "weights_last_swap_ms",
        "flashrec_weights_last_swap_ms",
        "gauge",
        "Engine-thread time of the last weight swap (copy + cache flush), in milliseconds.",
    ),
)


def _fmt(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# per named catalog: (family, help, the value from its /get_server_info entry)
_CATALOG_GAUGES = (
    ("flashrec_catalog_version", "Served version of each named catalog (1 at start-up, the "
     "next unused number per /update_catalog, the previous one's on /rollback_catalog).",
     lambda c: c["version"]),
    ("flashrec_catalog_previous_version", "Version a /rollback_catalog of each named catalog "
     "returns to (0: none kept).", lambda c: (c["previous"] or {}).get("version") or 0),
    ("flashrec_catalog_size", "SIDs of each named catalog's served version.",
     lambda c: c["sids"] or 0),
    ("flashrec_catalog_device_bytes", "Device bytes of each named catalog's trie, served "
     "and previous version together.",
     lambda c: c["device_bytes"] + ((c["previous"] or {}).get("device_bytes") or 0)),
)  # fmt: skip


def _catalog_families(out: list[str], family: Callable, catalogs: list[dict]) -> None:
    """``flashrec_catalog_*{name=...}``: each named catalog's version, size and device bytes,
    and its hash as an info-style gauge."""
    family("flashrec_catalog_hash_info", "gauge",
           "Each named catalog's served version: its content hash (and whether it is the default).")  # fmt: skip
    for c in catalogs:
        labels = {"name": c["name"], "hash": str(c["hash"]), "default": str(c["default"]).lower()}
        out.append(f"flashrec_catalog_hash_info{_labels(labels)} 1")
    for name, help, value in _CATALOG_GAUGES:
        family(name, "gauge", help)
        for c in catalogs:
            out.append(f"{name}{_labels({'name': c['name']})} {_fmt(value(c))}")


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


@dataclass
class Histogram:
    """Cumulative-bucket histogram of one label set."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)

    def add(self, other: Histogram) -> None:
        """Add ``other``'s observations (same buckets)."""
        if other.buckets != self.buckets:
            raise ValueError("histograms of different buckets cannot be added")
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.total += other.total
        self.count += other.count

    def observe(self, value: float) -> None:
        """Add one observation."""
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: Mapping[str, str]) -> Iterable[str]:
        """``_bucket`` (cumulative, with ``+Inf``), ``_sum`` and ``_count`` samples."""
        for b, c in zip(self.buckets, self.counts):
            yield f"{name}_bucket{_labels({**labels, 'le': _fmt(b)})} {c}"
        yield f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {self.count}"
        yield f"{name}_sum{_labels(labels)} {_fmt(self.total)}"
        yield f"{name}_count{_labels(labels)} {self.count}"


@dataclass
class ServerMetrics:
    """Counters and histograms owned by the HTTP layer."""

    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    latency: dict[str, Histogram] = field(default_factory=dict)
    completion_tokens: int = 0
    cached_tokens: int = 0
    errors: dict[int, int] = field(default_factory=dict)  # HTTP status -> error responses

    def __post_init__(self) -> None:
        for ep in ENDPOINTS:
            self.latency.setdefault(ep, Histogram())
            for outcome in OUTCOMES:
                self.requests.setdefault((ep, outcome), 0)

    def count(self, endpoint: str, outcome: str) -> None:
        """One finished request of ``endpoint`` with ``outcome`` (one of ``OUTCOMES``)."""
        key = (endpoint, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1

    def count_error(self, status: int) -> None:
        """One error response (status >= 400) on any path, including those answered before
        routing (unparsable requests, header timeouts)."""
        self.errors[status] = self.errors.get(status, 0) + 1

    def observe_latency(self, endpoint: str, seconds: float) -> None:
        """End-to-end latency of one successful request."""
        self.latency.setdefault(endpoint, Histogram()).observe(seconds)

    def served(self) -> int:
        """Generation requests finished, whatever their outcome."""
        return sum(self.requests.values())

    @classmethod
    def merged(cls, parts: Iterable[ServerMetrics]) -> ServerMetrics:
        """The sum of several front ends' counters and histograms."""
        out = cls()
        for m in parts:
            for key, n in m.requests.items():
                out.requests[key] = out.requests.get(key, 0) + n
            for status, n in m.errors.items():
                out.errors[status] = out.errors.get(status, 0) + n
            for ep, hist in m.latency.items():
                out.latency.setdefault(ep, Histogram(buckets=hist.buckets)).add(hist)
            out.completion_tokens += m.completion_tokens
            out.cached_tokens += m.cached_tokens
        return out

    def render(
        self,
        stats: Mapping[str, float],
        extra: Mapping[str, float],
        gc: Mapping[str, Any] | None = None,
        engine_gc: Mapping[str, Any] | None = None,
        frontends: Sequence[tuple[int, int, Mapping[str, Any] | None]] = (),
    ) -> str:
        """The full exposition text: engine ``stats``, ``extra`` gauges, own counters and the
        garbage collector's pauses (``GcWatch.metrics()``): the server process's unlabelled,
        an engine process's (``--engine-process``) labelled ``process="engine"``. With several
        front ends, ``frontends`` holds every front end's ``(index, requests served, GC
        metrics)``: each front end's requests are counted apart, and the GC samples of front
        ends other than the server process (index 0, whose are ``gc``) are labelled
        ``process="frontend-<index>"``."""
        out: list[str] = []

        def family(name: str, kind: str, help: str) -> None:
            out.append(f"# HELP {name} {help}")
            out.append(f"# TYPE {name} {kind}")

        for key, name, kind, help in ENGINE_METRICS:
            if key in stats:
                family(name, kind, help)
                out.append(f"{name} {_fmt(stats[key])}")
        if stats.get("graph"):  # flashrec_graph_*: captures, replays, eager forwards by reason
            _graph_families(out, family, stats["graph"])
        if "catalog_hash" in stats:  # an info-style gauge: the hash as a label
            family("flashrec_catalog_info", "gauge", "The default catalog: its content hash.")
            label = _labels({"hash": str(stats["catalog_hash"])})
            out.append(f"flashrec_catalog_info{label} 1")
        if stats.get("catalogs"):  # every named catalog (--sid-vocab-file NAME=PATH)
            _catalog_families(out, family, stats["catalogs"])
        if "weights_hash" in stats:  # an info-style gauge: the served weights' identity
            family("flashrec_weights_info", "gauge", "The served weights: path and content hash.")
            wl = {"path": str(stats.get("weights_path", "")), "hash": str(stats["weights_hash"])}
            out.append(f"flashrec_weights_info{_labels(wl)} 1")
        for name, value in extra.items():
            family(name, "gauge", _EXTRA_HELP.get(name, name))
            out.append(f"{name} {_fmt(value)}")
        family("flashrec_requests_total", "counter", "Generation requests by endpoint and outcome.")
        for (ep, outcome), n in sorted(self.requests.items()):
            out.append(
                f"flashrec_requests_total{_labels({'endpoint': ep, 'outcome': outcome})} {n}"
            )
        family(
            "flashrec_http_errors_total",
            "counter",
            "Error responses (4xx, 5xx) on every path by HTTP status, unparsable requests and "
            "read timeouts included.",
        )
        for status, n in sorted(self.errors.items()):
            out.append(f"flashrec_http_errors_total{_labels({'status': str(status)})} {n}")
        family(
            "flashrec_completion_tokens_total",
            "counter",
            "Generated tokens summed over all returned beams.",
        )
        out.append(f"flashrec_completion_tokens_total {self.completion_tokens}")
        family(
            "flashrec_cached_tokens_total",
            "counter",
            "Prompt tokens reported as cached to clients.",
        )
        out.append(f"flashrec_cached_tokens_total {self.cached_tokens}")
        family(
            "flashrec_request_latency_seconds",
            "histogram",
            "End-to-end latency of successful generation requests.",
        )
        for ep, hist in sorted(self.latency.items()):
            out.extend(hist.lines("flashrec_request_latency_seconds", {"endpoint": ep}))
        if frontends:
            family(
                "flashrec_frontend_requests_total",
                "counter",
                "Generation requests finished by each HTTP front-end process (--api-server-count).",
            )
            for index, n, _ in sorted(frontends, key=lambda f: f[0]):
                label = _labels({"frontend": str(index)})
                out.append(f"flashrec_frontend_requests_total{label} {n}")
        procs = [(lab, g) for lab, g in (({}, gc), ({"process": "engine"}, engine_gc)) if g]
        procs += [({"process": f"frontend-{i}"}, g) for i, _, g in frontends if g and i != 0]
        if procs:
            _gc_families(out, family, procs)
        return "\n".join(out) + "\n"


def _graph_families(out: list[str], family: Callable[[str, str, str], None], g: Mapping) -> None:
    """The ``flashrec_graph_*`` families from ``GraphStats.snapshot()`` (engine/graph_stats.py):
    every kind and every eager reason has a sample, 0 until it happens, so a gate reads 0,
    not nothing."""
    family(
        "flashrec_graph_captures_total",
        "counter",
        "CUDA graphs captured, by kind (decode, step, prefill, piecewise) and size (rows or "
        "tokens); none on CPU.",
    )
    for kind, size, n in g["captures"]:
        out.append(f"flashrec_graph_captures_total{_labels({'kind': kind, 'size': size})} {n}")
    family(
        "flashrec_graph_captures_after_warmup_total",
        "counter",
        "CUDA graphs captured after the warm-up, while serving (a capture under load stalls it).",
    )
    for kind, n in g["captures_after_warmup"].items():
        out.append(f"flashrec_graph_captures_after_warmup_total{_labels({'kind': kind})} {n}")
    family(
        "flashrec_graph_replays_total",
        "counter",
        "Decode and prefill forwards served by a CUDA graph replay, by phase and graph kind.",
    )
    phase = {"decode": "decode", "step": "decode", "prefill": "prefill", "piecewise": "prefill"}
    for kind, n in g["replays"].items():
        labels = _labels({"phase": phase.get(kind, kind), "kind": kind})
        out.append(f"flashrec_graph_replays_total{labels} {n}")
    family(
        "flashrec_graph_eager_forwards_total",
        "counter",
        "Decode and prefill forwards run eagerly, by phase and reason (device_cpu, disabled, "
        "over_max_batch, attention_declined, over_max_tokens, over_max_prompts, "
        "shape_not_captured).",
    )
    for ph, reason, n in g["eager"]:
        labels = _labels({"phase": ph, "reason": reason})
        out.append(f"flashrec_graph_eager_forwards_total{labels} {n}")


def _gc_families(out: list[str], family: Callable[[str, str, str], None], procs: list) -> None:
    """The ``flashrec_gc_*`` families, one set of samples per (labels, GcWatch.metrics())."""
    per_generation = (
        (
            "flashrec_gc_collections_total",
            "Python garbage collections by generation (each stops every thread of its process).",
            "collections",
        ),
        (
            "flashrec_gc_pause_seconds_total",
            "Time spent in Python garbage collections, by generation.",
            "pause_s",
        ),
    )
    for name, help, key in per_generation:
        family(name, "counter", help)
        for lab, gc in procs:
            for g, value in enumerate(gc[key]):
                out.append(f"{name}{_labels({'generation': str(g), **lab})} {_fmt(value)}")
    rows = (
        (
            "flashrec_gc_pause_max_seconds",
            "gauge",
            "Longest garbage-collector pause.",
            "max_pause_s",
        ),
        (
            "flashrec_gc_slow_pauses_total",
            "counter",
            "Garbage-collector pauses of 50 ms or more (logged as warnings).",
            "slow",
        ),
        (
            "flashrec_gc_frozen_objects",
            "gauge",
            "Objects moved to the permanent GC generation at start-up (--gc-freeze).",
            "frozen",
        ),
        (
            "flashrec_gc_gen0_threshold",
            "gauge",
            "Allocations between generation-0 collections (--gc-gen0-threshold).",
            "gen0_threshold",
        ),
    )
    for name, kind, help, key in rows:
        family(name, kind, help)
        for lab, gc in procs:
            out.append(f"{name}{_labels(lab) if lab else ''} {_fmt(gc[key])}")


_EXTRA_HELP = {
    "flashrec_ready": "1 once warm-up is done and the server accepts requests.",
    "flashrec_draining": "1 while shutting down (new requests get 503).",
    "flashrec_http_inflight_requests": "Generation requests the HTTP layer is waiting on.",
    "flashrec_profiler_active": "1 while a torch profiler trace is being recorded.",
}
