"""Admission: the waiting queue, its order (longest prefix match with aging, or FCFS) and the
requests admitted each step under the beam-row slot budget, the prefill token budget and the
prompt KV pool. Each request's inputs are checked and made into its per-request values here,
one request at a time, on arrival: a request the engine cannot run fails alone, before it
joins a batch."""

from __future__ import annotations

import random
import time

import numpy as np

from flashrec.engine.meta import host_to_device
from flashrec.engine.request import EngineError, GenRequest, check_request_limits
from flashrec.engine.scheduler.cache import CacheManager
from flashrec.engine.scheduler.state import Finished, ReqState


class AdmissionManager:
    """Owns ``waiting`` (requests not yet admitted). ``admit()`` takes requests in order
    while they fit; the first that does not fit stops admission (no overtaking). A request
    whose inputs the engine cannot hold leaves the queue into ``rejected`` (with its error)."""

    def __init__(self, cfg, cache: CacheManager, depth: int, device, vocab_size: int) -> None:
        self.cfg = cfg
        self.cache = cache
        self.kv = cache.kv
        self.depth = depth
        self.device = device
        self.vocab_size = vocab_size
        self.waiting: list[GenRequest] = []
        self.rejected: Finished = []  # taken by the scheduler's step (``take_rejected``)

    def add(self, req: GenRequest) -> None:
        """Queue ``req``, or refuse it alone (into ``rejected``) when ``check`` fails: once,
        on arrival, not at every step it waits."""
        try:
            self.check(req)
        except Exception as exc:  # noqa: BLE001 - this request fails, not the step
            if not isinstance(exc, ValueError):  # not a refusal: an engine error
                exc = EngineError(f"{type(exc).__name__}: {exc}")
            self.rejected.append((req, exc))
            return
        self.waiting.append(req)

    def cancel(self, rid: str) -> bool:
        for i, r in enumerate(self.waiting):
            if r.rid == rid:
                del self.waiting[i]
                return True
        return False

    def order(self) -> list[GenRequest]:
        """FCFS, or (with a radix cache) longest prefix match first, except that requests
        waiting past ``--lpm-aging-ms`` go first, in arrival order (no starvation)."""
        radix = self.cache.radix
        if self.cfg.schedule_policy == "fcfs" or radix is None:
            return sorted(self.waiting, key=lambda r: r.arrival)
        now = time.monotonic()
        aged = [r for r in self.waiting if (now - r.arrival) * 1000.0 >= self.cfg.lpm_aging_ms]
        fresh = [r for r in self.waiting if (now - r.arrival) * 1000.0 < self.cfg.lpm_aging_ms]
        fresh.sort(key=lambda r: (-len(radix.match(r.input_ids[:-1])[0]), r.arrival))
        return sorted(aged, key=lambda r: r.arrival) + fresh

    def take_rejected(self) -> Finished:
        """The requests refused since the last call, each with its error."""
        out, self.rejected = self.rejected, []
        return out

    def check(self, req: GenRequest) -> None:
        """ValueError unless ``req``'s inputs fit what the engine can hold (limits,
        temperature, seed, token ids). Front ends check these first; this holds for requests
        that bypassed them, so that one request's input never fails the batch it would have
        joined."""
        check_request_limits(req, self.kv.rows.size, self.cfg.max_seq_len, self.kv.pool_tokens)
        ids = req.input_ids
        if not ids:
            raise ValueError("the prompt is empty")
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")

    def admit(self) -> list[ReqState]:
        """Admit waiting requests: beam rows and prompt slots allocated (cached prefix locked),
        rows copied to the device in one pinned asynchronous copy (every waiting request passed
        ``check`` in ``add``)."""
        admitted: list[ReqState] = []
        seeds: list[np.ndarray] = []
        budget = self.cfg.max_prefill_tokens
        for req in self.order():
            if req.n > self.kv.rows.num_free:
                break
            slots, node = self.cache.match(req)
            need = req.prompt_len - len(slots)
            if admitted and need > budget:
                break
            if not self.cache.reserve(node, need):
                break
            st = ReqState(req, target_len=min(self.depth + 1, req.max_tokens))
            st.admitted_at = time.monotonic()
            st.node = node
            st.cached_tokens = len(slots)
            st.private_slots = self.kv.tokens.alloc(need)
            st.prompt_slots = list(slots) + st.private_slots
            st.rows_np = np.asarray(self.kv.rows.alloc(req.n), dtype=np.int64)
            seed = req.seed if req.seed is not None else random.getrandbits(62)
            seeds.append(np.asarray([seed], dtype=np.int64))
            budget -= need
            admitted.append(st)
            self.waiting.remove(req)
        if admitted:  # every admitted request's beam rows and seed in one pinned asynchronous copy
            views = host_to_device([s.rows_np for s in admitted] + seeds, self.device)
            for st, rows, seed in zip(admitted, views, views[len(admitted) :]):
                st.rows, st.seed_t = rows, seed
        return admitted
