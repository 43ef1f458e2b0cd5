"""One beam-search step: exact global top-n over (beam x catalog-valid next token).

NOTE on ordering: candidates are laid out parent-major with codes ascending inside each
parent (the trie's CSR order), and selected with a *stable* descending sort, so ties are
broken by the lowest (parent beam, token id) and results are reproducible bit for bit.
Dead beams carry cum = -inf; every state has a fixed row count (the request's n) so the
step is shape-static.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepResult:
    parents: torch.Tensor  # [n] parent row of each new row
    codes: torch.Tensor  # [n] chosen code (index into the level's logprob columns)
    nodes: torch.Tensor  # [n] trie node at the next level
    cum: torch.Tensor  # [n] cumulative logprob (without sampling noise); -inf = dead


def gumbel_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    e = -torch.log(u.clamp_min(1e-20))  # Exp(1)
    return -torch.log(e.clamp_min(1e-20))


def expand(
    cum: torch.Tensor,
    logprobs: torch.Tensor,
    cand_codes: torch.Tensor,
    cand_nodes: torch.Tensor,
    cand_valid: torch.Tensor,
    n: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> StepResult:
    """Batched over B requests with the same n and level:
    cum [B, m], logprobs [B, m, K], cand_* [B, m, F] -> top ``n`` children, each [B, n].

    If m * F < n the result is padded with dead rows (cum = -inf). ``parents`` index rows
    within each request."""
    b, m, f = cand_codes.shape
    lp = logprobs.gather(2, cand_codes)
    total = (cum[:, :, None] + lp).masked_fill(~cand_valid, float("-inf")).reshape(b, m * f)
    key = total
    if temperature > 0:
        key = total / temperature + gumbel_like(total, generator)
        key = key.masked_fill(torch.isinf(total), float("-inf"))
    res = top_n(total, cand_codes, cand_nodes, n, f, key)
    take = res.parents.shape[1]
    if take < n:
        pad = n - take
        z = torch.zeros(b, pad, dtype=torch.long, device=cum.device)
        res = StepResult(
            torch.cat([res.parents, z], 1),
            torch.cat([res.codes, z], 1),
            torch.cat([res.nodes, z], 1),
            torch.cat([res.cum, torch.full((b, pad), float("-inf"), device=cum.device)], 1),
        )
    return res


def top_n(
    total: torch.Tensor,
    cand_codes: torch.Tensor,
    cand_nodes: torch.Tensor,
    n: int,
    f: int,
    key: torch.Tensor | None = None,
) -> StepResult:
    """The ``n`` best of ``B`` requests' candidates: ``total [B, m * F]`` (cumulative logprobs,
    parent-major), ``cand_codes`` / ``cand_nodes`` with ``B * m * F`` elements, ranked by
    ``key`` (default ``total``) in ONE stable descending sort, so ties fall to the lowest
    (parent, code). Returns ``[B, min(n, m * F)]`` tensors. Graph-safe: no host reads, shapes
    from the arguments' shapes only. The eager expansion and the static step both select
    here."""
    b = total.shape[0]
    order = torch.sort(total if key is None else key, dim=1, descending=True, stable=True)
    order = order.indices[:, :n]
    return StepResult(
        torch.div(order, f, rounding_mode="floor"),
        cand_codes.reshape(b, -1).gather(1, order),
        cand_nodes.reshape(b, -1).gather(1, order),
        total.gather(1, order),
    )


def candidates(
    trie, level: int, nodes: torch.Tensor, codebook_size: int, depth: int, fanout: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Allowed next codes of beam rows at trie ``nodes [R]`` of ``level``: ``codes``,
    ``child_nodes`` and ``valid``, each ``[R, F]`` (invalid slots never win a top-n).

    - ``level >= depth``: the end token, one candidate (code 0, node 0) per row;
    - ``trie`` None: every code of the level (unconstrained, smoke-only);
    - ``fanout`` (the static step): nodes are clamped into the level first (rows at another
      level hold other ids; their candidates are discarded) and the slots padded to
      ``fanout``, so every level has one shape.

    Branches on Python values only: graph-safe. The eager and static paths both call it."""
    m = nodes.shape[0]
    if level >= depth:
        z = torch.zeros(m, 1, dtype=torch.long, device=nodes.device)
        return z, z, torch.ones(m, 1, dtype=torch.bool, device=nodes.device)
    if trie is None:
        return unconstrained_candidates(m, codebook_size, nodes.device)
    if fanout is None:
        return trie.candidates(level, nodes)
    codes, child, valid = trie.candidates(level, nodes.clamp(0, trie.num_nodes(level) - 1))
    pad = fanout - codes.shape[1]
    if pad:
        codes = torch.nn.functional.pad(codes, (0, pad))
        child = torch.nn.functional.pad(child, (0, pad))
        valid = torch.nn.functional.pad(valid, (0, pad), value=False)
    return codes, child, valid


def unconstrained_candidates(
    m: int, k: int, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every code of a K-code level is allowed (no catalog: smoke-only decoding)."""
    codes = torch.arange(k, device=device).expand(m, k)
    return codes, torch.zeros_like(codes), torch.ones(m, k, dtype=torch.bool, device=device)


def sequence_scores(cum: torch.Tensor, gen_len: int, length_penalty: float) -> torch.Tensor:
    return cum / (float(gen_len) ** length_penalty)
