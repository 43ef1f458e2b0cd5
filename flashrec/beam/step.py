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
- the top-n is one stable descending sort per request, as in ``flashrec.beam.search.expand``,
  so ties fall to the lowest (parent, code) exactly as there: the alive beams are the same.

Dead rows (cum = -inf) may take different (parent, code) pairs than the eager expansion, since
padding changes the index of -inf candidates; they are never reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashrec.beam.search import unconstrained_candidates


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

    def _candidates(self, level: int, nodes: torch.Tensor):
        """[R, F] codes / child nodes / valid of ``level``, padded to ``self.fanout``."""
        r = nodes.shape[0]
        if self.trie is None:
            return unconstrained_candidates(r, self.k, nodes.device)
        top = self.trie.num_nodes(level) - 1  # rows at another level may hold larger ids
        codes, child, valid = self.trie.candidates(level, nodes.clamp(0, top))
        pad = self.fanout - codes.shape[1]
        if pad:
            codes = torch.nn.functional.pad(codes, (0, pad))
            child = torch.nn.functional.pad(child, (0, pad))
            valid = torch.nn.functional.pad(valid, (0, pad), value=False)
        return codes, child, valid

    def run(
        self, h: torch.Tensor, levels: torch.Tensor, cum: torch.Tensor, nodes: torch.Tensor
    ) -> StaticStepOut:
        """h [B*n, H] hidden states of the rows, levels [B] (each in 1..depth-1), cum and
        nodes [B, n] -> the next beams of every request."""
        b, n = cum.shape
        row_level = levels[:, None].expand(b, n).reshape(-1)
        flat_nodes = nodes.reshape(-1)
        codes = child = valid = lp = None
        for level in self.levels:
            c, ch, v = self._candidates(level, flat_nodes)
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
        order = torch.sort(total, dim=1, descending=True, stable=True).indices[:, :n]
        parents = torch.div(order, f, rounding_mode="floor")
        chosen = codes.reshape(b, n * f).gather(1, order)
        return StaticStepOut(
            parents,
            chosen + self.offsets[levels][:, None],
            child.reshape(b, n * f).gather(1, order),
            total.gather(1, order),
        )


def reorder_rows(kv, rows: torch.Tensor, parents: torch.Tensor) -> None:
    """Decode KV of every request's rows ``rows [B*n]`` becomes that of their parents
    (``parents [B, n]``, within the request): one gather and one scatter, static shapes."""
    b, n = parents.shape
    src = rows.view(b, n).gather(1, parents).reshape(-1)
    kv.reorder(rows, src)
