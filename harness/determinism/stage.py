"""The ``determinism:`` matrix stage: the section and the run's context in, :func:`compact` of
:func:`~harness.determinism.check.run_determinism`'s result out (``harness.run.stages``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from harness.determinism.check import compact, run_determinism
from harness.parity.stage import engine_device


def run_stage(section: Any, ctx: Any) -> dict:
    """The stage entry (``harness.run.stages``): the ``determinism:`` section + the run's
    ``StageContext``; returns :func:`compact` of the result with ``details`` naming the full
    JSON.

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
