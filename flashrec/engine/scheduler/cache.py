"""Prompt KV and beam rows of the scheduler's requests: radix matches, reservation (with
eviction), publication of prefilled prompts, release, and the failure of a batch."""

from __future__ import annotations

import logging

from flashrec.engine.request import EngineError, GenRequest
from flashrec.engine.scheduler.state import Finished, ReqState, SchedulerStats
from flashrec.kvcache.pool import KVCache
from flashrec.kvcache.radix import Node, RadixCache

log = logging.getLogger("flashrec")


class CacheManager:
    """The KV pool's prompt slots and beam rows as the scheduler holds them, over an optional
    radix cache (``--enable-prefix-cache``). Radix matches shorter than ``min_match`` tokens
    are recomputed."""

    def __init__(
        self, kv: KVCache, radix: RadixCache | None, min_match: int, stats: SchedulerStats
    ) -> None:
        self.kv = kv
        self.radix = radix
        self.min_match = min_match
        self.stats = stats

    def match(self, req: GenRequest) -> tuple[list[int], Node | None]:
        """The cached prefix worth reusing (slots, node); >= 1 prompt token is left to compute."""
        if self.radix is None:
            return [], None
        slots, node = self.radix.match(req.input_ids[:-1])
        if len(slots) < self.min_match:
            return [], None  # too short to be worth the gather: recompute
        return slots, node

    def reserve(self, node: Node | None, need: int) -> bool:
        """Lock ``node`` and make room for ``need`` new prompt tokens, evicting unlocked radix
        entries if needed; False (nothing held) when the pool cannot."""
        tokens, radix = self.kv.tokens, self.radix
        if radix is not None:
            radix.lock(node)
        if need > tokens.num_free and radix is not None:
            tokens.free(radix.evict(need - tokens.num_free))
        if need > tokens.num_free:
            if radix is not None:
                radix.unlock(node)
            return False
        return True

    def publish(self, st: ReqState) -> None:
        """Insert the prompt into the radix cache; keep only the slots it did not take. The
        cache is then trimmed to its node cap (``--prefix-cache-max-nodes``), this prompt's
        path locked, and what that evicts goes back to the pool."""
        if self.radix is None:
            return
        new_node, dup = self.radix.insert(st.req.input_ids, st.prompt_slots)
        self.radix.lock(new_node)
        self.radix.unlock(st.node)
        st.node = new_node
        st.private_slots = dup
        trimmed = self.radix.trim()
        if trimmed:
            self.kv.tokens.free(trimmed)

    def release(self, st: ReqState) -> None:
        """Free the request's beam rows and private prompt slots; unlock its radix node."""
        if st.rows is not None:
            self.kv.rows.free(st.rows_np.tolist())
            st.rows = st.rows_np = None
        if st.private_slots:
            self.kv.tokens.free(st.private_slots)
            st.private_slots = []
        if self.radix is not None and st.node is not None:
            self.radix.unlock(st.node)
            st.node = None

    def fail(self, batch: list[ReqState], exc: Exception) -> Finished:
        """A failed batch: its requests released, each answered with the error."""
        self.stats.batch_failures_total += 1
        log.exception("batch of %d requests failed", len(batch), exc_info=exc)
        for st in batch:
            self.release(st)
        err = EngineError(f"{type(exc).__name__}: {exc}")
        return [(st.req, err) for st in batch]

    def flush(self) -> int:
        """Empty the radix cache; returns the tokens freed."""
        if self.radix is None:
            return 0
        freed = self.radix.flush()
        self.kv.tokens.free(freed)
        return len(freed)

    @property
    def evictable_tokens(self) -> int:
        return self.radix.evictable_tokens if self.radix else 0
