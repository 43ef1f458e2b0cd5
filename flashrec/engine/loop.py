"""The engine thread: owns the scheduler, steps it while there is work, and hands results to
front ends through futures. Every scheduler, model and profiler call happens on this thread.

``EngineLoop`` is also the engine as the server sees it in this process (the server's
``ServedEngine``, matched by shape: the engine imports nothing of the server): the engine's
facts and prompt building are handed on from ``Engine``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import Any

from flashrec.engine.catalogs import CatalogReloader
from flashrec.engine.engine import Engine
from flashrec.engine.graph_stats import end_warmup_of, snapshot_of
from flashrec.engine.request import GenRequest, GenResult, QueueFullError
from flashrec.engine.weights import WeightUpdater
from flashrec.profiler import ProfileController
from flashrec.sid.layout import SidLayout

log = logging.getLogger("flashrec")


def wait_idle(in_flight: Callable[[], int], timeout_s: float) -> bool:
    """Poll ``in_flight()`` until it is 0 (True) or ``timeout_s`` has passed (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if in_flight() == 0:
            return True
        time.sleep(0.01)
    return in_flight() == 0


class EngineLoop:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.scheduler = engine.scheduler
        self.ready = False
        self._cond = threading.Condition()
        self._inbox: list[GenRequest] = []
        self._cancels: list[str] = []
        self._calls: list[tuple[Callable[[], Any], Future]] = []
        # calls that run once no request runs (a weight swap); while one waits, requests
        # not yet admitted are held here, out of the scheduler, and go back after it
        self._idle_calls: list[tuple[Callable[[], Any], Future]] = []
        self._held: list[GenRequest] = []
        self._futures: dict[str, Future] = {}
        self._hooks: list[Callable[[int], None]] = []
        self._admitting = True
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="flashrec-engine", daemon=True)
        self._snapshot: dict[str, int] = {}
        self.reloader = CatalogReloader(engine, self.call_on_engine_thread)
        self.weights_updater = WeightUpdater(engine, self.call_when_idle)
        self.profiler = ProfileController(self)
        self._take_snapshot()

    # ---- the engine's facts and prompts (any thread; a builder on one thread at a time) --
    @property
    def layout(self) -> SidLayout:
        return self.engine.layout

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def max_beam_rows(self) -> int:
        return self.engine.max_beam_rows

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def prompt_builders(self, count: int) -> list[Callable[..., list[int]]]:
        return self.engine.prompt_builders(count)

    def sid_text_table(self) -> dict[int, str]:
        return self.engine.sid_text_table()

    def server_info(self) -> dict[str, Any]:
        return self.engine.server_info()

    # ---- front-end API (any thread) -----------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, req: GenRequest) -> Future:
        """Queue ``req``; ValueError for a request the engine can never serve."""
        self.engine.check_request(req)
        fut: Future = Future()
        with self._cond:
            if not self._admitting:
                raise QueueFullError("server is shutting down")
            queued = len(self._inbox) + len(self.scheduler.waiting) + len(self._held)
            if queued >= self.engine.config.max_queue_len:
                raise QueueFullError(f"queue full ({self.engine.config.max_queue_len} waiting)")
            if req.rid in self._futures:
                raise ValueError(f"duplicate request id {req.rid!r}")
            self._futures[req.rid] = fut
            self._inbox.append(req)
            self._cond.notify()
        return fut

    def cancel(self, rid: str) -> None:
        with self._cond:
            self._cancels.append(rid)
            self._cond.notify()

    def call_on_engine_thread(self, fn: Callable[[], Any]) -> Future:
        fut: Future = Future()
        with self._cond:
            self._calls.append((fn, fut))
            self._cond.notify()
        return fut

    def call_when_idle(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on the engine thread once no request runs: from now on no waiting
        request is admitted; the running ones finish, then ``fn`` runs, then admission
        resumes in the same order. Requests in flight never see ``fn``'s effect; those
        admitted after it do."""
        fut: Future = Future()
        with self._cond:
            self._idle_calls.append((fn, fut))
            self._cond.notify()
        return fut

    def add_step_hook(self, fn: Callable[[int], None]) -> None:
        self._hooks.append(fn)

    def freeze_gc(self) -> int:
        """Nothing: the engine shares the server's process, whose own freeze covers it."""
        return 0

    def metrics_snapshot(self) -> tuple[dict[str, int], str, None]:
        """``(stats, profiler state, None)``: what ``/metrics`` reads of the engine (its GC
        counters are the process's own)."""
        return self.stats(), self.profiler.state, None

    def reload_catalog(
        self, path: str, packed_base: int | None = None, name: str | None = None
    ) -> dict[str, Any]:
        """Catalog hot reload (``CatalogReloader.reload``); call it off the engine thread."""
        return self.reloader.reload(path, packed_base, name)

    def rollback_catalog(self, name: str | None = None) -> dict[str, Any]:
        """Catalog rollback (``CatalogReloader.rollback``); call it off the engine thread."""
        return self.reloader.rollback(name)

    def update_weights(self, model_path: str, label: str | None = None) -> dict[str, Any]:
        """New weights without a restart (``WeightUpdater.update``); call it off the engine
        thread."""
        return self.weights_updater.update(model_path, label)

    def weights_info(self) -> dict[str, Any]:
        """The served weights' identity (``WeightsVersion.info``)."""
        weights = getattr(self.engine, "weights", None)
        return weights.info() if weights is not None else {}

    def catalog_info(self) -> dict[str, Any]:
        """The default catalog (``CatalogVersion.info``), as ``/get_server_info`` shows it."""
        version = getattr(self.engine, "catalog_version", None)
        return version.info() if version is not None else {}

    def catalogs_info(self) -> list[dict[str, Any]]:
        """Every named catalog (``CatalogSet.info``): version, hash, size, device bytes and
        the previous version a rollback returns to."""
        catalogs = getattr(self.engine, "catalogs", None)
        return catalogs.info() if catalogs is not None else []

    def flush_cache(self) -> int:
        """Empty the radix cache on the engine thread; returns the tokens freed."""
        return self.call_on_engine_thread(self.scheduler.flush_cache).result()

    def stats(self) -> dict[str, int]:
        """Counters as of the last engine step (a snapshot taken on the engine thread, so the
        HTTP thread never walks scheduler structures that the engine thread mutates)."""
        with self._cond:
            snap = dict(self._snapshot)
            snap["queue_len"] = len(self._inbox) + snap.get("waiting", 0)
        snap.update(self.reloader.stats())
        snap.update(self.weights_updater.stats())
        return snap

    def _take_snapshot(self) -> None:
        s = self.scheduler
        snap = {
            "waiting": len(s.waiting) + len(self._held),
            "running_requests": len(s.running),
            "used_slots": s.used_rows,
            "total_slots": s.kv.rows.size,
            "kv_used_tokens": s.kv_used_tokens,
            "kv_total_tokens": s.kv.pool_tokens - s.kv_reserved_tokens,
            "kv_cached_tokens": s.radix.cached_tokens if s.radix else 0,
            "prefix_cache_nodes": s.radix.num_nodes if s.radix else 0,
            "prefix_hit_tokens_total": s.stats.prefix_hit_tokens_total,
            "prompt_tokens_total": s.stats.prompt_tokens_total,
            "steps_total": s.stats.steps_total,
            "batch_failures_total": s.stats.batch_failures_total,
            "decode_graph_forwards_total": s.runner.decode_forwards["graph"],
            "decode_eager_forwards_total": s.runner.decode_forwards["eager"],
            "graph": snapshot_of(s.runner),  # flashrec_graph_* (engine/graph_stats.py)
        }
        live = getattr(s, "live_catalogs", None)
        if live is not None:  # the active catalog's identity, and how many are alive
            snap["catalog_hash"] = s.catalog.hash or "unconstrained"
            snap["catalog_sids"] = s.catalog.size or 0
            snap["catalogs_live"] = len(live())
            catalogs = getattr(self.engine, "catalogs", None)
            if catalogs is not None:  # per name: flashrec_catalog_* gauges labelled by name
                snap["catalogs"] = catalogs.info()
            snap["decode_other_catalog_steps_total"] = s.stats.other_catalog_steps_total
        weights = getattr(self.engine, "weights", None)
        if weights is not None:  # the served weights' identity (an info-style gauge)
            snap["weights_hash"] = weights.hash
            snap["weights_path"] = weights.path
            snap["weights_version"] = weights.version
        with self._cond:
            self._snapshot = snap

    def in_flight(self) -> int:
        with self._cond:
            return len(self._futures)

    def drain(self, timeout_s: float) -> bool:
        """Stop admitting; wait until in-flight requests finish (True) or the time is up."""
        with self._cond:
            self._admitting = False
        return wait_idle(self.in_flight, timeout_s)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    # ---- engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not (
                    self._inbox
                    or self._cancels
                    or self._calls
                    or self._idle_calls
                    or self._stopping
                    or self.scheduler.has_work()
                ):
                    self._cond.wait()
                if self._stopping:
                    break
                inbox, self._inbox = self._inbox, []
                cancels, self._cancels = self._cancels, []
                calls, self._calls = self._calls, []
            for fn, fut in calls:
                try:
                    fut.set_result(fn())
                except Exception as exc:  # noqa: BLE001
                    fut.set_exception(exc)
            if self._idle_calls or self._held:  # a swap waits: nothing more is admitted
                self._held += self.scheduler.waiting + inbox
                self.scheduler.waiting.clear()
                inbox = []
            for req in inbox:
                self.scheduler.add(req)
            for rid in cancels:
                if self._cancel_held(rid) or self.scheduler.cancel(rid):
                    self._resolve(rid, CancelledError(f"request {rid} cancelled"))
            if self._idle_calls and not self.scheduler.has_work():
                self._run_idle_calls()
            if calls or cancels:
                self._take_snapshot()
            if not self.scheduler.has_work():
                continue
            try:
                finished = self.scheduler.step()
            except Exception as exc:  # noqa: BLE001 - keep the thread alive whatever happens
                log.exception("engine step failed")
                finished = [(st.req, exc) for st in list(self.scheduler.running)]
                for st in list(self.scheduler.running):
                    self.scheduler.cancel(st.req.rid)
                # requests that finished before the failure (--overlap-results held their
                # results back): their results if the copy completes, else the error
                finished += self.scheduler.flush_pending()
            # the counters first: a client that reads /metrics once answered sees its step
            self._take_snapshot()
            # nothing else to do: the requests' finishers (their answer bodies) run here, on
            # the thread that just built the results, before the waiting thread wakes
            idle = not self._inbox and not self.scheduler.has_work()
            for req, res in finished:
                if (
                    idle
                    and req.finisher is not None
                    and isinstance(res, GenResult)
                    and req.rid in self._futures  # still awaited (not cancelled)
                ):
                    self._finish(req, res)
                self._resolve(req.rid, res)
            for hook in list(self._hooks):
                try:
                    hook(self.scheduler.stats.steps_total)
                except Exception:  # noqa: BLE001
                    log.exception("step hook failed")
        # fail whatever is left
        with self._cond:
            rids = list(self._futures)
            idle, self._idle_calls = self._idle_calls, []
        for _, fut in idle:
            fut.set_exception(CancelledError("engine stopped"))
        for rid in rids:
            self._resolve(rid, CancelledError("engine stopped"))

    def _cancel_held(self, rid: str) -> bool:
        for i, req in enumerate(self._held):
            if req.rid == rid:
                del self._held[i]
                return True
        return False

    def _run_idle_calls(self) -> None:
        """Engine thread, nothing running: run the idle calls, then give the held requests
        back to the scheduler in their order."""
        with self._cond:
            calls, self._idle_calls = self._idle_calls, []
        for fn, fut in calls:
            try:
                fut.set_result(fn())
            except Exception as exc:  # noqa: BLE001
                fut.set_exception(exc)
        held, self._held = self._held, []
        for req in held:
            self.scheduler.add(req)
        self._take_snapshot()

    @staticmethod
    def _finish(req: GenRequest, res: GenResult) -> None:
        """``res.finished = req.finisher(res)``; a finisher that fails leaves ``finished``
        None, so the waiting thread does the work itself (and meets the error there)."""
        if res.error:
            return
        try:
            res.finished = req.finisher(res)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - the waiting side repeats it and answers the error
            log.debug("request %s: finisher failed on the engine thread", req.rid, exc_info=True)

    def _resolve(self, rid: str, res: GenResult | BaseException) -> None:
        with self._cond:
            fut = self._futures.pop(rid, None)
        if fut is None or fut.done():
            return
        if isinstance(res, BaseException):
            fut.set_exception(res)
        else:
            # NOTE: a weight swap runs only while no request runs, so every result resolved
            # between two swaps was computed with the weights served now
            weights = getattr(self.engine, "weights", None)
            if weights is not None:
                res.weights_hash = weights.hash  # type: ignore[attr-defined]
            fut.set_result(res)

    def warmup(self, requests: int = 2) -> None:
        """Run a few requests through the whole path (before /health reports ok)."""
        eng = self.engine
        ids = eng.build_prompt(messages=[{"role": "user", "content": "warm-up"}])
        futs = [
            self.submit(
                eng.new_request(
                    ids, n=min(eng.config.beam_width, eng.max_beam_rows), rid=f"warmup-{i}"
                )
            )
            for i in range(requests)
        ]
        for f in futs:
            f.result()
        self.call_on_engine_thread(self.scheduler.flush_cache).result()
        end_warmup_of(self.scheduler.runner)  # a capture from now on is one while serving
        self.ready = True
