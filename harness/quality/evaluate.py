"""Send a dataset's samples to a beam server and score the answers per task.

Requests go through the harness's own request code (:mod:`harness.load.client`: chat or SGLang
``/generate``, the body rendered with the chat template and ``<|sid_begin|>`` for the latter);
answers are scored with :mod:`harness.quality.metrics`. A failed request scores 0 on every
metric (the benchmark's "no generation") and is counted; all requests failing is an error.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from harness.load.client import PROTOCOLS, Pending, Record, Request, send
from harness.load.sids import Sid, SidChecker, parse_sid
from harness.load.workload import Prompt, PromptRenderer
from harness.quality.dataset import PUBLISHED, DatasetFile, Sample
from harness.quality.metrics import metric_names, rate, sample_metrics, summarize_metric

OFFICIAL_BEAMS, OFFICIAL_TOKENS, OFFICIAL_KS = 32, 3, (1, 32)
# consecutive requests that could not reach the server before the rest are not sent: a dead
# server or a wrong port is said at once, not after every sample has failed
STOP_AFTER_CONNECT_FAILURES = 3
# the client errors (Record.error's type name) of a request that never reached a server
_CONNECT_ERRORS = (
    "ClientConnectorError", "ClientConnectorDNSError", "ClientConnectorCertificateError",
    "ClientConnectorSSLError", "ClientProxyConnectionError", "ConnectionRefusedError",
)  # fmt: skip


class ServerUnreachable(RuntimeError):
    """Consecutive requests could not connect to the server: the evaluation stopped."""


def connect_failed(rec: Record) -> bool:
    """Whether a request failed without reaching the server (no connection made)."""
    return (
        rec.status == "error"
        and rec.http_status is None
        and rec.error.startswith(tuple(f"{name}:" for name in _CONNECT_ERRORS))
    )


@dataclass(frozen=True)
class EvalOptions:
    """How the samples are asked: beams, tokens, cut-offs, protocol, concurrency."""

    beam_width: int = OFFICIAL_BEAMS
    max_tokens: int = OFFICIAL_TOKENS
    ks: tuple[int, ...] = OFFICIAL_KS
    protocol: str = "chat"
    concurrency: int = 8
    timeout_s: float = 300.0
    model: str = "default"
    levels: int = 3
    # the named catalog requests carry (None: none, the server's default), and per task
    # ``(task, name)`` pairs over it: RecIF's video / ad / product each over its own item pool
    catalog: str | None = None
    task_catalogs: tuple[tuple[str, str], ...] = ()

    def catalog_of(self, task: str) -> str | None:
        """The catalog name a sample of ``task`` is asked with (None: no name sent)."""
        return dict(self.task_catalogs).get(task, self.catalog)


@dataclass
class Answer:
    """One sample's answer: the beam texts (best first) or why there are none."""

    sample: Sample
    texts: list[str] = field(default_factory=list)
    error: str = ""


class _Capture(Pending):
    """Keeps each 200 body for parsing after the load (no quality computed by the client)."""

    def __init__(self, protocol: str) -> None:
        super().__init__(protocol, SidChecker(3), [])
        self.bodies: dict[int, bytes] = {}

    def add(self, record: Record, req: Request, raw: bytes) -> None:
        self.bodies[record.index] = raw


def progress_printer(total: int, stream: Any = None) -> Callable[[int], None]:
    """A progress line every 2 s and at the end: done / total, rate and time left, on
    ``stream`` (default: ``sys.stderr`` as it is when a line is printed, not when this module
    was imported: a replaced and closed stderr, as under a test's capture, is never kept)."""
    t0 = time.monotonic()
    last = [0.0]

    def show(done: int) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < 2.0:
            return
        last[0] = now
        rate_s = done / max(now - t0, 1e-9)
        left = (total - done) / rate_s if rate_s > 0 else float("nan")
        print(
            f"eval: {done}/{total} samples ({100 * done / total:.0f}%), "
            f"{rate_s:.1f}/s, ~{left:.0f} s left",
            file=stream if stream is not None else sys.stderr,
            flush=True,
        )

    return show


async def ask(
    session: aiohttp.ClientSession,
    base_url: str,
    samples: Sequence[Sample],
    opts: EvalOptions,
    renderer: PromptRenderer | None = None,
    on_done: Callable[[int], None] | None = None,
) -> list[Answer]:
    """Every sample's beams, ``opts.concurrency`` requests in flight; after
    :data:`STOP_AFTER_CONNECT_FAILURES` consecutive requests that could not connect, no more
    are sent and :class:`ServerUnreachable` names the URL."""
    if opts.protocol not in PROTOCOLS:
        raise ValueError(f"protocol {opts.protocol!r}: not one of {', '.join(PROTOCOLS)}")
    if opts.protocol == "generate" and renderer is None:
        renderer = PromptRenderer()
    capture = _Capture(opts.protocol)
    answers = [Answer(s) for s in samples]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(samples)):
        queue.put_nowait(i)
    done = [0]
    unreachable: list[str] = []  # the current run of connection failures' errors

    async def worker() -> None:
        while not queue.empty() and len(unreachable) < STOP_AFTER_CONNECT_FAILURES:
            i = queue.get_nowait()
            s = samples[i]
            text = renderer.render(s.messages) if opts.protocol == "generate" else None
            req = Request(
                Prompt(i, s.messages, s.truth),
                opts.beam_width,
                opts.max_tokens,
                0.0,
                text=text,
                model=opts.model,
                catalog=opts.catalog_of(s.task),
            )
            rec = Record("eval", 0, "eval", i, i, 0.0)
            await send(
                session, base_url, opts.protocol, req, rec, capture.checker, opts.timeout_s, [],
                capture,
            )  # fmt: skip
            if not rec.ok:
                answers[i].error = f"{rec.status}: {rec.error[:200]}"
            if connect_failed(rec):
                unreachable.append(rec.error)
            else:
                unreachable.clear()
            done[0] += 1
            if on_done:
                on_done(done[0])

    await asyncio.gather(*(worker() for _ in range(max(1, opts.concurrency))))
    if len(unreachable) >= STOP_AFTER_CONNECT_FAILURES:
        raise ServerUnreachable(
            f"cannot connect to {base_url}: {len(unreachable)} consecutive requests failed to "
            f"connect (first: {unreachable[0][:200]}); stopped after {done[0]} of "
            f"{len(samples)} samples"
        )
    parse = PROTOCOLS[opts.protocol][2]
    for i, raw in capture.bodies.items():
        try:
            answers[i].texts = parse(json.loads(raw))[0]
        except (ValueError, KeyError, TypeError) as exc:
            answers[i].error = f"unparsable answer: {type(exc).__name__}: {exc}"[:200]
    failed = [a for a in answers if a.error]
    if answers and len(failed) == len(answers):
        raise RuntimeError(f"every one of {len(answers)} requests failed; first: {failed[0].error}")
    return answers


def _score_one(
    a: Answer, ks: Sequence[int], levels: int, catalog: set[Sid] | None, pid_map: dict | None
) -> tuple[dict[str, float], int, int, int]:
    """A sample's metrics, and its beams, invalid beams and duplicate beams."""
    predicted: list[Sid | None] = []
    invalid = dup = 0
    seen: set[Sid] = set()
    for text in a.texts:
        sid = parse_sid(text, levels)
        if sid is None or (catalog is not None and sid not in catalog):
            invalid += 1
        if sid is not None:
            if sid in seen:
                dup += 1
            seen.add(sid)
        predicted.append(sid)
    m = sample_metrics(predicted, a.sample.truth, ks)
    if pid_map is not None:
        preds = [pid_map.get(s) if s is not None else None for s in predicted]
        truth = a.sample.truth_pids or tuple(
            p for p in (pid_map.get(s) for s in a.sample.truth) if p is not None
        )
        m.update(sample_metrics(preds, truth, ks, prefix="pid_"))
    return m, len(a.texts), invalid, dup


def _block(rows: list[tuple[dict, int, int, int]], names: list[str], failed: int) -> dict:
    """Metrics with intervals over a group of samples, plus the beam rates."""
    beams = sum(r[1] for r in rows)
    out = {
        "samples": len(rows),
        "failed_requests": failed,
        "metrics": {n: summarize_metric(n, [r[0][n] for r in rows]) for n in names},
        "invalid_rate": rate(sum(r[2] for r in rows), beams),
        "duplicate_rate": rate(sum(r[3] for r in rows), beams),
    }
    return out


def score(
    answers: list[Answer],
    opts: EvalOptions,
    catalog: set[Sid] | None = None,
    pid_map: dict | None = None,
    files: Sequence[DatasetFile] = (),
    keep_values: bool = False,
    named: dict[str, set[Sid]] | None = None,
) -> dict:
    """Per task and overall: the metrics (mean over samples, 95% interval), invalid and
    duplicate rates; published numbers beside ours for an official test set. ``named``: the
    SIDs of named catalogs; a task asked with one (``opts.catalog_of``) is checked against it,
    the others against ``catalog``."""
    names = metric_names(opts.ks, pid_map is not None)
    named = named or {}

    def sids(a: Answer) -> set[Sid] | None:
        return named.get(opts.catalog_of(a.sample.task) or "", catalog)

    rows = [_score_one(a, opts.ks, opts.levels, sids(a), pid_map) for a in answers]
    tasks: dict[str, list[int]] = {}
    for i, a in enumerate(answers):
        tasks.setdefault(a.sample.task, []).append(i)
    official = {f.task for f in files if f.official}
    out_tasks = {}
    for task, idx in tasks.items():
        block = _block([rows[i] for i in idx], names, sum(1 for i in idx if answers[i].error))
        if opts.catalog_of(task) is not None:  # the named catalog this task was asked with
            block["catalog"] = opts.catalog_of(task)
        if task in official:
            refs = {m: PUBLISHED[(task, m)] for m in names if (task, m) in PUBLISHED}
            block["published"] = refs
        out_tasks[task] = block
    overall = _block(rows, names, sum(1 for a in answers if a.error))
    if keep_values:  # per-sample values, for a paired comparison of two runs of one dataset
        overall["values"] = {n: [r[0][n] for r in rows] for n in names}
    return {
        "protocol": {
            "beam_width": opts.beam_width,
            "max_tokens": opts.max_tokens,
            "ks": list(opts.ks),
            "endpoint": opts.protocol,
            "selection": "first_k (beams in server order, duplicates keep their slot)",
            "ci": "wilson for pass rates and beam rates; bootstrap (2000, seed 0) for recall",
        },
        "catalog_checked": all(sids(a) is not None for a in answers)
        if answers
        else catalog is not None,
        "pid_mode": pid_map is not None,
        "files": [
            {
                "path": str(f.path),
                "task": f.task,
                "rows": len(f.samples),
                "official": f.official,
                "official_why": f.official_why,
            }
            for f in files
        ],  # fmt: skip
        "tasks": out_tasks,
        "overall": overall,
        "errors": [a.error for a in answers if a.error][:5],
    }


async def ask_url(url: str, samples, opts: EvalOptions, renderer) -> list:
    """:func:`ask` on a session of its own, progress printed to stderr."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        return await ask(session, url, samples, opts, renderer, progress_printer(len(samples)))


def _fmt(m: dict) -> str:
    v, lo, hi = m["value"], m["ci_low"], m["ci_high"]
    if not math.isfinite(v):
        return "n/a"
    return f"{v:.4f}  [{lo:.4f}, {hi:.4f}]"


def render(result: dict, official: bool) -> str:
    """The result as a table per task (and overall with several tasks)."""
    lines = []
    proto = result["protocol"]
    lines.append(
        f"protocol: {proto['endpoint']}, {proto['beam_width']} beams, {proto['max_tokens']} "
        f"tokens, k in {proto['ks']}; 95% CI: {proto['ci']}"
    )
    blocks = dict(result["tasks"])
    if len(blocks) > 1:
        blocks["(all tasks)"] = result["overall"]
    for task, b in blocks.items():
        cat = f", catalog {b['catalog']}" if b.get("catalog") else ""
        lines.append(
            f"\n{task}: {b['samples']} samples, {b['failed_requests']} failed requests{cat}"
        )
        pub = b.get("published", {})
        for name, m in b["metrics"].items():
            ref = pub.get(name)
            extra = "   published: " + ", ".join(f"{k} {v}" for k, v in ref.items()) if ref else ""
            lines.append(f"  {name:<24} {_fmt(m)}{extra}")
        for name in ("invalid_rate", "duplicate_rate"):
            r = b[name]
            lines.append(f"  {name:<24} {_fmt(r)}  ({r['count']} of {r['n']} beams)")
    if not result["catalog_checked"]:
        lines.append("\ninvalid_rate counts malformed beams only: no catalog was given")
    if not result["pid_mode"]:
        lines.append("PID metrics: none (no sid2pid mapping found; pass --sid2pid)")
    if official:
        for f in result["files"]:
            if not f["official"]:
                lines.append(f"published numbers not shown for {f['path']}: {f['official_why']}")
    return "\n".join(lines)
