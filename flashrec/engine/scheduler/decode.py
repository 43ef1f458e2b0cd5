"""Decode: ONE forward over the beam rows of every running request (different requests,
different n, different levels), cut into graph-sized runs of whole requests, then either the
eager expansion or, under ``--enable-step-graph``, the whole step as one static program."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from flashrec.engine.meta import host_to_device
from flashrec.engine.runner import ModelRunner
from flashrec.engine.scheduler.cache import CacheManager
from flashrec.engine.scheduler.debug import StepDebug
from flashrec.engine.scheduler.expand import BeamExpander
from flashrec.engine.scheduler.state import Finished, ReqState, extend_histories
from flashrec.profiler import trace_range


class DecodeManager:
    def __init__(
        self,
        runner: ModelRunner,
        cache: CacheManager,
        expander: BeamExpander,
        debug: StepDebug,
        depth: int,
    ) -> None:
        self.runner = runner
        self.cache = cache
        self.expander = expander
        self.debug = debug
        self.depth = depth
        self.device = runner.device

    def run(self, running: list[ReqState]) -> Finished:
        """One decode step of every unfinished request in ``running``; requests whose batch
        fails leave ``running`` and are answered with the error."""
        batch, groups, ending = [], [], []
        for st in running:
            g = st.generated
            if st.done:
                continue
            if g >= self.depth and self.runner.lm_head.end_step_is_free:
                ending.append(st)
                continue
            step = g - 1
            groups.append(
                (st.rows_np, st.prompt_slots_np, st.prompt_slots_t, step, st.req.prompt_len + step)
            )
            batch.append(st)
        if ending:
            self.expander.append_end(ending)
        if not batch:
            return []
        # requests at the same level side by side: one LM-head product per level
        order = sorted(range(len(batch)), key=lambda i: batch[i].generated)
        batch, groups = [batch[i] for i in order], [groups[i] for i in order]
        out: Finished = []
        for a, b in row_chunks([st.req.n for st in batch], self.runner.decode_rows_limit):
            out.extend(self._batch(batch[a:b], groups[a:b], running))
        return out

    def _batch(self, batch: list[ReqState], groups: list, running: list[ReqState]) -> Finished:
        """One decode forward (a graph replay where the rows fit one) over ``batch``, ordered
        by level; a failure fails these requests only."""
        try:
            meta = self.runner.decode_meta(groups)
            input_ids = torch.cat([st.tokens[:, -1] for st in batch])
            levels = [st.generated for st in batch]
            hasher = self.debug.hasher
            if hasher is None and self.runner.step_batch_ok([st.req.n for st in batch], levels):
                if self.runner.step_serves([st.catalog for st in batch]):
                    self._static(batch, input_ids, meta, levels)
                    return []
                self.cache.stats.other_catalog_steps_total += 1
            logprobs = self.runner.decode(input_ids, meta, levels)
            if hasher is not None:
                hasher.decode(meta, input_ids, batch)
            self.expander.advance(
                [(st, st.cum, lp, st.nodes) for st, lp in zip(batch, logprobs)], "decode"
            )
        except Exception as exc:  # noqa: BLE001
            for st in batch:
                running.remove(st)
            return self.cache.fail(batch, exc)
        return []

    def _static(self, batch: list[ReqState], input_ids, meta, levels: list[int]) -> None:
        """The whole step as one static program (``--enable-step-graph``): one graph replay on
        GPU, then the token histories per run of equal length (the batch is ordered by level)."""
        lv = host_to_device([np.asarray(levels)], self.device)[0]
        temps = seeds = None  # all greedy
        if any(st.req.temperature > 0 for st in batch):
            temps = np.asarray([st.req.temperature for st in batch], dtype=np.float32)
            temps = host_to_device([temps], self.device, np.float32)[0]  # pinned: no sync
            seeds = torch.cat([st.seed_t for st in batch])
        cum = torch.stack([st.cum for st in batch])
        nodes = torch.stack([st.nodes for st in batch])
        with trace_range("flashrec.beam"):
            out = self.runner.decode_step(input_ids, meta, lv, cum, nodes, temps, seeds)
            # the static outputs are overwritten by the next replay: own copies
            parents, tokens, nodes, cum = (
                t.clone() for t in (out.parents, out.tokens, out.nodes, out.cum)
            )
            a = 0
            for level, run in itertools.groupby(levels):  # equal levels: equal history lengths
                b = a + len(list(run))
                hist = extend_histories(batch[a:b], parents[a:b], tokens[a:b])
                for j, st in enumerate(batch[a:b]):
                    st.tokens, st.cum, st.nodes = hist[j], cum[a + j], nodes[a + j]
                    if self.debug.on:
                        self.debug.log(st, level, "decode", parents[a + j])
                a = b


def row_chunks(widths: list[int], limit: int | None) -> list[tuple[int, int]]:
    """``[a, b)`` runs of consecutive requests whose beam rows (``widths``) add up to at most
    ``limit`` (None: one run of all); a request wider than ``limit`` runs alone. Requests are
    never split: a request's beams expand together."""
    if limit is None:
        return [(0, len(widths))] if widths else []
    runs, a, rows = [], 0, 0
    for i, w in enumerate(widths):
        if i > a and rows + w > limit:
            runs.append((a, i))
            a, rows = i, 0
        rows += w
    if widths:
        runs.append((a, len(widths)))
    return runs
