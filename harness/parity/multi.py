"""The ``candidates:`` form of the parity stage: one HF reference (``reference_dtype``,
float32 by default) answers every (protocol, prompt, n) first; then each candidate (FlashRec
at a precision, or the HF reference at another dtype) is launched alone, asked the same
cases, compared and stopped. One server at a time: each gets the whole GPU, and every
candidate is judged against the very same reference beams."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from harness.parity.candidates import (
    Candidate,
    Plan,
    against_rows,
    candidate_result,
    multi_result,
    parse_plan,
)
from harness.parity.fetch import (
    PROTOCOLS,
    CaseProgress,
    default_max_tokens,
    detect_protocols,
    fetch_all,
    no_shared_protocol,
    spec_prompts,
)
from harness.parity.fetch import cases_from as _cases_from
from harness.parity.saved import asked_key, load, save
from harness.parity.servers import one_server

_ROLE = {"flashrec": "candidate", "reference": "reference", "engine": "candidate"}


async def _fetch(spec: dict, url: str, prompts: list, ns: list[int], max_tokens: int | None,
                 wanted: list[str] | None, label: str = "", log: Any = None,
                 ) -> tuple[dict, list[str], int, dict]:  # fmt: skip
    """(beams per case, protocols asked, max_tokens, why a protocol was left out); with
    ``log``, a progress line about every 10 s (:class:`CaseProgress`)."""
    why: dict[str, str] = {}
    async with aiohttp.ClientSession() as session:
        protocols = spec.get("protocols") or "auto"
        if protocols == "auto":
            protocols = await detect_protocols(session, url, why)
        protocols = [p for p in protocols if wanted is None or p in wanted]
        if not protocols:
            raise ValueError(no_shared_protocol(why))
        max_tokens = max_tokens or spec.get("max_tokens") or await default_max_tokens(session, url)
        total = len(protocols) * len(prompts) * len(ns)
        beams = await fetch_all(
            session, url, prompts, ns, protocols, int(max_tokens),
            float(spec.get("timeout_s", 300)), CaseProgress(label, total, log) if log else None,
        )  # fmt: skip
    return beams, protocols, int(max_tokens), why


def _read_back(path: Path, key: str, resume: bool, label: str, log: Any):
    """With ``--resume``, a server's answers saved by an earlier run of the same cases."""
    got = load(path, key) if resume else None
    if got is not None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(got[1].get("saved_at") or 0))
        log(f"parity: {label}: {len(got[0])} cases read back from the run of {when} (--resume)")
    return got


def _run_candidate(
    cand: Candidate, spec: dict, plan: Plan, ref: dict, ctx: dict, log: Any
) -> tuple[dict, list[dict]]:
    """Launch (or reach) one candidate, ask it every reference case, judge it; with
    ``--resume``, answers it saved in an earlier run of the same cases are judged instead."""
    t0 = time.monotonic()
    key = asked_key(role=cand.kind, args=cand.args, url=cand.url, cases=ctx["cases_key"])
    path = ctx["out"] / "answers" / f"{cand.name}.json"
    got = _read_back(path, key, ctx["resume"], cand.name, log)
    if got is not None:
        beams, meta = got
        meta.update(resumed=True)
    else:
        try:
            with one_server(
                _ROLE[cand.kind],
                cand.args,
                ctx["model_path"],
                ctx["catalog"],
                ctx["out"] / "servers" / f"{cand.name}.log",
                spec.get("device"),
                cand.url,
                float(spec.get("startup_timeout_s", 600)),
                cand.engine,
            ) as (url, info):
                tokens = (cand.engine.max_tokens if cand.engine else None) or ctx["max_tokens"]
                asked = (ctx["prompts"], plan.ns, tokens, ctx["protocols"])
                beams, _, _, _ = asyncio.run(_fetch(spec, url, *asked, cand.name, log))
        except Exception as exc:  # noqa: BLE001 - one candidate's failure is its row, not the stage's
            res = {"name": cand.name, "kind": cand.kind, "precision": cand.precision,
                   "args": cand.args, "gate": cand.gate, "status": "error", "passed": False,
                   "failures": [f"{type(exc).__name__}: {exc}"]}  # fmt: skip
            if getattr(exc, "log_tail", ""):
                res["log_tail"] = exc.log_tail
            log(f"parity: {cand.name}: {res['failures'][0]}")
            return res, []
        meta = {"url": url, "engine": info.get("engine"),
                "duration_s": round(time.monotonic() - t0, 2)}  # fmt: skip
        save(path, key, beams, meta)
    ctx["beams"][cand.name] = beams
    cases = _cases_from(ref, beams)
    res = candidate_result(cand, cases, plan.ns)
    res.update(meta)
    if not got:
        log(f"parity: {cand.name} ({cand.precision}): {res['status']} in {res['duration_s']} s")
    return res, [{"candidate": cand.name, **c.row()} for c in cases]


def run_candidates(
    spec: dict,
    model_path: str | None,
    catalog: str | None,
    out: Path,
    log: Any = print,
    resume: bool = False,
    engines: dict | None = None,
) -> dict:
    """The multi-candidate stage result (:func:`harness.parity.candidates.multi_result`).
    Every server's answers are saved under ``out/answers/``; ``resume`` reads back those of
    an earlier run that asked the same cases of a server started the same way."""
    plan = parse_plan(spec, engines)
    prompts = spec_prompts(spec, model_path)
    if not prompts:
        raise ValueError("parity: 'prompts' must be >= 1")
    wanted = spec.get("protocols")
    if wanted not in (None, "auto") and not set(wanted) <= set(PROTOCOLS):
        raise ValueError(f"parity: protocols {wanted} are not among {PROTOCOLS}")
    t0 = time.monotonic()
    cases_key = asked_key(
        model=model_path, catalog=catalog, ns=plan.ns, protocols=wanted,
        max_tokens=spec.get("max_tokens"), device=spec.get("device"),
        prompts=[(p.messages, p.text) for p in prompts],
    )  # fmt: skip
    ref_key = asked_key(args=plan.reference_args, url=spec.get("reference_url"), cases=cases_key)
    ref_path = out / "answers" / "reference.json"
    ref_label = f"reference ({plan.reference_dtype})"
    got = _read_back(ref_path, ref_key, resume, ref_label, log)
    if got is not None:
        ref, meta = got
        ref_url, ref_info = meta.get("url"), meta.get("info") or {}
        protocols, max_tokens = meta["protocols"], meta["max_tokens"]
    else:
        ref, protocols, max_tokens, ref_url, ref_info = _reference(
            spec, plan, model_path, catalog, out, prompts, log
        )
        save(ref_path, ref_key, ref, {"url": ref_url, "protocols": protocols,
                                      "max_tokens": max_tokens, "info": ref_info})  # fmt: skip
        log(f"parity: {ref_label}: {len(ref)} cases in {time.monotonic() - t0:.1f} s")
    ctx = {"model_path": model_path, "catalog": catalog, "out": out, "prompts": prompts,
           "max_tokens": max_tokens, "protocols": protocols, "resume": resume,
           "cases_key": ref_key, "beams": {}}  # fmt: skip
    results, rows = [], []
    for cand in plan.candidates:
        res, cand_rows = _run_candidate(cand, spec, plan, ref, ctx, log)
        results.append(res)
        rows += cand_rows
    result = multi_result(plan, results, protocols, rows)
    result["against"] = [
        row
        for c in plan.candidates
        if c.against and c.against in ctx["beams"] and c.name in ctx["beams"]
        for row in against_rows(c.name, c.against,
                                _cases_from(ctx["beams"][c.against], ctx["beams"][c.name]), plan.ns)
    ]  # fmt: skip
    result["reference"] = {
        "dtype": plan.reference_dtype,
        "url": ref_url,
        "args": plan.reference_args,
        **ref_info,  # how the HF reference server searched (absent from other servers)
    }
    if got is not None:
        result["reference"].update(resumed=True, saved_at=got[1].get("saved_at"))
    resumed = [c["name"] for c in results if c.get("resumed")] + (["reference"] if got else [])
    if resumed:
        result["resumed"] = resumed
    result["prompts"] = len(prompts)
    result["max_tokens"] = max_tokens
    return result


def _reference(spec, plan, model_path, catalog, out, prompts, log):
    """Launch (or reach) the reference and ask it every case: (answers, protocols,
    max_tokens, URL, the subset of its /get_server_info the result keeps)."""
    with one_server(
        "reference",
        plan.reference_args,
        model_path,
        catalog,
        out / "servers" / "reference.log",
        spec.get("device"),
        spec.get("reference_url"),
        float(spec.get("startup_timeout_s", 600)),
    ) as (ref_url, ref_info):
        ref, protocols, max_tokens, _ = asyncio.run(
            _fetch(
                spec,
                ref_url,
                prompts,
                plan.ns,
                None,
                None,
                f"reference ({plan.reference_dtype})",
                log,
            )  # fmt: skip
        )
    kept = {k: ref_info[k] for k in ("search", "prefill_chunk") if k in (ref_info or {})}
    return ref, protocols, max_tokens, ref_url, kept
