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
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from harness.parity import FETCH_ERRORS, body_for, engine_device, make_prompts, post, request_for

DEBUG_ENV = "FLASHREC_DEBUG_STEP_HASH"
DEFAULT_NS = (1, 2, 4, 8, 16, 32)
HOST_STATE, NUMERICS = "inputs differ: host-side state", "numerics"
AFTER_STEPS = "steps agree: results differ after the last step"
_STEP = re.compile(
    r"STEP_HASH rid=(\S+) step=(\d+) phase=(\w+) inputs=(\S+) outputs=(\S+)"
    r"(?: kv=(\S+))?(?: cached=(\d+))?"
)


@dataclass(frozen=True)
class Item:
    """One distinct request of the workload."""

    index: int
    messages: list[dict]
    text: str
    n: int


@dataclass
class Answer:
    """What one process returned for one request: beams as (token ids, score floats)."""

    rid: str = ""
    beams: list[tuple[tuple[int, ...], tuple[float, ...]]] = field(default_factory=list)
    error: str = ""


def make_workload(
    requests: int,
    ns: tuple[int, ...] = DEFAULT_NS,
    median_tokens: int = 96,
    seed: int = 0,
    system_prompt_tokens: int = 32,
    model_path: str | None = None,
) -> list[Item]:
    """``requests`` distinct synthetic prompts (shared system prompt), n cycling over ``ns``."""
    prompts = make_prompts(requests, median_tokens, seed, system_prompt_tokens, model_path)
    return [Item(p.index, p.messages, p.text, ns[i % len(ns)]) for i, p in enumerate(prompts)]


def parse_answer(protocol: str, data: Any) -> Answer:
    """Beams with every score field (sequence_score, cum_logprob when present) and the rid."""
    keys = ("sequence_score", "cum_logprob")
    if protocol == "chat":
        beams = [
            (
                tuple(c["sglext"].get("token_ids") or ()),
                tuple(c["sglext"][k] for k in keys if k in c["sglext"]),
            )
            for c in data["choices"]
        ]
        return Answer(str(data.get("id", "")), beams)
    if isinstance(data, list):
        data = data[0]
    meta = data["meta_info"]
    beams = [
        (
            tuple(b.get("token_ids") or ()),
            tuple(b["meta_info"][k] for k in keys if k in b["meta_info"]),
        )
        for b in meta["beam_results"]
    ]
    return Answer(str(meta.get("id", "")), beams)


# --------------------------------------------------------------------------- comparison


def bits(x: float) -> bytes:
    """The exact IEEE-754 double of a JSON float (Python's repr round-trips)."""
    return struct.pack("<d", x)


def identical(a: Answer, b: Answer) -> bool:
    """Bit-for-bit equality: same beams, same order, same token ids, same score bits."""
    if a.error or b.error or len(a.beams) != len(b.beams):
        return False
    for (ta, sa), (tb, sb) in zip(a.beams, b.beams):
        if ta != tb or len(sa) != len(sb) or any(bits(x) != bits(y) for x, y in zip(sa, sb)):
            return False
    return True


def drift(a: Answer, b: Answer) -> dict[str, Any]:
    """How ``b`` differs from the baseline ``a``."""
    ranks = max(len(a.beams), len(b.beams))
    changed = sum(
        1
        for i in range(ranks)
        if i >= len(a.beams) or i >= len(b.beams) or a.beams[i][0] != b.beams[i][0]
    )
    sa, sb = dict(a.beams), dict(b.beams)
    diffs = [abs(x - y) for k in sa.keys() & sb.keys() for x, y in zip(sa[k], sb[k])]
    return {
        "rank_changes": changed,
        "top1_changed": bool(a.beams and b.beams and a.beams[0][0] != b.beams[0][0]),
        "beams": [len(a.beams), len(b.beams)],
        "max_score_diff": max(diffs, default=0.0),
        "bits_only": changed == 0,
    }


def compare_processes(runs: list[list[Answer]], items: list[Item]) -> dict[str, Any]:
    """Every process against process 0; a request drifts when any process differs."""
    rows = []
    errors = sum(1 for run in runs for a in run if a.error)
    for i, item in enumerate(items):
        base = runs[0][i]
        worst = None
        for p in range(1, len(runs)):
            if identical(base, runs[p][i]):
                continue
            d = {"process": p, **drift(base, runs[p][i])}
            if worst is None or (d["rank_changes"], d["max_score_diff"]) > (
                worst["rank_changes"],
                worst["max_score_diff"],
            ):
                worst = d
        if worst is not None:
            rows.append({"index": item.index, "n": item.n, **worst})
    return {
        "processes": len(runs),
        "requests": len(items),
        "errors": errors,
        "drifting_requests": len(rows),
        "requests_with_rank_changes": sum(1 for r in rows if r["rank_changes"]),
        "top1_changes": sum(1 for r in rows if r["top1_changed"]),
        "max_score_diff": max((r["max_score_diff"] for r in rows), default=0.0),
        "drifting": rows,
    }


# --------------------------------------------------------------------------- step hashes


@dataclass(frozen=True)
class StepHash:
    """One ``STEP_HASH`` log line of one request."""

    step: int
    phase: str
    inputs: str
    outputs: str
    kv: str = ""
    cached: int = 0


def parse_step_hashes(text: str) -> dict[str, list[StepHash]]:
    """rid -> its step records, in log order."""
    out: dict[str, list[StepHash]] = {}
    for m in _STEP.finditer(text):
        rid, step, phase, inputs, outputs, kv, cached = m.groups()
        out.setdefault(rid, []).append(
            StepHash(int(step), phase, inputs, outputs, kv or "", int(cached or 0))
        )
    return out


def first_divergence(a: list[StepHash], b: list[StepHash]) -> dict[str, Any]:
    """The first step where two runs of one request differ, and why."""
    if not a or not b:
        return {"verdict": "no step hashes (was FLASHREC_DEBUG_STEP_HASH honoured?)"}
    for x, y in zip(a, b):
        where = {"step": x.step, "phase": x.phase}
        if (x.step, x.phase) != (y.step, y.phase):
            return {
                "verdict": HOST_STATE,
                **where,
                "detail": f"step order differs: {y.step} {y.phase}",
            }
        if x.inputs != y.inputs:
            return {
                "verdict": HOST_STATE,
                **where,
                "inputs": [x.inputs, y.inputs],
                "kv_equal": x.kv == y.kv,
                "cached": [x.cached, y.cached],
            }
        if x.outputs != y.outputs:
            return {
                "verdict": NUMERICS,
                **where,
                "outputs": [x.outputs, y.outputs],
                "kv_equal": x.kv == y.kv,
                "cached": [x.cached, y.cached],
            }
    if len(a) != len(b):
        return {
            "verdict": HOST_STATE,
            "step": min(len(a), len(b)),
            "detail": f"{len(a)} vs {len(b)} steps",
        }
    return {"verdict": AFTER_STEPS}


# --------------------------------------------------------------------------- running


def _model(model_path: str, catalog: str | None) -> Any:
    from harness.model import ResolvedModel

    return ResolvedModel(model_path, catalog, "-", "path", 0)


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    protocol: str,
    item: Item,
    max_tokens: int,
    timeout_s: float,
) -> Answer:
    path, body = body_for(
        protocol, request_for(item.messages, item.text, item.n, max_tokens, item.index)
    )
    try:
        return parse_answer(protocol, await post(session, url + path, body, timeout_s))
    except FETCH_ERRORS as exc:
        return Answer(error=f"{type(exc).__name__}: {exc}"[:300])


async def _drive(
    url: str, protocol: str, items: list[Item], concurrency: int, max_tokens: int, timeout_s: float
) -> list[Answer]:
    answers: list[Answer] = [Answer() for _ in items]
    queue = list(range(len(items)))[::-1]
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            while queue:
                i = queue.pop()
                answers[i] = await _send(session, url, protocol, items[i], max_tokens, timeout_s)

        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return answers


@dataclass(frozen=True)
class Plan:
    """How to launch the servers and send the workload."""

    model_path: str
    sid_vocab_file: str | None = None
    protocol: str = "chat"
    concurrency: int = 8
    max_tokens: int | None = None
    server_args: dict = field(default_factory=dict)
    server_env: dict = field(default_factory=dict)
    device: str | None = None
    timeout_s: float = 300.0


def run_processes(
    plan: Plan,
    items: list[Item],
    processes: int,
    mode: str,
    log_dir: Path,
    env: dict | None = None,
    label: str = "",
    log: Any = print,
) -> tuple[list[list[Answer]], list[Path]]:
    """``processes`` fresh servers one after another; each answers every item (in order: one
    at a time in ``sequential`` mode, ``plan.concurrency`` in flight in ``concurrent``)."""
    from harness.server import LaunchedServer
    from harness.spec import EngineSpec

    engine = EngineSpec(
        name="flashrec",
        kind="flashrec",
        device=plan.device,
        env={**plan.server_env, **(env or {})},
        startup_timeout_s=600,
    )
    max_tokens = plan.max_tokens or _default_max_tokens(plan.sid_vocab_file)
    runs, logs = [], []
    label = label or mode
    conc = 1 if mode == "sequential" else plan.concurrency
    for p in range(processes):
        path = log_dir / f"{label}-{p}.log"
        path.unlink(missing_ok=True)
        srv = LaunchedServer(
            engine, plan.server_args, _model(plan.model_path, plan.sid_vocab_file), path
        )
        t0 = time.monotonic()
        try:
            asyncio.run(_start(srv))
            runs.append(
                asyncio.run(
                    _drive(srv.base_url, plan.protocol, items, conc, max_tokens, plan.timeout_s)
                )
            )
        finally:
            srv.stop()
        logs.append(path)
        log(
            f"determinism: {label} process {p + 1}/{processes}: {len(items)} requests in "
            f"{time.monotonic() - t0:.1f} s"
        )
    return runs, logs


async def _start(srv: Any) -> None:
    async with aiohttp.ClientSession() as session:
        await srv.start(session)


def _default_max_tokens(catalog: str | None) -> int:
    """SID depth + 1 from the catalog (4 without one: 3 levels + the end token)."""
    if not catalog:
        return 4
    try:
        from flashrec.sid.catalog import load_catalog

        return int(load_catalog(catalog).depth) + 1
    except Exception:  # noqa: BLE001 - the server will say what is wrong with it
        return 4


def localise(
    plan: Plan,
    items: list[Item],
    drifting: list[int],
    processes: int,
    mode: str,
    log_dir: Path,
    attempts: int = 2,
    log: Any = print,
) -> dict[str, Any]:
    """Replay ``items`` up to the last drifting one with step hashes on, and explain each
    request that drifts in the replay by its first divergent step. A replay without drift
    (state-dependent drift need not recur) is retried, ``attempts`` replays in all."""
    replay = items[: max(drifting) + 1]
    for attempt in range(attempts):
        label = f"{mode}-stephash" + (f"-retry{attempt}" if attempt else "")
        runs, logs = run_processes(
            plan, replay, max(2, processes), mode, log_dir, {DEBUG_ENV: "1"}, label, log
        )
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
    verdicts: dict[str, int] = {}
    where: dict[str, int] = {}
    for e in explained:
        verdicts[e["verdict"]] = verdicts.get(e["verdict"], 0) + 1
        if "step" in e and "phase" in e:
            key = f"{e['verdict']} at step {e['step']} ({e['phase']})"
            where[key] = where.get(key, 0) + 1
    again = {r["index"] for r in cmp["drifting"]}
    return {
        "replays": attempt + 1,
        "replayed_requests": len(replay),
        "drifting_in_replay": cmp["drifting_requests"],
        "reproduced": sorted(again & set(drifting)),
        "not_reproduced": sorted(set(drifting) - again),
        "verdicts": verdicts,
        "first_divergence_at": where,
        "first_divergence": explained,
        "logs": [str(p) for p in logs],
    }


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
) -> dict[str, Any]:
    """The determinism run (also the ``determinism:`` matrix stage); writes
    ``out_dir/determinism.json`` and returns the same dict.

    ``status`` is "fail" when sequential mode drifts, "error" when requests failed, else
    "pass"; concurrent drift is reported (``concurrent.drifting_requests``), not failed.
    """
    if processes < 2:
        raise ValueError("--processes must be >= 2 (3 or more recommended)")
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
    for m in modes:
        runs, _ = run_processes(plan, items, processes, m, logs, log=log)
        summary = compare_processes(runs, items)
        if m == "sequential":
            baseline = runs[0]
        elif baseline is not None:
            vs = compare_processes([baseline, runs[0]], items)
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
            log(
                f"determinism: {m} localisation: {loc['verdicts']} "
                f"({len(loc['reproduced'])} of {summary['drifting_requests']} reproduced)"
            )
    errors = sum(result[m]["errors"] for m in modes)
    seq_drift = result.get("sequential", {}).get("drifting_requests", 0)
    result["status"] = "error" if errors else ("fail" if seq_drift else "pass")
    result["passed"] = result["status"] == "pass"
    result["duration_s"] = round(time.monotonic() - t0, 2)
    (out / "determinism.json").write_text(json.dumps(result, indent=1, default=str))
    return result


# --------------------------------------------------------------------------- stage + CLI


def compact(result: dict, rows: int = 10) -> dict:
    """The result for report.json: per-request lists cut to ``rows`` entries (the full
    result stays in ``determinism.json``)."""
    out = dict(result)
    for mode in ("sequential", "concurrent"):
        if mode in out:
            out[mode] = {**out[mode], "drifting": out[mode]["drifting"][:rows]}
        loc = out.get("localisation", {}).get(mode)
        if loc:
            out["localisation"] = {
                **out["localisation"],
                mode: {**loc, "first_divergence": loc["first_divergence"][:rows]},
            }
    return out


def run_stage(section: Any, ctx: Any) -> dict:
    """Runner adapter (``harness.runner.STAGES``): the ``determinism:`` section + StageContext;
    returns :func:`compact` of the result with ``details`` naming the full JSON.

    Section keys: requests, processes, mode, concurrency, server_args, server_env, protocol,
    ns, median_tokens, seed, device (the model comes from the matrix).
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


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _pairs(items: list[str] | None, what: str, flags: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{what} expects KEY=VALUE, got {item!r}")
        if flags:
            out[key.lstrip("-").replace("-", "_")] = _value(value)
        else:
            out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``flashrec-bench determinism``."""
    p = argparse.ArgumentParser(
        prog="flashrec-bench determinism",
        description="Bit-for-bit reproducibility across fresh server "
        "processes, with step-hash localisation of any drift.",
    )
    p.add_argument("--model-path", required=True)
    p.add_argument("--sid-vocab-file")
    p.add_argument(
        "--requests", type=int, default=120, help="distinct requests (>= 120 for an acceptance run)"
    )
    p.add_argument("--processes", type=int, default=3, help="fresh server processes (>= 2)")
    p.add_argument("--mode", choices=["sequential", "concurrent", "both"], default="both")
    p.add_argument("--concurrency", type=int, default=8, help="in flight in concurrent mode")
    p.add_argument("--out", type=Path, help="report dir (default reports/determinism-<time>)")
    p.add_argument(
        "--server-arg",
        action="append",
        metavar="KEY=VALUE",
        help="FlashRec server flag, e.g. batch_slots=512 (repeatable)",
    )
    p.add_argument(
        "--server-env",
        action="append",
        metavar="KEY=VALUE",
        help="server environment variable (repeatable)",
    )
    p.add_argument("--protocol", choices=["chat", "generate"], default="chat")
    p.add_argument(
        "--ns", default=",".join(map(str, DEFAULT_NS)), help="beam widths, cycled over the requests"
    )
    p.add_argument("--median-tokens", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--no-localise", action="store_true", help="skip the step-hash replay")
    return p


def main(argv: list[str] | None = None) -> int:
    """``flashrec-bench determinism``. Exit codes: 0 pass, 1 sequential drift, 2 usage,
    3 a server failed to start or requests failed."""
    from harness.server import ServerError, install_signal_handlers

    args = build_parser().parse_args(argv)
    if args.processes < 2 or args.requests < 1:
        print("determinism: need --processes >= 2 and --requests >= 1", file=sys.stderr)
        return 2
    if not Path(args.model_path).is_dir():
        print(f"determinism: --model-path {args.model_path} is not a directory", file=sys.stderr)
        return 2
    install_signal_handlers()
    try:
        result = run_determinism(
            args.model_path,
            args.sid_vocab_file,
            args.requests,
            args.processes,
            args.mode,
            args.concurrency,
            args.out,
            _pairs(args.server_arg, "--server-arg", True),
            _pairs(args.server_env, "--server-env", False),
            args.protocol,
            tuple(int(x) for x in args.ns.split(",") if x.strip()),
            args.median_tokens,
            args.seed,
            args.device,
            not args.no_localise,
            log=lambda msg: print(msg, file=sys.stderr),
        )
    except ServerError as exc:
        print(f"determinism: {exc}\n{exc.log_tail}", file=sys.stderr)
        return 3
    print(
        json.dumps(
            {k: result[k] for k in ("status", "duration_s")}
            | {
                m: {k: result[m][k] for k in ("drifting_requests", "max_score_diff", "errors")}
                for m in ("sequential", "concurrent")
                if m in result
            }
        )
    )
    return {"pass": 0, "fail": 1}.get(result["status"], 3)


if __name__ == "__main__":
    sys.exit(main())
