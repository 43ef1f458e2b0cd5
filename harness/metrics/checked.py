"""Why a cell has no value of a metric: what the run could not check, in words.

A metric is measured only where the run could check it: invalid SIDs need a catalog,
duplicates an answer of more than one beam, hit@K ground truth, MFU a FLOP model, and so on.
A metric that could not be checked is left out of the cell's ``metrics`` (``-`` in tables) and
its reason goes into the cell's ``unchecked``; a gate on it is then ``no_data`` with that
reason (:mod:`harness.judge.gates`), never a pass on a value nobody measured. A metric absent
without a reason here (e.g. every request failed) still fails a gate.
"""

from __future__ import annotations

from typing import Any

from harness.load.client import Record
from harness.metrics.host import METRICS as HOST_METRICS
from harness.metrics.host import SERVER_METRICS
from harness.metrics.rounds import DIRECTIONS, QUALITY_PREFIXES, SERVER_PHASES, counted
from harness.metrics.server import GRAPH_METRICS

WORKLOAD_QUALITY = ("hit@", "ndcg@", "mrr@")  # the workload's ground-truth metrics (recall@: both)
EVAL_QUALITY = ("pass@", "position1_pass@", "pid_pass@", "pid_position1_pass@", "pid_recall@")
NO_CATALOG = (
    "no catalog: invalid SIDs not checked (give the matrix a catalog: path, or quick --catalog)"
)
ONE_BEAM = "one beam per answer: duplicates cannot occur, so none were checked"
NO_TRUTH = "no ground truth: the workload's prompts carry no answer to score"
SERVER_PHASE_METRICS = {
    *(f"server_{p}_ms_mean" for p in (*SERVER_PHASES, "ipc", "respond", "handoff", "body_cpu")),
    "outside_server_ms_mean",
    "host_path_ms_mean",
}
# harness.metrics.replicas: each server's prefix-cache counters around a round
CACHE_METRICS = ("server_radix_hit_rate", "server_prefill_tokens_per_request")
GC_METRICS = ("server_gc_pause_ms", "server_gc_full_collections", "server_gc_slow_pauses")


def malformed_note(records: list[Record]) -> str | None:
    """A note for beams that are no SID at all when there was no catalog to check the rest:
    the only invalid beams the run could see (None when there were none, or a catalog)."""
    ok = [r for r in counted(records) if r.ok]
    if not ok or all(r.sids_checked for r in ok):
        return None
    bad, beams = sum(r.invalid for r in ok), sum(r.beams for r in ok)
    if not bad:
        return None
    return (
        f"{bad} of {beams} beams are no SID at all ({100 * bad / beams:.2f}%); "
        "without a catalog the others were not checked"
    )


def _quality_reason(name: str, quality: dict | None, evaluated_names: set[str]) -> str | None:
    """Why the quality eval gave no ``name`` (None when it should have: a failed eval)."""
    if quality is None:
        return "no quality eval of this cell (quality: section and its cells)"
    if quality.get("status") != "ok":
        return None  # an eval that failed is a failure, not something unmeasurable
    if name.startswith("pid_") and not quality.get("pid_mode"):
        return "no sid2pid mapping: item-id (pid_) metrics not scored"
    if name == "quality_invalid_rate" and not quality.get("catalog_checked"):
        return NO_CATALOG
    if name == "quality_duplicate_rate" and (quality.get("protocol") or {}).get("beam_width") == 1:
        return ONE_BEAM
    if name not in evaluated_names and "@" in name:
        return f"the quality eval scores ks {(quality.get('protocol') or {}).get('ks')}"
    return None


def _mfu_reason(name: str, mfu: dict | None, ok: list[Record]) -> str | None:
    if mfu is None:
        return "no FLOP model: the matrix has no mfu: section"
    if "linear_params" not in mfu:
        return f"no FLOP model: {mfu.get('error', 'no parameter count')}"
    if any(r.prompt_tokens is None for r in ok):
        return "the server reports no prompt token count (usage.prompt_tokens) to count FLOPs"
    if name == "mfu" and not mfu.get("ceiling_tflops"):
        return mfu.get("error") or "no peak TFLOP/s (mfu.ceiling_tflops) for this cell"
    return None


def _hf_reason(hf: dict | None) -> str | None:
    if not hf:
        return "no HF baseline of this cell (baseline: hf)"
    if hf.get("status") == "skipped":
        return f"HF baseline skipped: {hf.get('hf_skipped')}"
    return None  # failed: a failure, not something unmeasurable


def _reason(name: str, res: Any, ok: list[Record], evaluated: set[str]) -> str | None:
    """Why cell ``res`` (a :class:`harness.run.cell.CellResult`) has no ``name``, or None."""
    if name == "invalid_rate" and ok and not all(r.sids_checked for r in ok):
        return NO_CATALOG
    if name == "duplicate_rate" and ok and all(r.beams <= 1 for r in ok):
        return ONE_BEAM
    if name.startswith(WORKLOAD_QUALITY) or name.startswith("recall@"):
        if ok and not any(r.quality for r in ok):
            if name.startswith("recall@") and res.quality is not None:
                return _quality_reason(name, res.quality, evaluated)
            return NO_TRUTH
        return None
    if name.startswith(EVAL_QUALITY) or name in ("quality_invalid_rate", "quality_duplicate_rate"):
        return _quality_reason(name, res.quality, evaluated)
    if name in ("tflop_per_request", "achieved_tflops", "mfu"):
        return _mfu_reason(name, res.mfu, ok)
    if name in ("speedup_vs_hf", "hf_latency_ratio"):
        return _hf_reason((res.baseline or {}).get("hf"))
    if name == "qps_steady":
        if not res.closed:
            return "not a closed load: no steady window of every client busy"
        return f"fewer than 3 x {res.closed} answers a round: no window with every client busy"
    if name in ("burst_ms_mean", "burst_ms_max") and not res.burst:
        return "not a burst load"
    if name == "gpu_busy_implied":
        return (
            "no traced GPU work per request (the cell was not traced, or its trace has no GPU "
            "window on the harness's clock)"
        )
    if name in ("prompt_tokens_mean", "cached_frac") and ok:
        field = "prompt_tokens" if name == "prompt_tokens_mean" else "cached_tokens"
        return f"the server reports no {field} in its answers' usage"
    if name in SERVER_PHASE_METRICS and ok:
        return "the server sends no Server-Timing header with this phase"
    if name in GC_METRICS:
        return "the server's /metrics has no Python GC counters"
    if name in GRAPH_METRICS:
        return "the server's /metrics has no graph counters (flashrec_graph_*)"
    if name in CACHE_METRICS:
        return (
            "a server's /metrics has no prefix-cache counters (flashrec_prompt_tokens_total, "
            "flashrec_prefix_hit_tokens_total)"
        )
    if name in HOST_METRICS or name in SERVER_METRICS:
        return "no CPU reading of the server's processes (not launched by this run, or no /proc)"
    return None


def unchecked(res: Any, metrics: dict[str, dict], ks: list[int]) -> dict[str, str]:
    """``{metric: why}`` for every metric a gate can name (:data:`DIRECTIONS`, quality metrics
    at ``ks``) that cell ``res`` lacks because the run could not check it. Empty for a cell
    that did not run (its metrics are missing for that reason)."""
    if res.status != "ok":
        return {}
    ok = [r for r in counted(res.records) if r.ok]
    quality = res.quality if isinstance(res.quality, dict) else None
    evaluated = set(((quality or {}).get("overall") or {}).get("metrics") or {})
    names = [*DIRECTIONS, *(f"{p}{k}" for p in QUALITY_PREFIXES for k in ks)]
    out = {}
    for name in names:
        if name in metrics:
            continue
        why = _reason(name, res, ok, evaluated)
        if why:
            out[name] = why
    return out
