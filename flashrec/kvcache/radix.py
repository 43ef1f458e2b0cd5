"""Token-level radix prefix cache over the prompt KV pool.

Each node holds a run of tokens and the pool slots of their KV. ``lock`` pins a path (ref
counts up to the root) while a request uses it; unreferenced leaves are evicted in LRU order
when the pool needs room, or when the cache holds more than ``max_nodes`` nodes (``trim``):
the pool bounds the cached tokens, ``max_nodes`` the host objects that index them (without
it, many short distinct prompts grow host memory until the whole pool is cached). Slots are
owned by the cache once inserted.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class Node:
    key: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    parent: Node | None = None
    children: dict[int, Node] = field(default_factory=dict)
    ref: int = 0
    tick: int = 0
    queued: bool = False  # has an entry in the cache's eviction heap


class RadixCache:
    """The cache; ``max_nodes`` (None: no cap) bounds the nodes beyond those that locked
    paths hold, enforced by ``trim``."""

    def __init__(self, max_nodes: int | None = None) -> None:
        if max_nodes is not None and max_nodes < 1:
            raise ValueError(f"max_nodes must be at least 1, got {max_nodes}")
        self.root = Node()
        self.root.ref = 1  # never evicted
        self.max_nodes = max_nodes
        self._clock = itertools.count(1)
        self.cached_tokens = 0
        self.num_nodes = 0  # the root not counted
        self._unreferenced = 0  # tokens in nodes with ref == 0 (evictable), kept incrementally
        # eviction candidates (tick when queued, sequence, node): every unreferenced leaf has
        # one entry (``Node.queued``); an entry whose node was touched since is re-queued
        # with its new tick when popped, one that is no longer an unreferenced leaf dropped,
        # so an eviction costs O(log n) instead of a walk of the whole tree
        self._heap: list[tuple[int, int, Node]] = []
        self._seq = itertools.count()

    def match(self, tokens: list[int]) -> tuple[list[int], Node]:
        """Longest cached prefix of ``tokens``: its slots and the node that ends it."""
        node, slots, i = self.root, [], 0
        tick = next(self._clock)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            n = _common(child.key, tokens[i:])
            if n < len(child.key):
                child = self._split(child, n)
            slots.extend(child.slots)
            child.tick = tick
            node, i = child, i + n
        return slots, node

    def insert(self, tokens: list[int], slots: list[int]) -> tuple[Node, list[int]]:
        """Insert ``tokens`` -> ``slots``. Returns the end node and the caller's slots that
        were NOT taken (their tokens were cached already; the caller still owns them)."""
        node, i, dup = self.root, 0, []
        tick = next(self._clock)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                new = Node(list(tokens[i:]), list(slots[i:]), node, tick=tick)
                node.children[tokens[i]] = new
                self.num_nodes += 1
                self.cached_tokens += len(new.key)
                self._unreferenced += len(new.key)
                self._offer(new)
                return new, dup
            n = _common(child.key, tokens[i:])
            if n < len(child.key):
                child = self._split(child, n)
            dup.extend(s for s, c in zip(slots[i : i + n], child.slots) if s != c)
            child.tick = tick
            node, i = child, i + n
        return node, dup

    def lock(self, node: Node, delta: int = 1) -> None:
        while node is not None:
            before = node.ref
            node.ref += delta
            if node.ref < 0:
                raise RuntimeError("radix node unlocked more often than locked")
            if before == 0 and node.ref > 0:
                self._unreferenced -= len(node.key)
            elif before > 0 and node.ref == 0:
                self._unreferenced += len(node.key)
                self._offer(node)
            node = node.parent

    def unlock(self, node: Node) -> None:
        self.lock(node, -1)

    @property
    def evictable_tokens(self) -> int:
        return self._unreferenced

    def evict(self, num_tokens: int) -> list[int]:
        """Free at least ``num_tokens`` slots from unreferenced leaves (LRU first) if possible."""
        freed: list[int] = []
        while len(freed) < num_tokens and self._evict_one(freed):
            pass
        return freed

    def trim(self) -> list[int]:
        """Evict unreferenced leaves (LRU first) while more than ``max_nodes`` nodes are
        cached; returns their slots (the caller frees them in the pool)."""
        freed: list[int] = []
        if self.max_nodes is None:
            return freed
        while self.num_nodes > self.max_nodes and self._evict_one(freed):
            pass
        return freed

    def flush(self) -> list[int]:
        """Drop every unreferenced node; returns their slots."""
        return self.evict(1 << 62)

    def _evictable_leaf(self, n: Node) -> bool:
        return n is not self.root and not n.children and n.ref == 0

    def _offer(self, n: Node) -> None:
        """Queue ``n`` for eviction if it is an unreferenced leaf not queued yet."""
        if not n.queued and self._evictable_leaf(n):
            n.queued = True
            heapq.heappush(self._heap, (n.tick, next(self._seq), n))

    def _evict_one(self, freed: list[int]) -> bool:
        """Remove the least recently used unreferenced leaf, its slots appended to
        ``freed``; False when there is none."""
        heap = self._heap
        while heap:
            tick, _, leaf = heapq.heappop(heap)
            leaf.queued = False
            if not self._evictable_leaf(leaf):
                continue  # locked or grown children since: queued again when evictable
            if tick != leaf.tick:
                self._offer(leaf)  # touched since it was queued: back in at its new tick
                continue
            parent = leaf.parent
            freed.extend(leaf.slots)
            self._remove(leaf)
            self._offer(parent)
            return True
        return False

    def _remove(self, leaf: Node) -> None:
        del leaf.parent.children[leaf.key[0]]
        self.num_nodes -= 1
        self.cached_tokens -= len(leaf.key)
        self._unreferenced -= len(leaf.key)

    def _split(self, child: Node, n: int) -> Node:
        """Split ``child`` after n tokens; returns the new upper node."""
        upper = Node(child.key[:n], child.slots[:n], child.parent, ref=child.ref, tick=child.tick)
        child.parent.children[child.key[0]] = upper
        child.key, child.slots, child.parent = child.key[n:], child.slots[n:], upper
        upper.children[child.key[0]] = child
        self.num_nodes += 1
        return upper

    def _nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())


def _common(a: list[int], b: list[int]) -> int:
    """Length of the common prefix: slice comparisons run in C (binary search on mismatch)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
