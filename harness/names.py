"""The names the harness's layers agree on: metric names and their directions, the sections of
a report and the fields of its cells.

Below every other harness module (it imports none), so that the matrix loader
(:mod:`harness.spec.load`) checks what gates and targets name without importing the metrics,
the report or the judges; :mod:`harness.report.model` is held to :data:`REPORT_SECTIONS` and
:data:`CELL_FIELDS` by the tests.
"""

from __future__ import annotations

# +1: higher is better, -1: lower is better, 0: informational
DIRECTIONS: dict[str, int] = {
    "qps": 1,
    "latency_mean_ms": -1,
    "latency_p50_ms": -1,
    "latency_p90_ms": -1,
    "latency_p99_ms": -1,
    "error_rate": -1,
    "invalid_rate": -1,
    "duplicate_rate": -1,
    "beams_mean": 1,
    "cached_frac": 0,
    "prompt_tokens_mean": 0,
    # the server's prefix cache over the round, summed over replicas (harness.metrics.replicas)
    "server_radix_hit_rate": 0,
    "server_prefill_tokens_per_request": 0,
    # load mode "burst": first send -> last answer of each complete burst (harness.load.loop)
    "burst_ms_mean": -1,
    "burst_ms_max": 0,
    # load mode "closed": completions per second while every client has a request in flight
    # (closed_extra); informational, so the calibrated A/B gate does not grow
    "qps_steady": 0,
    # the traced GPU work per request x the round's QPS: the GPU's busy share it implies
    # (harness.metrics.rounds.busy_extra); informational
    "gpu_busy_implied": 0,
    # derived (harness.metrics.flops): with an ``mfu:`` section / an HF baseline
    "tflop_per_request": 0,
    "achieved_tflops": 1,
    "mfu": 1,
    "speedup_vs_hf": 1,
    "hf_latency_ratio": 1,
    # the server's Server-Timing header (FlashRec), means over a round's ok requests; they
    # explain latency (which is gated itself), so they stay informational: gating them too
    # would add comparisons, and false alarms, to the calibrated A/B gate
    "server_tokenize_ms_mean": 0,
    "server_queue_ms_mean": 0,
    "server_engine_ms_mean": 0,
    "server_ipc_ms_mean": 0,  # FlashRec --engine-process: engine process -> server process
    "server_respond_ms_mean": 0,  # FlashRec: beams on the host -> answer text
    "server_handoff_ms_mean": 0,  # FlashRec: respond's part up to the handler (not summed)
    "server_body_cpu_ms_mean": 0,  # FlashRec: the event loop's CPU time after the hand-off
    "outside_server_ms_mean": 0,  # client latency - the phases above: HTTP, event loops
    "host_path_ms_mean": 0,  # client latency - engine: every phase but the engine's own
    # the server's own counters over the round (harness.metrics.server), informational
    "server_gc_pause_ms": 0,
    "server_gc_full_collections": 0,
    "server_gc_slow_pauses": 0,
    # the server's graph health over the round (harness.metrics.server.graph_delta): forwards
    # that ran eagerly or replayed a CUDA graph, captures since warm-up; informational (gate
    # them by threshold: == 0)
    "server_graph_eager_decode_forwards": 0,
    "server_graph_eager_prefill_forwards": 0,
    "server_graph_replay_decode_forwards": 0,
    "server_graph_replay_prefill_forwards": 0,
    "server_graph_captures_after_warmup": 0,
    # other processes' CPU use on the host over the round (harness.metrics.host), informational
    "host_other_cpu_cores": 0,
    "host_steal_cores": 0,
    "harness_cpu_cores": 0,  # the load generator's own CPU (near 1: the client sets the pace)
    # the server's own CPU over the round (harness.metrics.host.server_cpu), informational
    "server_cpu_ms_per_request": 0,
    "server_main_cpu_ms_per_request": 0,
    "server_main_cpu_cores": 0,
    # the quality: section's eval (harness.quality): beams not in the catalog, repeated beams
    "quality_invalid_rate": -1,
    "quality_duplicate_rate": -1,
}
# the informational metrics' good direction, for when a gate is asked to judge one by name
# (``flashrec-bench gate --metrics``): times and pauses lower, the steady rate higher; the
# rest (shares, token counts, CPU cores) have none and are only reported as changed or not
NAMED_DIRECTIONS: dict[str, int] = {
    "qps_steady": 1,
    "burst_ms_max": -1,
    "server_tokenize_ms_mean": -1,
    "server_queue_ms_mean": -1,
    "server_engine_ms_mean": -1,
    "server_ipc_ms_mean": -1,
    "server_respond_ms_mean": -1,
    "server_handoff_ms_mean": -1,
    "server_body_cpu_ms_mean": -1,
    "outside_server_ms_mean": -1,
    "host_path_ms_mean": -1,
    "server_gc_pause_ms": -1,
    "server_gc_full_collections": -1,
    "server_gc_slow_pauses": -1,
    "server_graph_eager_decode_forwards": -1,
    "server_graph_eager_prefill_forwards": -1,
    "server_graph_captures_after_warmup": -1,
    "server_cpu_ms_per_request": -1,
    "server_main_cpu_ms_per_request": -1,
}
# hit / recall / NDCG / MRR of a workload with ground truth; pass, position1_pass and recall by
# SID and PID of the quality: section's eval (harness.quality): higher is better for all
QUALITY_PREFIXES = (
    "hit@", "recall@", "ndcg@", "mrr@",
    "pass@", "position1_pass@", "pid_pass@", "pid_position1_pass@", "pid_recall@",
)  # fmt: skip

# the top-level keys of report.json and of each of its cells: what a gate's ``path`` may start
# with (harness.spec.load.check_references)
REPORT_SECTIONS = (
    "schema_version", "run_id", "created", "clock_epoch_unix", "environment", "matrix", "model",
    "measurement", "cells", "engines", "parity", "determinism", "gates", "targets", "summary",
    "files", "interrupted",
)  # fmt: skip
CELL_FIELDS = (
    "id", "engine", "params", "status", "error", "log_tail", "rounds", "round_metrics",
    "metrics", "notes", "trace", "excluded_requests", "warmup", "server", "duration_s",
    "baseline", "mfu", "measured", "resumed", "quality", "unchecked",
)  # fmt: skip


def direction(name: str) -> int:
    """Whether a larger value of metric ``name`` is better (+1), worse (-1) or neither (0)."""
    if name.startswith(QUALITY_PREFIXES):
        return 1
    return DIRECTIONS.get(name, 0)


def named_direction(name: str) -> int:
    """:func:`direction`, or for an informational metric judged by name its
    :data:`NAMED_DIRECTIONS` entry (0 where it has none)."""
    return direction(name) or NAMED_DIRECTIONS.get(name, 0)


def is_metric(name: str, ks: list[int]) -> bool:
    """Whether ``name`` is a cell metric: one of :data:`DIRECTIONS`, or a quality metric
    (``hit@K`` ...) at a K of ``quality.ks``."""
    prefix, at, k = name.partition("@")
    if at:
        return f"{prefix}@" in QUALITY_PREFIXES and k.isdigit() and int(k) in ks
    return name in DIRECTIONS


def metric_names(ks: list[int]) -> list[str]:
    """Every metric name a cell can have under ``quality.ks``."""
    return [*DIRECTIONS, *(f"{p}{k}" for p in QUALITY_PREFIXES for k in ks)]
