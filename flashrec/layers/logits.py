"""Restricted LM head: multiply only the LM-head rows a step needs.

Scopes (``--logprob-scope``):
  level  log_softmax over the current level's codes (K rows; the end step is 1 row -> 0)
  sid    log_softmax over the whole SID range (all codebooks + begin/end)
  full   log_softmax over the full vocabulary (HF semantics)
The trie mask is applied by the beam search after this normalisation (never renormalised).
"""

from __future__ import annotations

import torch

from flashrec.kernels import invariant
from flashrec.sid.layout import SidLayout


class RestrictedLMHead:
    def __init__(self, weight: torch.Tensor, layout: SidLayout, scope: str) -> None:
        if scope not in ("level", "sid", "full"):
            raise ValueError(f"unknown logprob scope {scope!r}; known: level, sid, full")
        self.weight = weight
        self.layout = layout
        self.scope = scope
        lo, hi = layout.sid_range
        self._sid_lo = lo
        self._sid = weight[lo:hi]  # contiguous rows: a view, no copy
        self._levels = [
            weight[a:b] for a, b in (layout.level_range(i) for i in range(layout.num_levels))
        ]

    @property
    def end_step_is_free(self) -> bool:
        """Under the level scope the end token is the only choice: its logprob is exactly 0."""
        return self.scope == "level"

    def _normalised(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if invariant.active():  # --deterministic decode: the same bits whatever the batch
            logits = invariant.matmul_nt(hidden, rows)
        else:
            logits = torch.matmul(hidden, rows.t())
        return torch.log_softmax(logits.float(), dim=-1)

    def level_logprobs(self, hidden: torch.Tensor, level: int) -> torch.Tensor:
        """[m, H] -> [m, K] float32 logprobs of level ``level``'s codes under the scope."""
        if self.scope == "level":
            return self._normalised(hidden, self._levels[level])
        a, b = self.layout.level_range(level)
        if self.scope == "sid":
            return self._normalised(hidden, self._sid)[:, a - self._sid_lo : b - self._sid_lo]
        return self._normalised(hidden, self.weight)[:, a:b]

    def end_logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        """[m, H] -> [m, 1] float32 logprob of <|sid_end|> under the scope."""
        end = self.layout.sid_end
        if self.scope == "level":
            return torch.zeros(hidden.shape[0], 1, dtype=torch.float32, device=hidden.device)
        if self.scope == "sid":
            return self._normalised(hidden, self._sid)[
                :, end - self._sid_lo : end - self._sid_lo + 1
            ]
        return self._normalised(hidden, self.weight)[:, end : end + 1]
