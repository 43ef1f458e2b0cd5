"""The parity matrix stage: :func:`run_parity_stage` compares the servers of
:mod:`harness.parity.servers` (one candidate) or runs :mod:`harness.parity.multi` (several)
and writes ``parity.json``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from harness.parity.candidates import reference_dtype
from harness.parity.compare import failure_text, parity_result, precision_args, thresholds_for
from harness.parity.fetch import (
    CaseProgress,
    compare_servers,
    default_max_tokens,
    detect_protocols,
    no_shared_protocol,
    spec_prompts,
)
from harness.parity.multi import run_candidates
from harness.parity.servers import serving

# --------------------------------------------------------------------------- matrix stage


async def _compare_stage(
    spec: dict, urls: dict[str, str], model_path: str | None, log: Any = None
) -> dict:
    async with aiohttp.ClientSession() as session:
        protocols = spec.get("protocols") or "auto"
        why: dict[str, str] = {}
        if protocols == "auto":
            a = await detect_protocols(session, urls["reference"], why)
            b = await detect_protocols(session, urls["candidate"], why)
            protocols = [p for p in a if p in b]
        if not protocols:
            raise ValueError(no_shared_protocol(why))
        max_tokens = spec.get("max_tokens") or await default_max_tokens(
            session, urls["candidate"], urls["reference"]
        )
        prompts = spec_prompts(spec, model_path)
        ns = [int(n) for n in spec.get("ns", [1, 4, 16, 64])]
        total = len(protocols) * len(prompts) * len(ns)
        progress = CaseProgress("reference and candidate", total, log) if log else None
        cases = await compare_servers(
            session,
            urls["reference"],
            urls["candidate"],
            prompts,
            ns,
            list(protocols),
            int(max_tokens),
            float(spec.get("timeout_s", 300.0)),
            progress,
        )
    precision = str(spec.get("precision", "float32"))
    th = thresholds_for(precision, spec.get("thresholds"))
    return parity_result(cases, th, precision, list(protocols))


def run_parity_stage(
    spec: dict,
    model_path: str | None = None,
    sid_vocab_file: str | None = None,
    out_dir: str | Path = "parity",
    log: Any = print,
    resume: bool = False,
    engines: dict | None = None,
) -> dict:
    """The ``parity:`` matrix stage (``resume``: the ``candidates:`` form reads back the
    answers an earlier, interrupted run saved; :mod:`harness.parity.saved`).

    ``spec`` keys (all optional): ``reference_url`` / ``candidate_url`` (else an HF reference
    server and a FlashRec server are launched on ``model_path``), ``server_args`` (FlashRec
    flags), ``reference_args`` (reference-server flags: ``dtype``, ``logprob_scope``, ...),
    ``device``, ``ns`` ([1, 4, 16, 64]), ``prompts`` (8), ``median_tokens``,
    ``system_prompt_tokens``, ``seed``, ``protocols`` ("auto" or a list), ``max_tokens``
    (SID depth + 1), ``precision`` (float32 | bfloat16 | fp8: the thresholds, and the
    launched servers' dtype / quantization flags, :data:`PRECISION_ARGS`), ``thresholds``
    (field overrides of :class:`Thresholds`), ``reference_dtype`` (the reference server's
    dtype, else the precision's), ``startup_timeout_s`` (600). With ``candidates`` (a list) the
    stage compares several candidates with one reference instead (:mod:`harness.parity.multi`,
    keys in :mod:`harness.parity.candidates`; ``engines``: the matrix's engines by name, for
    candidates that name one). Returns the :func:`parity_result` dict (``status``
    "error" with ``error`` when the stage could not run), also written to
    ``out_dir/parity.json``.
    """
    out = Path(out_dir)
    t0 = time.monotonic()
    try:
        if "candidates" in spec:
            result = run_candidates(spec, model_path, sid_vocab_file, out, log, resume, engines)
            return _finish(result, out, t0, log)
        if "ns" in spec and not spec["ns"]:
            raise ValueError("parity: 'ns' is empty: no beam width to compare")
        cand_args, ref_args = precision_args(str(spec.get("precision", "float32")))
        if spec.get("reference_dtype"):
            ref_args["dtype"] = reference_dtype(spec["reference_dtype"])
        with serving(
            model_path,
            sid_vocab_file,
            out / "servers",
            spec.get("reference_url"),
            spec.get("candidate_url"),
            spec.get("device"),
            {**cand_args, **(spec.get("server_args") or {})},
            {**ref_args, **(spec.get("reference_args") or {})},
        ) as urls:
            result = asyncio.run(_compare_stage(spec, urls, model_path, log))
            result["servers"] = urls
    except Exception as exc:  # noqa: BLE001 - a stage reports, it does not abort the report
        result = {"status": "error", "passed": False, "error": f"{type(exc).__name__}: {exc}"}
        if getattr(exc, "log_tail", ""):
            result["log_tail"] = exc.log_tail
    return _finish(result, out, t0, log)


def _finish(result: dict, out: Path, t0: float, log: Any) -> dict:
    """Time the result, write ``parity.json``, print a failure's details."""
    result["duration_s"] = round(time.monotonic() - t0, 2)
    out.mkdir(parents=True, exist_ok=True)
    (out / "parity.json").write_text(json.dumps(result, indent=1, default=str))
    if result["status"] == "fail":
        log(failure_text(result))
    return result


def engine_device(ctx: Any) -> str | None:
    """The matrix's first engine's device (the stage's default)."""
    engines = getattr(getattr(ctx, "spec", None), "engine_list", None) or []
    return engines[0].device if engines else None


def compact(result: dict, tables: int = 3) -> dict:
    """The result for report.json: without per-case rows, at most ``tables`` diff tables
    (the full result stays in ``parity.json``)."""
    out = {k: v for k, v in result.items() if k != "cases"}
    if "candidates" in out:  # each candidate's diff tables stay in parity.json
        out["candidates"] = [
            {k: v for k, v in c.items() if k != "diff_tables"} for c in out["candidates"]
        ]
    if "diff_tables" in out:
        out["diff_tables"] = out["diff_tables"][:tables]
    return out


def run_stage(section: Any, ctx: Any) -> dict:
    """The stage entry (``harness.run.stages``): the ``parity:`` section + the run's
    ``StageContext``; returns :func:`compact` of the result with ``details`` naming the full
    ``parity.json``."""
    spec = section.model_dump() if hasattr(section, "model_dump") else dict(section)
    spec.pop("enabled", None)
    spec.setdefault("device", engine_device(ctx))
    model = ctx.model
    out = Path(ctx.out_dir) / "parity"
    # candidates launched as one of the matrix's engines (a peer engine by its own command)
    named = [c for c in spec.get("candidates") or [] if isinstance(c, dict) and c.get("engine")]
    engines = getattr(getattr(ctx, "spec", None), "engine_list", None) or []
    extra = {"engines": {e.name: e for e in engines}} if named else {}
    result = run_parity_stage(
        spec, model.path if model else None, model.catalog if model else None, out,
        resume=getattr(ctx, "resume", False), **extra,
    )  # fmt: skip
    return {**compact(result), "details": str(out / "parity.json")}
