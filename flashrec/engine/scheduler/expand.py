"""Eager beam expansion: every request's next beams from its level's logprobs (after a
prefill, after an eager decode forward), and the free <|sid_end|> step."""

from __future__ import annotations

import torch

from flashrec.beam.search import candidates, expand
from flashrec.engine.scheduler.debug import StepDebug
from flashrec.engine.scheduler.state import ReqState, by_shape, extend_histories
from flashrec.profiler import trace_range
from flashrec.sid.layout import SidLayout


class BeamExpander:
    """``advance(items, phase)``: items are ``(state, cum [m], logprobs [m, K], nodes [m])``;
    requests of equal (n, level, rows, temperature) expand in one batched call (sampled
    ones each with its own seed's noise), and
    every reordered request's decode KV moves in ONE gather. Each request expands with the
    trie of the catalog it was admitted with (``ReqState.catalog``)."""

    def __init__(self, kv, layout: SidLayout, depth: int, debug: StepDebug) -> None:
        self.kv = kv
        self.layout = layout
        self.depth = depth
        self.debug = debug

    def advance(self, items, phase: str) -> None:
        buckets: dict[tuple, list] = {}
        for it in items:
            st, cum = it[0], it[1]
            key = (st.req.n, st.generated, cum.shape[0], st.req.temperature, id(st.catalog))
            buckets.setdefault(key, []).append(it)
        dst, src = [], []
        layout, depth, logged = self.layout, self.depth, self.debug.on
        with trace_range("flashrec.beam"):
            for (n, level, m, temp, *_), group in buckets.items():
                nodes = torch.cat([it[3] for it in group])
                trie = group[0][0].catalog.trie
                codes, child, valid = candidates(trie, level, nodes, layout.codebook_size, depth)
                b = len(group)
                res = expand(
                    torch.stack([it[1] for it in group]),
                    torch.stack([it[2] for it in group]),
                    codes.view(b, m, -1),
                    child.view(b, m, -1),
                    valid.view(b, m, -1),
                    n,
                    temp,
                    torch.cat([it[0].seed_t for it in group]) if temp > 0 else None,
                    level,
                )
                if level >= depth:
                    new_tok = torch.full_like(res.codes, layout.sid_end)
                else:
                    new_tok = res.codes + layout.level_range(level)[0]
                # the whole bucket's token histories and KV rows in a few batched ops (same n,
                # same level: equal shapes), then per-request views
                if group[0][0].tokens is None:
                    tokens = new_tok[:, :, None]
                else:
                    tokens = extend_histories([it[0] for it in group], res.parents, new_tok)
                    rows = torch.stack([it[0].rows for it in group])  # [b, n]
                    dst.append(rows.reshape(-1))
                    src.append(rows.gather(1, res.parents).reshape(-1))
                for i, it in enumerate(group):
                    st = it[0]
                    st.tokens, st.cum, st.nodes = tokens[i], res.cum[i], res.nodes[i]
                    if logged:
                        self.debug.log(st, level, phase, res.parents[i])
            if dst:
                self.kv.reorder(torch.cat(dst), torch.cat(src))
                hasher = self.debug.hasher
                if hasher is not None:
                    hasher.reorder(torch.cat(dst), torch.cat(src), self.kv.reorder_positions)

    def append_end(self, states: list[ReqState]) -> None:
        """<|sid_end|> after the last SID level (free under the level scope): one stack and one
        cat per token-history shape, not a fill and a cat per request."""
        for same in by_shape(states, lambda st: st.tokens.shape):
            toks = torch.stack([st.tokens for st in same])  # [b, n, g]
            toks = torch.cat([toks, toks.new_full((*toks.shape[:2], 1), self.layout.sid_end)], 2)
            for st, t in zip(same, toks):
                st.tokens = t
