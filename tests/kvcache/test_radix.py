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


def _serve(c: RadixCache, prompt: list[int], nxt: int) -> tuple[list[int], int]:
    """One request as the scheduler runs it: match, new slots for the rest, insert, lock the
    end node, trim to the node cap, unlock. Returns the slots the cache gave back and ``nxt``."""
    slots, _ = c.match(prompt)
    new = list(range(nxt, nxt + len(prompt) - len(slots)))
    end, dup = c.insert(prompt, slots + new)
    c.lock(end)
    freed = c.trim() + dup
    c.unlock(end)
    return freed, nxt + len(new)


def test_node_cap_bounds_many_distinct_prompts():
    """Distinct short prompts (a shared template, a counter) once grew the cache by a node
    each until the whole KV pool was cached; ``max_nodes`` keeps the most recent ones."""
    cap = 8
    c = RadixCache(max_nodes=cap)
    template = [100, 101, 102, 103]
    freed: list[int] = []
    nxt = 0
    for i in range(300):
        got, nxt = _serve(c, [*template, 1000 + i, 2000 + i, 7], nxt)
        freed += got
        assert c.num_nodes <= cap
    walk = [n for n in c._nodes() if n is not c.root]  # noqa: SLF001
    assert len(walk) == c.num_nodes <= cap
    assert c.cached_tokens == sum(len(n.key) for n in walk) == c.evictable_tokens
    cached = [s for n in walk for s in n.slots]
    # every slot handed out is either still cached or given back, never both, never lost
    assert sorted(cached + freed) == list(range(nxt))
    assert c.match([*template, 1000 + 299, 2000 + 299, 7])[0] != []  # the latest is kept
    assert len(c.match([*template, 1000, 2000, 7])[0]) == len(template)  # the first is not


def test_node_cap_keeps_locked_paths():
    """Nodes that running requests hold are never trimmed: the cap counts them, and the
    cache returns under it once they are released."""
    c = RadixCache(max_nodes=2)
    ends = []
    for i in range(5):
        end, _ = c.insert([i, 50 + i], [2 * i, 2 * i + 1])
        c.lock(end)
        ends.append(end)
    assert c.trim() == [] and c.num_nodes == 5
    for end in ends:
        c.unlock(end)
    assert sorted(c.trim()) == [0, 1, 2, 3, 4, 5]  # the three least recently used
    assert c.num_nodes == 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["insert", "touch", "evict", "unlock"]),
            st.lists(st.integers(0, 3), min_size=1, max_size=6),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(0, 10**6),
)
def test_eviction_takes_the_least_recently_used_leaf(ops, seed):
    """The eviction queue evicts what a walk of the whole tree would (the unreferenced leaf
    touched least recently), and holds one entry per unreferenced leaf at most."""
    rng = random.Random(seed)
    c = RadixCache()
    nxt, held = 0, []
    for op, p in ops:
        if op == "insert":
            slots, _ = c.match(p)
            new = list(range(nxt, nxt + len(p) - len(slots)))
            nxt += len(new)
            end, _ = c.insert(p, slots + new)
            if rng.random() < 0.5:
                c.lock(end)
                held.append(end)
        elif op == "touch":
            c.match(p)
        elif op == "unlock" and held:
            c.unlock(held.pop(rng.randrange(len(held))))
        elif op == "evict":
            leaves = [n for n in c._nodes() if c._evictable_leaf(n)]  # noqa: SLF001
            oldest = min((n.tick for n in leaves), default=None)
            want = [n.slots for n in leaves if n.tick == oldest]
            got = c.evict(1)
            assert (got in want) if leaves else got == []
        nodes = list(c._nodes())  # noqa: SLF001
        assert c.num_nodes == len(nodes) - 1
        assert all(n.queued for n in nodes if c._evictable_leaf(n))  # noqa: SLF001
        assert len(c._heap) <= c.num_nodes  # noqa: SLF001
