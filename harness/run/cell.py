"""One cell on a ready server: warm up, measured rounds, the traced round, failure handling.

Order inside a cell::

    warm-up (never counted; responses checked)
    round 0..R-1:  radix (flush [+ prime]) -> load -> server still alive and answering?
    traced round:  radix -> /start_profile -> load -> /stop_profile -> wait until the trace
                   files are complete and stable (its numbers never enter the statistics)

A server that exits or stops answering fails the cell (with its log tail); the runner restarts
it for the next cell.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from harness.load.client import EPOCH_UNIX, Record, now
from harness.load.loop import Target, closed_loop, make_requests, prepare_radix, run_load
from harness.load.sids import SidChecker
from harness.load.workload import PromptRenderer, PromptSet
from harness.metrics import host, replicas
from harness.metrics.server import capacity_notes, gc_delta, scrape
from harness.run.stages import STAGES, entry, names
from harness.servers.launch import Server, healthy
from harness.spec.cells import Cell
from harness.spec.matrix import MatrixSpec
from harness.trace.capture import (
    TraceWindow,
    start_profile,
    stop_profile,
    trace_prefix,
    wait_until_stable,
)
from harness.trace.summary import summarize_trace, work_per_request


class CellFailure(RuntimeError):
    """The cell cannot go on (server died, hung, or every warm-up request failed)."""


def safe_name(cell_id: str) -> str:
    """A file-system-safe form of a cell id."""
    return re.sub(r"[^A-Za-z0-9_.=,+-]", "_", cell_id)


@dataclass
class CellResult:
    """What a cell produced: status, records (all phases), trace, notes."""

    id: str
    params: dict
    status: str = "ok"  # ok | failed | skipped
    error: str = ""
    log_tail: str = ""
    records: list[Record] = field(default_factory=list)
    rounds_done: int = 0
    trace: dict | None = None
    notes: list[str] = field(default_factory=list)
    server: dict = field(default_factory=dict)
    duration_s: float = 0.0
    baseline: dict = field(default_factory=dict)  # {"hf": {...}} (harness.baseline.hf)
    mfu: dict | None = None  # what MFU needs (harness.metrics.flops.mfu_info)
    # measured round -> server-side deltas over it (harness.metrics.server: GC pauses)
    server_rounds: dict[int, dict[str, float]] = field(default_factory=dict)
    burst: int = 0  # requests per burst of a "burst" load (0: another load mode)
    closed: int = 0  # clients of a "closed" load (0: another load mode)
    # where and when it was measured (harness.run.environment.measured_stamp), saved with the cell
    measured: dict = field(default_factory=dict)
    resumed: bool = False  # loaded from an earlier run's cell.json by --resume
    quality: dict | None = None  # the quality: section's eval of this cell (harness.quality)
    # measured rounds' CPU use by other processes on the host (harness.metrics.host.other_cpu)
    host_rounds: list[dict[str, float]] = field(default_factory=list)


@dataclass
class CellContext:
    """Everything a cell run needs besides the cell itself."""

    session: aiohttp.ClientSession
    server: Server
    spec: MatrixSpec
    prompts: PromptSet
    checker: SidChecker
    renderer: PromptRenderer | None
    max_tokens: int
    rounds: int
    trace_dir: Path
    on_request: Any = None  # callable(Record)
    on_phase: Any = None  # callable(str)
    quality_dir: Path | None = None  # where the quality: section's dataset and results go
    run_quality: bool = True  # False: skip the per-cell stages (A/B pairs after the first)
    cell: Cell | None = None  # the cell being run, set for its per-cell stages


def _health_timeout(cell: Cell) -> float:
    return max(2.0, min(5.0, cell.client.request_timeout_s))


def _phase(ctx: CellContext, text: str) -> None:
    if ctx.on_phase:
        ctx.on_phase(text)


async def _check_server(ctx: CellContext, records: list[Record], timeout_s: float) -> None:
    """Raise :class:`CellFailure` when the server exited, or failed requests and /health."""
    code = ctx.server.exit_code()
    if code is not None:
        raise CellFailure(f"server exited with code {code}")
    failed = [r for r in records if not r.ok]
    health = ctx.server.engine.health_path
    if failed and not await healthy(ctx.session, ctx.server.base_url, timeout_s, health):
        # a crashing server drops its connections a moment before the process is gone: give
        # it a little time so the cell reports the exit code rather than a generic failure
        for _ in range(20):
            code = ctx.server.exit_code()
            if code is not None:
                raise CellFailure(f"server exited with code {code}")
            await asyncio.sleep(0.1)
        raise CellFailure(
            f"server not answering /health after {len(failed)} failed request(s) "
            f"(first: {failed[0].status}: {failed[0].error[:120]})"
        )


async def _warmup(ctx: CellContext, cell: Cell, target: Target, reqs: list, res: CellResult):
    if not reqs:
        return
    _phase(ctx, "warm-up")
    recs = await closed_loop(
        ctx.session, target, reqs, cell.client.concurrency, (cell.id, -1, "warmup"), ctx.on_request
    )
    res.records += recs
    ok = [r for r in recs if r.ok]
    if not ok:
        await _check_server(ctx, recs, _health_timeout(cell))
        raise CellFailure(f"all {len(recs)} warm-up requests failed: {recs[0].error[:200]}")
    invalid = sum(r.invalid for r in ok)
    if invalid or len(ok) < len(recs):
        res.notes.append(
            f"warm-up: {len(recs) - len(ok)} failed request(s), {invalid} invalid "
            f"SID(s) in {sum(r.beams for r in ok)} beams"
        )


async def _prepare(ctx, cell, target, prime, rnd: int, phase: str, res: CellResult) -> None:
    """Bring the prefix cache to the cell's temperature (priming records kept, not counted)."""
    c = cell.client
    primed, note = await prepare_radix(
        ctx.session, target, c.radix, prime, c.concurrency, (cell.id, rnd, phase)
    )
    res.records += primed
    if note and note not in res.notes:
        res.notes.append(note)
    await _check_server(ctx, primed, _health_timeout(cell))


async def _load(ctx, cell, target, reqs, rnd: int, phase: str, res: CellResult) -> None:
    """One round of the cell's load; its records are appended to the result. Around a measured
    round the server's ``/metrics`` is scraped (outside the timed load) for its GC pauses,
    and the host's CPU accounting read for other processes' use of it."""
    before = await scrape(ctx.session, ctx.server.base_url) if phase == "measure" else None
    urls = ctx.server.metrics_urls()  # a routed server: each replica's
    counts0 = await replicas.scrape_all(ctx.session, urls) if phase == "measure" else None
    groups = ctx.server.process_groups()  # a routed server: the router's and each replica's
    main = ctx.server.engine.kind == "flashrec"  # the server process leads its own group
    host0 = host.sample(groups, main=main) if phase == "measure" else None
    recs = await run_load(
        ctx.session,
        target,
        reqs,
        cell.client,
        (cell.id, rnd, phase),
        seed=ctx.spec.workload.seed + rnd,
        on_done=ctx.on_request,
    )
    res.records += recs
    if host0 is not None:
        host1 = host.sample(groups, main=main)
        used = host.other_cpu(host0, host1)
        if used:
            res.host_rounds.append(used)
            res.server_rounds.setdefault(rnd, {}).update({k: used[k] for k in host.METRICS})
        own = host.server_cpu(host0, host1, len(recs))
        if own:
            res.server_rounds.setdefault(rnd, {}).update(own)
    await _check_server(ctx, recs, _health_timeout(cell))
    if before is not None:
        after = await scrape(ctx.session, ctx.server.base_url)
        delta = gc_delta(before, after)
        if delta:
            res.server_rounds.setdefault(rnd, {}).update(delta)
        c = cell.client
        for note in capacity_notes(before, after, c.beam_width, c.concurrency):
            if note not in res.notes:
                res.notes.append(note)
    if counts0 is not None:  # the prefix cache over the round, per replica behind a router
        per = replicas.deltas(counts0, await replicas.scrape_all(ctx.session, urls))
        res.server_rounds.setdefault(rnd, {}).update(replicas.cache_metrics(per))
        if urls != [ctx.server.base_url]:
            res.server["replicas"] = replicas.accumulate(res.server.get("replicas"), urls, per)


def add_work_per_request(
    files: list[dict], records: list[Record], rnd: int, busy: list[list] | None = None
) -> None:
    """The GPU work per request answered inside the traced file's window (Unix clock: the
    records' clock plus ``EPOCH_UNIX``), added to that file's summary; only where exactly one
    file of the round holds GPU work (replicas' files would each count every answer).
    ``busy``: each file's merged GPU busy intervals, in the order of ``files``."""
    gpu = [i for i, f in enumerate(files) if "gpu_window_unix" in f]
    if len(gpu) != 1:
        return
    spans = [
        engine_span(r)
        for r in records
        if r.phase == "trace" and r.round == rnd and r.status == "ok"
    ]
    (i,) = gpu
    files[i].update(work_per_request(files[i], spans, busy[i] if busy else None))


def engine_span(r: Record) -> tuple[float, float, float]:
    """``(engine start, engine end, answer)`` of an answered request in Unix s: the engine
    phase of its Server-Timing, placed before the phases that follow it (ipc, respond), or the
    whole request where the server gives no engine phase."""
    end = EPOCH_UNIX + r.t_end
    engine = r.server_ms.get("engine")
    if engine is None:
        return EPOCH_UNIX + r.t_send, end, end
    stop = end - (r.server_ms.get("respond", 0.0) + r.server_ms.get("ipc", 0.0)) / 1e3
    return stop - engine / 1e3, stop, end


async def _traced_round(ctx, cell, target, reqs, prime, res: CellResult) -> None:
    """The extra, profiled round: radix -> start -> load -> stop -> wait for the files."""
    spec = ctx.spec.trace
    out_dir = ctx.trace_dir / safe_name(cell.id)
    rnd = ctx.rounds
    _phase(ctx, "traced round")
    await _prepare(ctx, cell, target, prime, rnd, "trace", res)
    trace: dict[str, Any] = {"dir": str(out_dir), "num_steps": spec.num_steps}
    res.trace = trace
    window = TraceWindow(start=now())
    asked = time.time()  # files older than this are an earlier run's (same folder on --resume)
    prefix = trace_prefix(cell.id)
    ok, detail = await start_profile(
        ctx.session, ctx.server.base_url, out_dir, spec.num_steps, prefix, spec.profile_args
    )
    if not ok:
        window.close()
        trace.update(status="start_failed", detail=detail)
        res.notes.append(f"trace not started: {detail}")
        return
    if spec.requests:
        reqs = (reqs * (spec.requests // len(reqs) + 1))[: spec.requests]
    try:
        await _load(ctx, cell, target, reqs, rnd, "trace", res)
    finally:
        trace["status"] = "server_died"
        if ctx.server.exit_code() is None:
            stop_ok, stop_detail = await stop_profile(ctx.session, ctx.server.base_url)
            _phase(ctx, "waiting for trace files")
            wait = await wait_until_stable(out_dir, spec.settle_s, spec.timeout_s, since=asked)
            trace.update(
                status=wait.status,
                waited_s=round(wait.waited_s, 2),
                stop="ok" if stop_ok else stop_detail,
            )
            busy: list[list] = [[] for _ in wait.files]  # each file's GPU busy intervals
            trace["files"] = [
                summarize_trace(f["path"], spans=tuple(spec.spans), busy_out=b)
                for f, b in zip(wait.files, busy)
            ]
            add_work_per_request(trace["files"], res.records, rnd, busy)
            if wait.status != "complete":  # said where the cell is read, not only in its trace
                res.notes.append(
                    f"trace {wait.status}: no complete trace file in {out_dir} after "
                    f"{wait.waited_s:.0f} s (trace.timeout_s)"
                )
        window.close()
        trace["window"] = [window.start, window.end]
    excluded = 0
    for r in res.records:
        if r.phase == "measure" and window.overlaps(r.t_send, r.t_end):
            r.excluded, excluded = "trace_overlap", excluded + 1
    if excluded:
        res.notes.append(f"{excluded} request(s) overlapped trace writing and were excluded")


async def _cell_stages(ctx: CellContext, res: CellResult) -> None:
    """The per-cell stages (:mod:`harness.run.stages`) on the cell's server; each result lands
    in the result's field of the stage's name (``res.quality``)."""
    for name in names("cell"):
        got = await entry(STAGES[name].entry)(getattr(ctx.spec, name), ctx)
        if got is None:  # the section leaves this cell out
            continue
        setattr(res, name, got)
        if got.get("status") != "ok":
            res.notes.append(f"{name} eval failed: {got.get('error')}")


async def run_cell(ctx: CellContext, cell: Cell) -> CellResult:
    """Run one cell on ``ctx.server``; failures are caught into the result, never raised."""
    res = CellResult(cell.id, dict(cell.params))
    res.burst = cell.client.concurrency if cell.client.mode == "burst" else 0
    res.closed = cell.client.concurrency if cell.client.mode == "closed" else 0
    res.server = {"url": ctx.server.base_url, "protocol": ctx.server.protocol}
    started = time.monotonic()
    c = cell.client
    target = Target(
        ctx.server.base_url,
        ctx.server.protocol,
        ctx.checker,
        c.request_timeout_s,
        ctx.spec.quality.ks,
    )
    model = ctx.server.engine.model_name or "default"
    reqs = make_requests(ctx.prompts.measured, c, ctx.max_tokens, ctx.renderer, model)
    prime = make_requests(ctx.prompts.warmup, c, ctx.max_tokens, ctx.renderer, model)

    async def body() -> None:
        await _warmup(ctx, cell, target, prime, res)
        for rnd in range(ctx.rounds):
            _phase(ctx, f"round {rnd + 1}/{ctx.rounds}")
            await _prepare(ctx, cell, target, prime, rnd, "measure", res)
            await _load(ctx, cell, target, reqs, rnd, "measure", res)
            res.rounds_done += 1
            if ctx.spec.load.cooldown_s:
                await asyncio.sleep(ctx.spec.load.cooldown_s)
        busy = host.busy_host_note(res.host_rounds, ctx.spec.stats.busy_host_cores)
        if busy:
            res.notes.append(busy)
        if cell.traced:
            await _traced_round(ctx, cell, target, reqs, prime, res)
        if ctx.run_quality:
            await _cell_stages(dataclasses.replace(ctx, cell=cell), res)

    try:
        await asyncio.wait_for(body(), ctx.spec.load.cell_timeout_s)
    except CellFailure as exc:
        res.status, res.error = "failed", str(exc)
    except asyncio.TimeoutError:
        res.status = "failed"
        res.error = f"cell did not finish within {ctx.spec.load.cell_timeout_s:g} s"
    if res.status == "failed":
        res.log_tail = ctx.server.log_tail()
    res.duration_s = round(time.monotonic() - started, 3)
    return res
