"""Admission: the waiting queue, its order (longest prefix match with aging, or FCFS) and the
requests admitted each step under the beam-row slot budget, the prefill token budget and the
prompt KV pool."""

from __future__ import annotations

import random
import time

import numpy as np

from flashrec.engine.meta import host_to_device
from flashrec.engine.request import GenRequest
from flashrec.engine.scheduler.cache import CacheManager
from flashrec.engine.scheduler.state import ReqState


class AdmissionManager:
    """Owns ``waiting`` (requests not yet admitted). ``admit()`` takes requests in order
    while they fit; the first that does not fit stops admission (no overtaking)."""

    def __init__(self, cfg, cache: CacheManager, depth: int, device) -> None:
        self.cfg = cfg
        self.cache = cache
        self.kv = cache.kv
        self.depth = depth
        self.device = device
        self.waiting: list[GenRequest] = []

    def add(self, req: GenRequest) -> None:
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

    def admit(self) -> list[ReqState]:
        """Admit waiting requests: beam rows and prompt slots allocated (cached prefix locked),
        rows copied to the device in one pinned asynchronous copy."""
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
            seeds.append(np.asarray([req.seed if req.seed is not None else random.getrandbits(62)]))
            budget -= need
            admitted.append(st)
            self.waiting.remove(req)
        if admitted:  # every admitted request's beam rows and seed in one pinned asynchronous copy
            views = host_to_device([s.rows_np for s in admitted] + seeds, self.device)
            for st, rows, seed in zip(admitted, views, views[len(admitted) :]):
                st.rows, st.seed_t = rows, seed
        return admitted
