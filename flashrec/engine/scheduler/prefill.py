"""Prefill: the new tokens of every admitted prompt in one forward, the prompts published to
the radix cache, and each request's first beam step from its level-0 logprobs."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from flashrec.engine.meta import make_prefill_meta
from flashrec.engine.runner import ModelRunner
from flashrec.engine.scheduler.cache import CacheManager
from flashrec.engine.scheduler.debug import StepDebug
from flashrec.engine.scheduler.expand import BeamExpander
from flashrec.engine.scheduler.state import Finished, ReqState, SchedulerStats


class PrefillManager:
    def __init__(
        self,
        runner: ModelRunner,
        cache: CacheManager,
        expander: BeamExpander,
        debug: StepDebug,
        stats: SchedulerStats,
    ) -> None:
        self.runner = runner
        self.cache = cache
        self.expander = expander
        self.debug = debug
        self.stats = stats
        self.device = runner.device

    def run(self, batch: list[ReqState], running: list[ReqState]) -> Finished:
        """Prefill ``batch`` and expand its first beams; on success the batch joins
        ``running``, on failure its requests are released and answered with the error. Alone
        (nothing in ``running``), a lone prompt may replay a prefill graph. Under
        ``--deterministic`` each prompt runs in a forward of its own (its activations then
        depend on the prompt alone); the first beams of all of them expand together."""
        one_each = self.runner.config.deterministic
        forwards = [[st] for st in batch] if one_each else [batch]
        try:
            items = []
            for part in forwards:
                items += self._forward(part, alone=not running)
            self.expander.advance(items, "prefill")
        except Exception as exc:  # noqa: BLE001 - one batch fails, the server goes on
            return self.cache.fail(batch, exc)
        running.extend(batch)
        return []

    def _forward(self, batch: list[ReqState], alone: bool) -> list[tuple]:
        """One prefill forward over ``batch``; the prompts published to the radix cache.
        Returns the first expansion's items (state, cum, level-0 logprobs, trie root)."""
        # each prompt's slots as one array, its new tokens' slots a view of it (the private
        # ones come last), kept for the request's decode steps
        slots = [np.asarray(st.prompt_slots, dtype=np.int64) for st in batch]
        seqs = [(st.cached_tokens, s[st.cached_tokens :], s) for st, s in zip(batch, slots)]
        new = sum(st.req.prompt_len - st.cached_tokens for st in batch)
        ids = np.fromiter(
            itertools.chain.from_iterable(
                itertools.islice(st.req.input_ids, st.cached_tokens, None) for st in batch
            ),
            dtype=np.int64,
            count=new,
        )
        meta = make_prefill_meta(seqs, self.device, ids)
        input_ids = meta.input_ids
        logprobs = self.runner.prefill(input_ids, meta, alone=alone)
        hasher = self.debug.hasher
        if hasher is not None:
            hasher.prefill(meta, input_ids, batch)
        zero = torch.zeros(1, dtype=torch.float32, device=self.device)
        root = torch.zeros(1, dtype=torch.long, device=self.device)
        items = []
        for i, st in enumerate(batch):
            self.cache.publish(st)
            st.prompt_slots_t = meta.seq_slots[i]  # the prompt's slots, already on the device
            st.prompt_slots_np = slots[i]
            items.append((st, zero, logprobs[i : i + 1], root))
            self.stats.prompt_tokens_total += st.req.prompt_len
            self.stats.prefix_hit_tokens_total += st.cached_tokens
        return items
