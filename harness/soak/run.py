"""The soak loop: constant-rate load, the probe, the actions and one sample per interval.

Four tasks share one event loop for ``duration_s``: the load (request ``i`` sent at
``i / rate`` whatever the answers, cycling over the prompts; an arrival finding
``max_inflight`` requests in flight is counted as an error, not sent), the probe (every
``probe_every_s``, the first at the start), each action (every its period) and the sampler.
Every ``interval_s`` the sampler takes one row: the interval's latency percentiles and
errors, the cumulative request count, the server's gauges from ``/metrics`` and the RSS, fds
and threads of every process of the server's group; it prints one progress line. After the
load, in-flight requests finish, one last row is taken and the server's slot and KV gauges
must come back to idle (a request that never gave its rows back is a leak).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from harness.load.client import Record, Request, send
from harness.load.sids import SidChecker
from harness.load.workload import Prompt
from harness.metrics.server import scrape
from harness.soak import actions as soak_actions
from harness.soak import probe as soak_probe
from harness.soak.config import ActionSpec, SoakConfig
from harness.soak.procs import role_of, roles, sample_group

# sampled gauge -> the /metrics family (summed over its labels)
GAUGES = {
    "slots_used": "flashrec_slots_used",
    "kv_tokens_used": "flashrec_kv_tokens_used",
    "kv_tokens_cached": "flashrec_kv_tokens_cached",
    "prefix_cache_nodes": "flashrec_prefix_cache_nodes",
    "running_requests": "flashrec_running_requests",
    "queue_length": "flashrec_queue_length",
    "http_inflight": "flashrec_http_inflight_requests",
    "catalogs_live": "flashrec_catalogs_live",
}
# gauges that must read 0 once the load has drained
IDLE = ("slots_used", "kv_tokens_used", "running_requests", "queue_length")


def gauge(samples: dict[str, float], family: str) -> float | None:
    """The sum of ``family``'s samples (None when the server exports none)."""
    vals = [v for k, v in samples.items() if k == family or k.startswith(family + "{")]
    return sum(vals) if vals else None


def percentiles(latencies: list[float]) -> dict[str, float | None]:
    """p50 / p90 / p99 / max of latencies (s) in ms; None without any."""
    if not latencies:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    a = np.asarray(latencies) * 1000.0
    p = np.percentile(a, [50, 90, 99])
    return {
        "p50_ms": float(p[0]),
        "p90_ms": float(p[1]),
        "p99_ms": float(p[2]),
        "max_ms": float(a.max()),
    }


@dataclass
class State:
    """What the soak has seen so far (the report is written from it, also after Ctrl-C)."""

    sent: int = 0
    done: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)  # the current interval's
    # every answered request's start (s into the soak) and latency (s): latency around actions
    started: list[float] = field(default_factory=list)
    took: list[float] = field(default_factory=list)
    interval_errors: int = 0
    error_log: list[dict] = field(default_factory=list)  # the first 100 errors
    actions: list[dict] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    idle: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    interrupted: bool = False  # stopped before its duration (Ctrl-C, SIGTERM)

    def error(self, t_s: float, kind: str, text: str) -> None:
        self.errors += 1
        self.interval_errors += 1
        if len(self.error_log) < 100:
            self.error_log.append({"t_s": round(t_s, 3), "kind": kind, "error": text[:300]})


class Soak:
    """One soak against ``base_url``; ``pgid`` is the server's process group (None: an
    external server whose processes are not sampled)."""

    def __init__(
        self,
        cfg: SoakConfig,
        base_url: str,
        pgid: int | None,
        prompts: list[Prompt],
        log: Callable[[str], None] = print,
        on_row: Callable[[list[dict]], None] | None = None,
    ) -> None:
        self.cfg, self.base, self.pgid, self.log = cfg, base_url.rstrip("/"), pgid, log
        self.on_row = on_row  # called with every row so far after each sample
        self.requests = [
            Request(p, cfg.beam_width, cfg.max_tokens, 0.0, model="default") for p in prompts
        ]
        self.checker = SidChecker(levels=max(1, cfg.max_tokens - 1))
        self.state = State()
        self.probe = soak_probe.Probe(cfg.probe_score_tol, cfg.probe_key)
        self.probe_status = ""
        self._t0 = 0.0

    def now(self) -> float:
        return time.monotonic() - self._t0

    async def run(self) -> State:
        """Run the soak; returns its state (rows, errors, actions, idle gauges)."""
        cfg = self.cfg
        limits = aiohttp.TCPConnector(limit=cfg.max_inflight + 16)
        async with aiohttp.ClientSession(connector=limits) as session:
            self.state.names = await roles(self.base, self.pgid)
            self._t0 = time.monotonic()
            inflight: set[asyncio.Task] = set()
            side = [asyncio.create_task(self._sampler(session))]
            side.append(asyncio.create_task(self._prober(session)))
            side += [asyncio.create_task(self._action(session, a)) for a in cfg.actions]
            try:
                await self._load(session, inflight)
                if inflight:
                    await asyncio.wait(inflight, timeout=cfg.timeout_s + 5)
                for _ in list(inflight):  # past their own timeout: counted, then cancelled
                    self.state.error(self.now(), "unfinished", "no answer after the load")
            finally:
                for task in side:
                    task.cancel()
                await asyncio.gather(*side, return_exceptions=True)
                for task in inflight:
                    task.cancel()
            self.state.elapsed_s = self.now()
            await self._sample(session, final=True)
            self.state.idle = await self._idle(session)
        return self.state

    async def _load(self, session: aiohttp.ClientSession, inflight: set[asyncio.Task]) -> None:
        cfg, i = self.cfg, 0
        while True:
            at = i / cfg.rate
            if at >= cfg.duration_s:
                return
            delay = at - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(inflight) >= cfg.max_inflight:
                self.state.error(self.now(), "backlog", f">= {cfg.max_inflight} in flight")
                self.state.done += 1
            else:
                task = asyncio.create_task(self._one(session, i))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
            i += 1

    async def _one(self, session: aiohttp.ClientSession, i: int) -> None:
        req = self.requests[i % len(self.requests)]
        rec = Record("soak", 0, "soak", i, req.prompt.index, 0.0)
        self.state.sent += 1
        t0 = self.now()
        await send(session, self.base, "chat", req, rec, self.checker, self.cfg.timeout_s, [])
        self.state.done += 1
        if rec.ok:
            self.state.latencies.append(rec.latency)
            self.state.started.append(t0)
            self.state.took.append(rec.latency)
        else:
            self.state.error(self.now(), rec.status, rec.error or rec.status)

    async def _prober(self, session: aiohttp.ClientSession) -> None:
        cfg, k = self.cfg, 0
        while True:
            delay = k * cfg.probe_every_s - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            answer, err, _ = await soak_probe.ask(
                session, self.base, cfg.probe_beam_width, cfg.max_tokens, cfg.timeout_s
            )
            same = self.probe.check(self.now(), answer, err)
            if answer is None:
                self.state.error(self.now(), "probe", err)
            self.probe_status = "ok" if same else ("error" if answer is None else "CHANGED")
            k += 1

    async def _action(self, session: aiohttp.ClientSession, spec: ActionSpec) -> None:
        run = soak_actions.ACTIONS[spec.name][0]
        k = 0
        while True:
            await asyncio.sleep(max(0.0, (k + 1) * spec.period_s - self.now()))
            t, arg = self.now(), spec.arg(k)
            ok, detail, timings = await run(session, self.base, arg)
            entry = {
                "t_s": round(t, 3),
                "action": spec.name,
                "arg": arg,
                "ok": ok,
                "took_s": round(self.now() - t, 3),
                "detail": detail,
                "timings_ms": timings,
            }
            self.state.actions.append(entry)
            if not ok:
                self.state.error(t, f"action {spec.name}", detail)
            self.log(
                f"[{_clock(t)}] action {spec.name}{'=' + arg if arg else ''}: "
                f"{'ok' if ok else 'FAILED'} ({entry['took_s']:.2f} s)"
            )
            k += 1

    async def _sampler(self, session: aiohttp.ClientSession) -> None:
        k = 1
        while True:
            await asyncio.sleep(max(0.0, k * self.cfg.interval_s - self.now()))
            await self._sample(session)
            k += 1

    async def _sample(self, session: aiohttp.ClientSession, final: bool = False) -> None:
        st, t = self.state, self.now()
        last_t = st.rows[-1]["t_s"] if st.rows else 0.0
        last_done = st.rows[-1]["requests"] if st.rows else 0
        lat, errs = st.latencies, st.interval_errors
        st.latencies, st.interval_errors = [], 0
        row: dict = {
            "t_s": round(t, 3),
            "requests": st.done,
            "sent": st.sent,
            "rate": round((st.done - last_done) / max(t - last_t, 1e-9), 3),
            "ok": len(lat),
            "errors": errs,
            "errors_total": st.errors,
            "warmup": int(t - self.cfg.interval_s / 2 < self.cfg.warmup_s),
            "final": int(final),
            "probe": self.probe_status,
        }
        row.update(percentiles(lat))
        metrics = await scrape(session, self.base)
        for name, family in GAUGES.items():
            row[name] = gauge(metrics, family) if metrics else None
        if metrics is None and "no /metrics" not in " ".join(st.notes):
            st.notes.append("no /metrics from the server: its gauges are not sampled")
        if self.pgid is not None:
            procs = sample_group(self.pgid, urlsplit(self.base).port)
            row["processes"] = len(procs)
            for pid, s in procs.items():
                st.names[pid] = role_of(pid, st.names)
                label = f"{st.names[pid]}-{pid}"
                row[f"rss_mib[{label}]"] = round(s.rss_mib, 3)
                row[f"fds[{label}]"] = s.fds
                row[f"conns[{label}]"] = s.conns
                row[f"fds_other[{label}]"] = s.fds - s.conns
                row[f"threads[{label}]"] = s.threads
        st.rows.append(row)
        self.log(progress_line(row))
        if self.on_row is not None:
            self.on_row(st.rows)

    async def _idle(self, session: aiohttp.ClientSession, wait_s: float = 10.0) -> dict:
        """The :data:`IDLE` gauges once the load has drained (polled up to ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        while True:
            metrics = await scrape(session, self.base) or {}
            idle = {name: gauge(metrics, GAUGES[name]) for name in IDLE}
            if all(not v for v in idle.values()) or time.monotonic() > deadline:
                return idle
            await asyncio.sleep(0.5)


def _clock(t_s: float) -> str:
    m, s = divmod(int(t_s), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


def _sum(row: dict, kind: str) -> float:
    return sum(v for k, v in row.items() if k.startswith(kind + "[") and v is not None)


def progress_line(row: dict) -> str:
    """One line per interval: requests, rate, errors, latency, resources, gauges, probe."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    def g(name: str) -> str:
        v = row.get(name)
        return "-" if v is None else f"{v:g}"

    procs = ""
    if "processes" in row:
        procs = (
            f" | {row['processes']} procs rss {_sum(row, 'rss_mib'):.0f} MiB "
            f"fds {_sum(row, 'fds'):.0f} ({_sum(row, 'conns'):.0f} conns) "
            f"thr {_sum(row, 'threads'):.0f}"
        )
    return (
        f"[{_clock(row['t_s'])}] req {row['requests']} ({row['rate']:.1f}/s) "
        f"err {row['errors']}/{row['errors_total']} p50 {ms(row['p50_ms'])} "
        f"p99 {ms(row['p99_ms'])} ms{procs} | slots {g('slots_used')} kv {g('kv_tokens_used')} "
        f"queue {g('queue_length')} | probe {row['probe'] or '-'}"
        + (" (warm-up)" if row["warmup"] else "")
        + (" (final)" if row["final"] else "")
    )
