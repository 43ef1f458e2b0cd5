"""The scheduler: the ``step()`` loop and the API the engine and its loop call, over small
managers (admission, prefill, decode with its beam expansion, results, KV cache)."""

from __future__ import annotations

from flashrec.engine.prefill_graph import BUCKET
from flashrec.engine.request import GenRequest, GenResult, SidText
from flashrec.engine.runner import ModelRunner
from flashrec.engine.scheduler.admission import AdmissionManager
from flashrec.engine.scheduler.cache import CacheManager
from flashrec.engine.scheduler.debug import StepDebug
from flashrec.engine.scheduler.decode import DecodeManager
from flashrec.engine.scheduler.expand import BeamExpander
from flashrec.engine.scheduler.prefill import PrefillManager
from flashrec.engine.scheduler.results import PendingResults, ResultManager
from flashrec.engine.scheduler.state import Finished, ReqState, SchedulerStats
from flashrec.engine.stephash import StepHasher
from flashrec.kvcache.radix import RadixCache
from flashrec.profiler import trace_range
from flashrec.sid.catalog_set import CatalogSet
from flashrec.sid.layout import SidLayout
from flashrec.sid.version import CatalogVersion


class Scheduler:
    """Continuous batching of beam rows. Each :meth:`step`::

        admit    waiting requests in order, under the row, prefill-token and KV budgets
                 (a request whose inputs the engine cannot hold is answered alone)
        prefill  the admitted prompts in one forward; their first beams
        decode   ONE forward over every running request's rows; their next beams
        retire   finished requests: rows and slots freed, results copied to the host
                 (handed back now, or by the next step under --overlap-results)

    Requests join and leave between steps. Everything runs on the engine thread."""

    def __init__(
        self, runner: ModelRunner, layout: SidLayout, catalogs: CatalogSet, tokenizer=None
    ) -> None:
        self.runner = runner
        self.cfg = cfg = runner.config
        self.layout = layout
        # the served catalogs by name: a request admitted from now on takes the served version
        # of the one it names (the default's when it names none); a swap replaces it there
        self.catalogs = catalogs
        self.tokenizer = tokenizer
        self.depth = runner.depth
        self.kv = runner.kv
        self.device = runner.device
        max_nodes = cfg.prefix_cache_max_nodes or None  # 0: bounded by the KV pool only
        self.radix = RadixCache(max_nodes) if cfg.resolved_enable_prefix_cache else None
        self.stats = SchedulerStats()
        self._text = SidText(tokenizer, layout)
        # shorter radix matches are recomputed (--prefix-cache-min-match); with prefill graphs
        # at least one bucket, since only prompts without a cached prefix replay one
        min_match = cfg.prefix_cache_min_match
        if runner.prefill_graphs is not None:
            min_match = max(min_match, BUCKET)
        self.cache = CacheManager(self.kv, self.radix, min_match, self.stats)
        self.debug = StepDebug(self.kv)
        self.admission = AdmissionManager(
            cfg, self.cache, self.depth, self.device, runner.model_config.vocab_size
        )
        expander = BeamExpander(self.kv, layout, self.depth, self.debug)
        self.prefill = PrefillManager(runner, self.cache, expander, self.debug, self.stats)
        self.decode = DecodeManager(runner, self.cache, expander, self.debug, self.depth)
        self.results = ResultManager(cfg.length_penalty, layout.sid_end, self._text)
        self.waiting: list[GenRequest] = self.admission.waiting  # the same list
        self.running: list[ReqState] = []
        # --overlap-results: a step's finished requests, their results' device-to-host copy
        # started, handed back by the next step once its GPU work is launched
        self.overlap_results = cfg.resolved_overlap_results
        self._pending: PendingResults | None = None

    # ---- public -------------------------------------------------------------------------
    def add(self, req: GenRequest) -> None:
        self.admission.add(req)

    def cancel(self, rid: str) -> bool:
        if self.admission.cancel(rid):
            return True
        for st in self.running:
            if st.req.rid == rid:
                self.cache.release(st)
                self.running.remove(st)
                return True
        return False

    @property
    def catalog(self) -> CatalogVersion:
        """The default catalog's served version."""
        return self.catalogs.get(None)

    def catalog_for(self, req: GenRequest) -> CatalogVersion:
        """The catalog ``req`` decodes over: the served version of the one it names, else
        the default's. Requests admitted before a swap finish with theirs."""
        return self.catalogs.get(req.catalog)

    def live_catalogs(self) -> list[CatalogVersion]:
        """The catalogs alive now: every one held (each name's served and previous version)
        and those of running (or held-back) requests; a replaced catalog no longer held is
        dropped with its last request."""
        out = {id(version): version for version in self.catalogs.live()}
        held = self._pending.states if self._pending is not None else []
        for st in [*self.running, *held]:
            out.setdefault(id(st.catalog), st.catalog)
        return list(out.values())

    @property
    def min_match(self) -> int:
        return self.cache.min_match

    @property
    def debug_hash(self) -> bool:
        """STEP_HASH lines per request and step (``FLASHREC_DEBUG_STEP_HASH=1``)."""
        return self.debug.on

    @debug_hash.setter
    def debug_hash(self, on: bool) -> None:
        self.debug.on = on

    @property
    def hasher(self) -> StepHasher | None:
        """The step hasher while ``debug_hash`` is on."""
        return self.debug.hasher

    @property
    def used_rows(self) -> int:
        return self.kv.rows.num_used

    @property
    def kv_reserved_tokens(self) -> int:
        """Pool slots held for the engine's lifetime (the prefill graphs' padding slots)."""
        pad = self.runner.pad_slots
        return pad.numel() if pad is not None else 0

    @property
    def kv_used_tokens(self) -> int:
        """Prompt KV held by requests (cached-but-unreferenced tokens and the reserved
        padding slots are not counted)."""
        return self.kv.tokens.num_used - self.cache.evictable_tokens - self.kv_reserved_tokens

    def has_work(self) -> bool:
        # a request refused on arrival is answered by the next step
        return bool(self.waiting or self.running or self._pending or self.admission.rejected)

    def flush_pending(self, exc: BaseException | None = None):
        """Results held back by ``--overlap-results`` (finished now), or ``exc`` for each of
        those requests when given; the engine loop calls it when a step fails, so no finished
        request is lost."""
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        if exc is not None:
            return [(st.req, exc) for st in pending.states]
        try:
            return self.results.finish(pending)
        except Exception as err:  # noqa: BLE001 - the copy failed: fail those requests
            return [(st.req, err) for st in pending.states]

    def flush_cache(self) -> int:
        """Empty the radix cache; returns the tokens freed."""
        return self.cache.flush()

    def step(self) -> list[tuple[GenRequest, GenResult | Exception]]:
        """One engine step. Returns finished (or failed) requests."""
        out: Finished = []
        with trace_range("flashrec.schedule"):
            admitted = self.admission.admit()
            for st in admitted:
                st.catalog = self.catalog_for(st.req)
        out.extend(self.admission.take_rejected())  # inputs the engine cannot hold: alone
        if admitted:
            out.extend(self.prefill.run(admitted, self.running))
        out.extend(self.decode.run(self.running))
        done = [s for s in self.running if s.done]
        started = None
        if done:
            with trace_range("flashrec.results"):
                started = self.results.start(done)  # device ranking + asynchronous copy
                for st in done:
                    self.running.remove(st)
                    self.cache.release(st)  # stream order: later writes to its KV come after
        hold = started is not None and self.overlap_results and bool(self.waiting or self.running)
        if started is not None and not hold:  # nothing else queued: hand them back now
            with trace_range("flashrec.results"):
                out.extend(self.results.finish(started))
        # the previous step's held-back results: this step's GPU work is already queued, so
        # the GPU keeps running while they are waited for and built (after a wait for a later
        # copy just above, their event has passed: no second wait)
        if self._pending is not None:
            with trace_range("flashrec.results"):
                out.extend(self.flush_pending())
        if hold:
            self._pending = started
        self.stats.steps_total += 1
        return out
