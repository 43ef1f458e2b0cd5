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


def _u64(x: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return x - (1 << 64) if x >= 1 << 63 else x


_MIX = (_u64(0x9E3779B97F4A7C15), _u64(0xBF58476D1CE4E5B9), _u64(0x94D049BB133111EB))
_SEED_MUL = _u64(0xD1B54A32D192ED03)
_LEVEL_MUL = _u64(0xABC98388FB8FAC03)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch shifts signed integers arithmetically)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _on_device(x, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``x`` (a tensor, or a Python number) as a tensor of ``dtype`` on ``device``; a number by a
    fill there (``as_tensor`` would copy it from the host and wait for the stream)."""
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype)
    return torch.full((), x, dtype=dtype, device=device)


def gumbel_noise(seeds: torch.Tensor, level, parents: torch.Tensor, codes: torch.Tensor):
    """Gumbel(0, 1) noise of each candidate (``parents``, ``codes``: parent row within the
    request and level-local code, ``[B, ...]``) of requests with ``seeds [B]`` (int64) at SID
    ``level`` (an int or a ``[B]`` tensor): a counter-based hash (splitmix64's finalizer) of
    (seed, level, parent, code), so a candidate's noise never depends on the batch, the
    candidate layout or an RNG state, and a step graph can compute it."""
    shape = (-1,) + (1,) * (codes.dim() - 1)
    # a tensor either way, so the products below wrap in int64
    lv = _on_device(level, torch.long, seeds.device)
    lv = lv.view(shape) if lv.dim() else lv
    x = seeds.view(shape) * _SEED_MUL + (lv + 1) * _LEVEL_MUL
    x = x + parents * 0x100000 + codes + _MIX[0]
    x = (x ^ _shr(x, 30)) * _MIX[1]
    x = (x ^ _shr(x, 27)) * _MIX[2]
    x = x ^ _shr(x, 31)
    u = (_shr(x, 40).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # 24 bits, in (0, 1)
    return -torch.log(-torch.log(u))


def sampling_key(total, temperature, seeds, level, parents, codes):
    """The Gumbel top-k key: ``total / T + noise`` where ``T`` (per request, ``[B]``, or one
    float) is > 0, ``total`` itself where it is 0; -inf stays -inf (never chosen)."""
    t = _on_device(temperature, torch.float32, total.device).view(-1, 1)
    noise = gumbel_noise(seeds, level, parents, codes).reshape(total.shape)
    key = torch.where(t > 0, total / t.clamp_min(1e-6) + noise, total)
    return key.masked_fill(torch.isinf(total), float("-inf"))


def expand(
    cum: torch.Tensor,
    logprobs: torch.Tensor,
    cand_codes: torch.Tensor,
    cand_nodes: torch.Tensor,
    cand_valid: torch.Tensor,
    n: int,
    temperature: float = 0.0,
    seeds: torch.Tensor | None = None,
    level: int = 0,
) -> StepResult:
    """Batched over B requests with the same n and level:
    cum [B, m], logprobs [B, m, K], cand_* [B, m, F] -> top ``n`` children, each [B, n].
    ``temperature`` > 0: Gumbel top-k with each request's noise from its ``seeds [B]`` at
    ``level`` (:func:`gumbel_noise`); scores stay noise-free.

    If m * F < n the result is padded with dead rows (cum = -inf). ``parents`` index rows
    within each request."""
    b, m, f = cand_codes.shape
    lp = logprobs.gather(2, cand_codes)
    total = (cum[:, :, None] + lp).masked_fill(~cand_valid, float("-inf")).reshape(b, m * f)
    key = total
    if temperature > 0:
        if seeds is None:
            raise ValueError("sampling (temperature > 0) needs the requests' seeds")
        parents = torch.arange(m, device=cum.device).view(1, m, 1)
        key = sampling_key(total, temperature, seeds, level, parents, cand_codes)
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
