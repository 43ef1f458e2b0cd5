"""Token-level radix prefix cache over the prompt KV pool.

Each node holds a run of tokens and the pool slots of their KV. ``lock`` pins a path (ref
counts up to the root) while a request uses it; unreferenced leaves are evicted in LRU order
when the pool needs room. Slots are owned by the cache once inserted.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    key: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    parent: Node | None = None
    children: dict[int, Node] = field(default_factory=dict)
    ref: int = 0
    tick: int = 0


class RadixCache:
    def __init__(self) -> None:
        self.root = Node()
        self.root.ref = 1  # never evicted
        self._clock = itertools.count(1)
        self.cached_tokens = 0
        self._unreferenced = 0  # tokens in nodes with ref == 0 (evictable), kept incrementally

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
                self.cached_tokens += len(new.key)
                self._unreferenced += len(new.key)
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
            node = node.parent

    def unlock(self, node: Node) -> None:
        self.lock(node, -1)

    @property
    def evictable_tokens(self) -> int:
        return self._unreferenced

    def evict(self, num_tokens: int) -> list[int]:
        """Free at least ``num_tokens`` slots from unreferenced leaves (LRU first) if possible."""
        freed: list[int] = []
        heap = [(n.tick, id(n), n) for n in self._nodes() if self._evictable_leaf(n)]
        heapq.heapify(heap)
        while heap and len(freed) < num_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            freed.extend(leaf.slots)
            self._remove(leaf)
            if self._evictable_leaf(parent):
                heapq.heappush(heap, (parent.tick, id(parent), parent))
        return freed

    def _evictable_leaf(self, n: Node) -> bool:
        return n is not self.root and not n.children and n.ref == 0

    def flush(self) -> list[int]:
        """Drop every unreferenced node; returns their slots."""
        return self.evict(1 << 62)

    def _remove(self, leaf: Node) -> None:
        del leaf.parent.children[leaf.key[0]]
        self.cached_tokens -= len(leaf.key)
        self._unreferenced -= len(leaf.key)

    def _split(self, child: Node, n: int) -> Node:
        """Split ``child`` after n tokens; returns the new upper node."""
        upper = Node(child.key[:n], child.slots[:n], child.parent, ref=child.ref, tick=child.tick)
        child.parent.children[child.key[0]] = upper
        child.key, child.slots, child.parent = child.key[n:], child.slots[n:], upper
        upper.children[child.key[0]] = child
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
