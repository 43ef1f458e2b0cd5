"""Prompts of a workload with users (``workload.users``): histories that grow.

Each of the U users starts from a history of its own (the workload's synthetic or lorem
prompt number ``u``: same lengths, same system prompt). Request ``i`` goes to user
``order[i]`` (round-robin, or seeded random) and carries that user's previous request's
history plus ``user_items`` new items, so a user's requests share a prefix that grows by a few
items each time::

    user u, its 1st request:  [system] base_u + items_u[0:k]
            its 2nd request:  [system] base_u + items_u[0:2k]       (the 1st one's text + k)

The warm-up requests are those of U further users, so priming the cache never touches the
measured users' histories. Everything is a function of the workload's seed.
"""

from __future__ import annotations

import random

import numpy as np

_ACTIONS = ("watched", "clicked", "liked", "shared", "bought", "saved")
_TAGS = "music travel cooking comedy sports news gaming fashion pets science dance tech".split()


def user_order(num: int, users: int, order: str, seed: int) -> list[int]:
    """The user of each of ``num`` requests: ``0, 1, .., U-1, 0, ..`` or seeded random."""
    if order == "round_robin":
        return [i % users for i in range(num)]
    rng = random.Random(seed * 1_000_003 + users)
    return [rng.randrange(users) for _ in range(num)]


def new_item(seed: int, user: int, j: int) -> str:
    """The ``j``-th item a user's history gains (a function of seed, user and j)."""
    rng = np.random.default_rng([seed, 0x5553, user, j])
    action = _ACTIONS[int(rng.integers(len(_ACTIONS)))]
    tag = _TAGS[int(rng.integers(len(_TAGS)))]
    return f"; {action} item {int(rng.integers(0, 1_000_000))} ({tag})"


def grow(bases: list[list[dict]], order: list[int], items: int, seed: int, first: int = 0):
    """One chat per entry of ``order``: user ``first + u``'s base chat (``bases[u]``) with
    its history grown by ``items`` new items at each of its requests."""
    seen = [0] * len(bases)
    out = []
    for u in order:
        seen[u] += 1
        *head, user = bases[u]
        extra = "".join(new_item(seed, first + u, j) for j in range(seen[u] * items))
        out.append([*head, {**user, "content": user["content"] + extra}])
    return out


def user_chats(make_bases, num: int, warmup: int, users: int, items: int, order: str, seed: int):
    """The measured and the warm-up chats of a user workload. ``make_bases(n)`` gives the
    base chats of ``n`` users (the workload's own prompts 0..n-1); the warm-up uses users
    ``U..2U-1``, round-robin."""
    bases = make_bases(2 * users)
    measured = grow(bases[:users], user_order(num, users, order, seed), items, seed)
    warm = grow(bases[users:], user_order(warmup, users, "round_robin", seed), items, seed, users)
    return measured, warm
