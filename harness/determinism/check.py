"""The determinism run: P fresh processes per mode, compared bit for bit, and the step-hash
replay that localises any drift (:func:`localise`); :func:`compact` cuts the result for
report.json."""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.determinism.bitwise import (
    DEFAULT_NS,
    Answer,
    Item,
    compare_processes,
    make_workload,
)
from harness.determinism.processes import Plan, run_processes
from harness.determinism.stephash import (
    DEBUG_ENV,
    first_divergence,
    parse_step_hashes,
    verdict_words,
)


def _replay(plan, replay, processes, mode, against, log_dir, label, log):
    """The step-hash replay's runs and server logs: ``processes`` fresh processes in ``mode``,
    or (``against``) one in ``against`` mode first and one in ``mode``."""
    env = {DEBUG_ENV: "1"}
    if against is None:
        return run_processes(plan, replay, max(2, processes), mode, log_dir, env, label, log)
    base, base_logs = run_processes(plan, replay, 1, against, log_dir, env, f"{label}-a", log)
    other, other_logs = run_processes(plan, replay, 1, mode, log_dir, env, f"{label}-b", log)
    return base + other, base_logs + other_logs


def localise(
    plan: Plan,
    items: list[Item],
    drifting: list[int],
    processes: int,
    mode: str,
    log_dir: Path,
    attempts: int = 2,
    log: Any = print,
    against: str | None = None,
) -> dict[str, Any]:
    """Replay ``items`` up to the last drifting one with step hashes on, and explain each
    request that drifts in the replay by its first divergent step. A replay without drift
    (state-dependent drift need not recur) is retried, ``attempts`` replays in all.
    ``against``: the drift is between modes (a ``mode`` process against one in ``against``
    mode, e.g. concurrent against sequential), not between processes of one mode."""
    replay = items[: max(drifting) + 1]
    for attempt in range(attempts):
        label = f"{mode}{'-vs-' + against if against else ''}-stephash"
        label += f"-retry{attempt}" if attempt else ""
        runs, logs = _replay(plan, replay, processes, mode, against, log_dir, label, log)
        cmp = compare_processes(runs, replay)
        if cmp["drifting_requests"] or cmp["errors"]:
            break
    hashes = [parse_step_hashes(p.read_text(errors="replace")) for p in logs]
    explained = []
    for row in cmp["drifting"]:
        i, p = row["index"], row["process"]
        a, b = runs[0][i], runs[p][i]
        div = first_divergence(hashes[0].get(a.rid, []), hashes[p].get(b.rid, []))
        explained.append({"index": i, "processes": [0, p], "rids": [a.rid, b.rid], **div})
    again = {r["index"] for r in cmp["drifting"]}
    return {
        "replays": attempt + 1,
        "replayed_requests": len(replay),
        "drifting_in_replay": cmp["drifting_requests"],
        "reproduced": sorted(again & set(drifting)),
        "not_reproduced": sorted(set(drifting) - again),
        **tally_divergences(explained),
        "first_divergence": explained,
        "logs": [str(p) for p in logs],
    }


def tally_divergences(explained: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """A localisation's counts: requests per verdict (``verdicts``) and per verdict, step and
    phase (``first_divergence_at``)."""
    verdicts: dict[str, int] = {}
    where: dict[str, int] = {}
    for e in explained:
        verdicts[e["verdict"]] = verdicts.get(e["verdict"], 0) + 1
        if "step" in e and "phase" in e:
            key = f"{e['verdict']} at step {e['step']} ({e['phase']})"
            where[key] = where.get(key, 0) + 1
    return {"verdicts": verdicts, "first_divergence_at": where}


def localisation_line(what: str, loc: dict[str, Any], drifting: int) -> str:
    """The console line of one localisation, in words (``what``: the mode, or "concurrent
    against sequential")."""
    return (
        f"determinism: {what} localisation: {len(loc['reproduced'])} of {drifting} drifting "
        f"requests drifted again in the step-hash replay; {verdict_words(loc['verdicts'])}"
    )


ACCEPTANCE_REQUESTS = 120  # distinct requests a run needs to count for acceptance


def verdict(result: dict, modes: list[str], strict_concurrent: bool = False) -> str:
    """``error`` when requests failed; ``fail`` on sequential drift; with
    ``strict_concurrent`` also on concurrent drift across processes or against the sequential
    answers (``vs_sequential``), and ``error`` when no concurrent run is there to judge;
    else ``pass``."""
    if sum(result[m]["errors"] for m in modes):
        return "error"
    drift = result.get("sequential", {}).get("drifting_requests", 0)
    if strict_concurrent:
        conc = result.get("concurrent")
        if conc is None or "vs_sequential" not in conc:
            return "error"  # the claim is sequential == concurrent: both must have run
        drift += conc["drifting_requests"] + conc["vs_sequential"]["drifting_requests"]
    return "fail" if drift else "pass"


def run_determinism(
    model_path: str,
    sid_vocab_file: str | None = None,
    requests: int = 120,
    processes: int = 3,
    mode: str = "both",
    concurrency: int = 8,
    out_dir: str | Path | None = None,
    server_args: dict | None = None,
    server_env: dict | None = None,
    protocol: str = "chat",
    ns: tuple[int, ...] = DEFAULT_NS,
    median_tokens: int = 96,
    seed: int = 0,
    device: str | None = None,
    localise_drift: bool = True,
    log: Any = print,
    strict_concurrent: bool = False,
) -> dict[str, Any]:
    """The determinism run (also the ``determinism:`` matrix stage); writes
    ``out_dir/determinism.json`` and returns the same dict.

    ``status`` is "fail" when sequential mode drifts, "error" when requests failed, else
    "pass"; concurrent drift (across processes, and against the sequential answers:
    ``concurrent.vs_sequential``) is reported and fails only with ``strict_concurrent``
    (results that must not depend on what else is in the batch; needs ``mode="both"``).
    ``acceptance`` says whether the run is big enough to count for acceptance (>= 120
    distinct requests, the design notes' N).
    """
    if processes < 2:
        raise ValueError("--processes must be >= 2 (3 or more recommended)")
    if requests < 1 or not ns:  # no request compares nothing: never a pass
        raise ValueError("the determinism run needs --requests >= 1 and at least one n")
    if strict_concurrent and mode != "both":
        raise ValueError("--strict-concurrent compares concurrent with sequential: use --mode both")
    modes = ["sequential", "concurrent"] if mode == "both" else [mode]
    out = Path(out_dir or Path("reports") / f"determinism-{dt.datetime.now():%Y%m%d-%H%M%S}")
    logs = out / "servers"
    logs.mkdir(parents=True, exist_ok=True)
    plan = Plan(
        model_path,
        sid_vocab_file,
        protocol,
        concurrency,
        None,
        dict(server_args or {}),
        dict(server_env or {}),
        device,
    )
    t0 = time.monotonic()
    items = make_workload(requests, tuple(ns), median_tokens, seed, model_path=model_path)
    result: dict[str, Any] = {
        "config": {
            **asdict(plan),
            "requests": requests,
            "processes": processes,
            "mode": mode,
            "ns": list(ns),
            "median_tokens": median_tokens,
            "seed": seed,
        },
        "localisation": {},
    }
    baseline: list[Answer] | None = None
    vs_rows: list[dict] = []  # concurrent answers that differ from the sequential ones
    for m in modes:
        runs, _ = run_processes(plan, items, processes, m, logs, log=log)
        summary = compare_processes(runs, items)
        if m == "sequential":
            baseline = runs[0]
        elif baseline is not None:
            vs = compare_processes([baseline, runs[0]], items)
            vs_rows = vs["drifting"]
            summary["vs_sequential"] = {
                k: vs[k]
                for k in (
                    "drifting_requests",
                    "requests_with_rank_changes",
                    "top1_changes",
                    "max_score_diff",
                )
            }
        result[m] = summary
        log(
            f"determinism: {m}: {summary['drifting_requests']} of {len(items)} requests drift "
            f"across {processes} processes (max |score diff| {summary['max_score_diff']:.3g}, "
            f"{summary['requests_with_rank_changes']} with rank changes, {summary['errors']} "
            "errors)"
        )
        if summary["drifting_requests"] and localise_drift and not summary["errors"]:
            loc = localise(
                plan, items, [r["index"] for r in summary["drifting"]], processes, m, logs, log=log
            )
            result["localisation"][m] = loc
            log(localisation_line(m, loc, summary["drifting_requests"]))
    if vs_rows and localise_drift and not result["concurrent"]["errors"]:
        drifting = [r["index"] for r in vs_rows]
        loc = localise(plan, items, drifting, 2, "concurrent", logs, log=log, against="sequential")
        result["localisation"]["concurrent_vs_sequential"] = loc
        log(localisation_line("concurrent against sequential", loc, len(drifting)))
    result["status"] = verdict(result, modes, strict_concurrent)
    result["strict_concurrent"] = strict_concurrent
    result["acceptance"] = requests >= ACCEPTANCE_REQUESTS
    if not result["acceptance"]:
        log(
            f"determinism: {requests} requests < {ACCEPTANCE_REQUESTS}: this run does not count "
            "for acceptance"
        )
    result["passed"] = result["status"] == "pass"
    result["duration_s"] = round(time.monotonic() - t0, 2)
    (out / "determinism.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def compact(result: dict, rows: int = 10) -> dict:
    """The result for report.json: per-request lists cut to ``rows`` entries (the full
    result stays in ``determinism.json``)."""
    out = dict(result)
    for mode in ("sequential", "concurrent", "concurrent_vs_sequential"):
        if mode in out:
            out[mode] = {**out[mode], "drifting": out[mode]["drifting"][:rows]}
        loc = out.get("localisation", {}).get(mode)
        if loc:
            out["localisation"] = {
                **out["localisation"],
                mode: {**loc, "first_divergence": loc["first_divergence"][:rows]},
            }
    return out
