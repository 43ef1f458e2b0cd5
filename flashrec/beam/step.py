"""The decode step after the model forward, with static shapes: restricted LM head, trie mask,
exact top-n, beam expansion and the parent gather of the decode KV, for ``B`` requests of the
same width ``n`` that may sit at different SID levels.

This is the body the CUDA-graph runner captures after the model forward (one replay per step:
``--enable-step-graph``), and what runs eagerly on CPU with the same switch. Nothing here reads
a tensor value on the host, branches on one, or allocates a shape that depends on one:

- every decode level's LM-head product runs over all rows, and each row keeps its own level's
  (levels differ per request under continuous batching; an LM head is ~1% of a 1.7B forward);
- every level's trie candidates are padded to the widest fan-out over the decode levels
  (padding slots are invalid, so they never win);
- candidates and the top-n are those of the eager expansion (``flashrec.beam.search``:
  ``candidates``, ``top_n``: one stable descending sort per request), so ties fall to the
  lowest (parent, code) exactly as there: the alive beams are the same.

Dead rows (cum = -inf) may take different (parent, code) pairs than the eager expansion, since
padding changes the index of -inf candidates; they are never reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashrec.beam.search import candidates, sampling_key, top_n


@dataclass
class StaticStepOut:
    parents: torch.Tensor  # [B, n] parent row within the request
    tokens: torch.Tensor  # [B, n] chosen token ids
    nodes: torch.Tensor  # [B, n] trie node at the next level
    cum: torch.Tensor  # [B, n] cumulative logprob; -inf = dead


class StaticStep:
    """``run(h, levels, cum, nodes)`` for a fixed beam width over decode levels 1..depth-1."""

    def __init__(self, lm_head, trie, layout, depth: int, device) -> None:
        self.lm_head = lm_head
        self.trie = trie
        self.depth = depth
        self.levels = list(range(1, depth))  # level 0 is expanded after the prefill
        k = layout.codebook_size
        if trie is None:
            self.fanout = k
        else:
            self.fanout = max(trie.max_fanout[lv] for lv in self.levels) if self.levels else 1
        self.k = k
        offsets = [layout.level_range(lv)[0] for lv in range(max(depth, 1))]
        self.offsets = torch.tensor(offsets, dtype=torch.long, device=device)

    @property
    def usable(self) -> bool:
        """False for a one-level catalog (no decode level before the end token)."""
        return bool(self.levels)

    def run(
        self,
        h: torch.Tensor,
        levels: torch.Tensor,
        cum: torch.Tensor,
        nodes: torch.Tensor,
        temps: torch.Tensor | None = None,
        seeds: torch.Tensor | None = None,
    ) -> StaticStepOut:
        """h [B*n, H] hidden states of the rows, levels [B] (each in 1..depth-1), cum and
        nodes [B, n] -> the next beams of every request. ``temps`` / ``seeds [B]``: Gumbel
        top-k for the requests with a temperature > 0 (the eager expansion's noise), greedy
        for those at 0; None: all greedy."""
        b, n = cum.shape
        row_level = levels[:, None].expand(b, n).reshape(-1)
        flat_nodes = nodes.reshape(-1)
        codes = child = valid = lp = None
        for level in self.levels:
            c, ch, v = candidates(self.trie, level, flat_nodes, self.k, self.depth, self.fanout)
            score = self.lm_head.level_logprobs(h, level).gather(1, c)
            if codes is None:
                codes, child, valid, lp = c, ch, v, score
                continue
            here = (row_level == level)[:, None]
            codes = torch.where(here, c, codes)
            child = torch.where(here, ch, child)
            valid = torch.where(here, v, valid)
            lp = torch.where(here, score, lp)
        f = codes.shape[1]
        total = (cum.reshape(-1, 1) + lp).masked_fill(~valid, float("-inf")).reshape(b, n * f)
        key = None
        if temps is not None:
            parents = torch.arange(n, device=cum.device).view(1, n, 1)
            key = sampling_key(total, temps, seeds, levels, parents, codes.view(b, n, f))
        best = top_n(total, codes, child, n, f, key)
        return StaticStepOut(
            best.parents, best.codes + self.offsets[levels][:, None], best.nodes, best.cum
        )


def reorder_rows(kv, rows: torch.Tensor, parents: torch.Tensor) -> None:
    """Decode KV of every request's rows ``rows [B*n]`` becomes that of their parents
    (``parents [B, n]``, within the request): one gather and one scatter, static shapes."""
    b, n = parents.shape
    src = rows.view(b, n).gather(1, parents).reshape(-1)
    kv.reorder(rows, src)
