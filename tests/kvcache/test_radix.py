"""Radix prefix cache: matching, splitting, ref counts, LRU eviction, token accounting."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from flashrec.kvcache.radix import RadixCache


def _walk_unreferenced(c: RadixCache) -> int:
    return sum(len(n.key) for n in c._nodes() if n.ref == 0)  # noqa: SLF001


def test_match_insert_split_and_dups():
    c = RadixCache()
    n1, dup = c.insert([1, 2, 3, 4], [10, 11, 12, 13])
    assert dup == []
    slots, node = c.match([1, 2, 9])
    assert slots == [10, 11]  # the node got split after two tokens
    n2, dup = c.insert([1, 2, 3, 5], [10, 11, 20, 21])
    assert dup == [20]  # token 3 was cached under slot 12 already: the caller keeps 20
    assert c.match([1, 2, 3, 5, 6])[0] == [10, 11, 12, 21]
    assert c.cached_tokens == 5


def test_locked_paths_are_not_evicted_and_lru_order():
    c = RadixCache()
    a, _ = c.insert([1, 2, 3], [0, 1, 2])
    b, _ = c.insert([7, 8], [3, 4])
    c.lock(a)
    assert c.evictable_tokens == 2
    assert sorted(c.evict(100)) == [3, 4]
    assert c.match([1, 2, 3])[0] == [0, 1, 2]
    c.unlock(a)
    assert c.evictable_tokens == 3
    c.insert([5], [9])
    c.match([5])  # touch: [5] is now more recent than [1,2,3]
    assert c.evict(1) == [0, 1, 2]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=25),
    st.integers(0, 10**6),
)
def test_accounting_matches_a_full_walk(prompts, seed):
    rng = random.Random(seed)
    c = RadixCache()
    nxt = 0
    held = []
    for p in prompts:
        slots, node = c.match(p)
        new = list(range(nxt, nxt + len(p) - len(slots)))
        nxt += len(new)
        end, _ = c.insert(p, slots + new)
        c.lock(end)
        held.append(end)
        if held and rng.random() < 0.5:
            c.unlock(held.pop(rng.randrange(len(held))))
        if rng.random() < 0.3:
            c.evict(rng.randint(0, 5))
        assert c.evictable_tokens == _walk_unreferenced(c) - 0  # root has no tokens
        assert c.cached_tokens == sum(len(n.key) for n in c._nodes())  # noqa: SLF001
    for h in held:
        c.unlock(h)
    c.flush()
    assert c.cached_tokens == 0 and c.evictable_tokens == 0
