"""The scheduler's per-request state and the small helpers its managers share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from flashrec.engine.request import GenRequest, GenResult
from flashrec.kvcache.radix import Node

if TYPE_CHECKING:
    from flashrec.sid.version import CatalogVersion

Finished = list[tuple[GenRequest, GenResult | Exception]]  # what a step hands back


@dataclass(eq=False)
class ReqState:
    """One admitted request: its prompt KV (``prompt_slots``: cached prefix + ``private_slots``),
    its beam rows (``rows`` on the device, ``rows_np`` on the host) and its beams: token
    histories ``tokens [n, g]``, cumulative logprobs ``cum [n]`` and trie ``nodes [n]``."""

    req: GenRequest
    target_len: int
    prompt_slots: list[int] = field(default_factory=list)
    private_slots: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    node: Node | None = None
    rows: torch.Tensor | None = None
    tokens: torch.Tensor | None = None  # [n, g] generated token ids
    cum: torch.Tensor | None = None
    nodes: torch.Tensor | None = None
    # [1] int64 on the device: the sampling noise's seed (the request's, else drawn at admission)
    seed_t: torch.Tensor | None = None
    prompt_slots_t: torch.Tensor | None = None
    prompt_slots_np: np.ndarray | None = None
    rows_np: np.ndarray | None = None
    step_inputs: tuple[str, str] | None = None  # debug step hash: (inputs, raw kv) of this step
    admitted_at: float = 0.0  # time.monotonic() at admission
    # the catalog active at admission: the request expands with its trie to the end, whatever
    # catalog is swapped in meanwhile
    catalog: CatalogVersion | None = None

    @property
    def generated(self) -> int:
        return 0 if self.tokens is None else self.tokens.shape[1]

    @property
    def done(self) -> bool:
        return self.generated >= self.target_len


@dataclass
class SchedulerStats:
    steps_total: int = 0
    prompt_tokens_total: int = 0
    prefix_hit_tokens_total: int = 0
    batch_failures_total: int = 0
    # decode batches that could have run as the static step but hold a request of another
    # catalog than the one the step was built for (after a catalog swap): eager instead
    other_catalog_steps_total: int = 0


def extend_histories(states: list[ReqState], parents, new_tok) -> torch.Tensor:
    """[b, n, g + 1]: each state's token history [n, g] reordered by its ``parents`` [n], then
    its new tokens ``new_tok`` [n] (states of equal history shape, batched)."""
    prev = torch.stack([st.tokens for st in states])  # [b, n, g]
    par = parents[:, :, None].expand(-1, -1, prev.shape[2])
    return torch.cat([prev.gather(1, par), new_tok[:, :, None]], dim=2)


def by_shape(items, key) -> list[list]:
    """``items`` grouped by ``key(item)`` (first-seen order), for batched tensor ops."""
    groups: dict = {}
    for it in items:
        groups.setdefault(tuple(key(it)), []).append(it)
    return list(groups.values())
