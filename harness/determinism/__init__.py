"""Determinism: the same temperature-0 requests through fresh, independent server processes,
compared bit for bit.

    workload (>= 120 distinct prompts, varied n)
      -> P fresh processes, one after another; each gets every request
         sequential: one at a time, in order   (must be bit-identical)
         concurrent: C in flight               (batch composition varies: drift is reported)
      -> per request: token ids and the exact float bits of every score vs process 0
      -> on drift: replay up to the last drifting request with FLASHREC_DEBUG_STEP_HASH=1 and
         read the STEP_HASH lines of each server log: the first step whose ``inputs`` differ is
         host-side state, the first whose ``outputs`` differ with equal inputs is numerics.

The replay keeps the drifting requests in their original context (everything sent before
them, same mode and concurrency): state-dependent drift, such as a stale host cache, needs it.

    compare.py    workload items, answers, bitwise comparison across processes
    stephash.py   STEP_HASH log parsing and the first divergent step
    processes.py  launching fresh servers and sending them the workload
    run.py        the run over modes, the step-hash replay, the report.json cut
    cli.py        ``flashrec-bench determinism``

NOTE: :func:`run_stage` (the runner adapter) lives here, not in run.py, so that it finds
:func:`run_determinism` in this namespace, where tests replace it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from harness.determinism.cli import _pairs, build_parser, main
from harness.determinism.compare import (
    DEFAULT_NS,
    Answer,
    Item,
    bits,
    compare_processes,
    drift,
    identical,
    make_workload,
    parse_answer,
)
from harness.determinism.processes import Plan, run_processes
from harness.determinism.run import compact, localise, run_determinism
from harness.determinism.stephash import (
    AFTER_STEPS,
    DEBUG_ENV,
    HOST_STATE,
    NUMERICS,
    StepHash,
    first_divergence,
    parse_step_hashes,
)
from harness.parity import engine_device

__all__ = [
    "AFTER_STEPS",
    "DEBUG_ENV",
    "DEFAULT_NS",
    "HOST_STATE",
    "NUMERICS",
    "Answer",
    "Item",
    "Plan",
    "StepHash",
    "_pairs",
    "bits",
    "build_parser",
    "compact",
    "compare_processes",
    "drift",
    "first_divergence",
    "identical",
    "localise",
    "main",
    "make_workload",
    "parse_answer",
    "parse_step_hashes",
    "run_determinism",
    "run_processes",
    "run_stage",
]


def run_stage(section: Any, ctx: Any) -> dict:
    """Campaign adapter (``harness.run.campaign.STAGES``): the ``determinism:`` section +
    StageContext; returns :func:`compact` of the result with ``details`` naming the full JSON.

    Section keys: requests, processes, mode, concurrency, server_args, server_env, protocol,
    ns, median_tokens, seed, device, strict_concurrent (the model comes from the matrix).
    """
    spec = section.model_dump() if hasattr(section, "model_dump") else dict(section)
    spec.pop("enabled", None)
    spec.setdefault("device", engine_device(ctx))
    model = ctx.model
    if model is None or not model.path:
        return {"status": "error", "passed": False, "error": "determinism needs 'model:'"}
    if "ns" in spec:
        spec["ns"] = tuple(spec["ns"])
    out = Path(ctx.out_dir) / "determinism"
    try:
        result = run_determinism(
            model.path,
            model.catalog,
            out_dir=out,
            log=lambda msg: print(msg, file=sys.stderr),
            **spec,
        )
    except Exception as exc:  # noqa: BLE001 - a stage reports, it does not abort the report
        return {
            "status": "error",
            "passed": False,
            "error": f"{type(exc).__name__}: {exc}",
            "log_tail": getattr(exc, "log_tail", ""),
        }
    return {**compact(result), "details": str(out / "determinism.json")}
