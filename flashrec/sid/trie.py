"""The catalog as a tensor trie: the constraint of SID beam search.

Level ``l`` of the trie holds the nodes reached after ``l`` codes: level 0 is the root, the
nodes of level ``l + 1`` are the distinct SID prefixes of length ``l + 1`` in sorted order.
Each level is stored CSR-style::

    ptr[l]   [num_nodes(l) + 1]   edges of node n are ptr[l][n] .. ptr[l][n+1]-1
    child[l] [num_nodes(l + 1)]   code of each edge, ascending within a node

NOTE: edge ``e`` of level ``l`` *is* node ``e`` of level ``l + 1``; no child-id array is
needed. At the last level the node id is the leaf id: the rank of the SID in sorted order,
i.e. its row in ``Catalog.codes``.

Beam search holds one trie node per beam row and asks ``candidates`` (sparse, ``F`` = max
fan-out slots) or ``valid_mask`` (dense ``[R, K]``); both are pure tensor ops with static shapes,
safe inside a captured CUDA graph. An unconstrained search passes no trie (``trie=None``):
the full ``K^depth`` tree is never materialised.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from flashrec.sid.catalog import unique_rows


class SidTrie:
    """CSR trie over SIDs ``codes [N, depth]`` with codes in ``[0, codebook_size)``.

    ``valid_mask`` reads a precomputed dense ``[num_nodes, K]`` bool table on levels where
    ``num_nodes * K <= dense_limit`` and scatters from ``candidates`` elsewhere.
    """

    def __init__(
        self,
        codes: np.ndarray | torch.Tensor,
        codebook_size: int,
        device: str | torch.device = "cpu",
        dense_limit: int = 1 << 24,
    ) -> None:
        if isinstance(codes, torch.Tensor):
            codes = codes.detach().cpu().numpy()
        codes = np.asarray(codes, dtype=np.int64)
        if codes.ndim != 2 or codes.shape[0] == 0 or codes.shape[1] == 0:
            raise ValueError(f"SidTrie needs a non-empty [N, depth] code array, got {codes.shape}")
        if codebook_size < 1 or codes.min() < 0 or codes.max() >= codebook_size:
            raise ValueError(
                f"codes span [{codes.min()}, {codes.max()}], outside [0, {codebook_size})"
            )
        self.codebook_size = int(codebook_size)
        self.depth = int(codes.shape[1])
        self.dense_limit = int(dense_limit)
        self.device = torch.device(device)
        ptrs, childs = _build_csr(unique_rows(codes)[0])
        self.max_fanout = [int(np.diff(p).max()) for p in ptrs]
        self.ptr = [torch.from_numpy(p).to(self.device) for p in ptrs]
        self.child = [torch.from_numpy(c).to(self.device) for c in childs]
        self._derive()

    def _derive(self) -> None:
        """Tensors computed from ``ptr``/``child`` on ``self.device``."""
        k = self.codebook_size
        self._slots = [torch.arange(f, device=self.device) for f in self.max_fanout]
        # Sorted (parent * K + code) per level: a binary-searchable key of every edge.
        self._edge_key = [
            torch.repeat_interleave(torch.arange(len(p) - 1, device=self.device), p.diff()) * k + c
            for p, c in zip(self.ptr, self.child)
        ]
        self._dense: list[torch.Tensor | None] = []
        for level in range(self.depth):
            n = self.num_nodes(level)
            if n * k > self.dense_limit:
                self._dense.append(None)
                continue
            table = torch.zeros(n * k, dtype=torch.bool, device=self.device)
            table[self._edge_key[level]] = True
            self._dense.append(table.view(n, k))

    def num_nodes(self, level: int) -> int:
        """Nodes at ``level`` in ``[0, depth]``; level ``depth`` holds one leaf per SID."""
        if not 0 <= level <= self.depth:
            raise ValueError(f"level {level} outside [0, {self.depth}]")
        return 1 if level == 0 else int(self.child[level - 1].numel())

    def count(self) -> int:
        """Number of SIDs."""
        return self.num_nodes(self.depth)

    def __len__(self) -> int:
        return self.count()

    def nbytes(self) -> int:
        """Bytes its tensors hold on ``self.device`` (what one more catalog costs there)."""
        tensors = [*self.ptr, *self.child, *self._slots, *self._edge_key]
        tensors += [t for t in self._dense if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def to(self, device: str | torch.device) -> SidTrie:
        """A copy whose tensors live on ``device``."""
        out = copy.copy(self)
        out.device = torch.device(device)
        out.ptr = [p.to(out.device) for p in self.ptr]
        out.child = [c.to(out.device) for c in self.child]
        out._derive()
        return out

    def candidates(
        self, level: int, nodes: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Allowed next codes of beam rows at ``nodes [R]`` of ``level``.

        Returns ``codes [R, F]``, ``child_nodes [R, F]`` (nodes of ``level + 1``) and
        ``valid [R, F]`` with ``F = max_fanout[level]``; invalid slots hold 0. Graph-safe.
        """
        ptr = self.ptr[level]
        idx = ptr[nodes].unsqueeze(1) + self._slots[level]
        valid = idx < ptr[nodes + 1].unsqueeze(1)
        child_nodes = torch.where(valid, idx, 0)
        codes = torch.where(valid, self.child[level][child_nodes], 0)
        return codes, child_nodes, valid

    def valid_mask(self, level: int, nodes: torch.Tensor) -> torch.Tensor:
        """Dense ``[R, K]`` bool mask of the codes allowed after ``nodes [R]``. Graph-safe."""
        dense = self._dense[level]
        if dense is not None:
            return dense[nodes]
        codes, _, valid = self.candidates(level, nodes)
        k = self.codebook_size
        mask = torch.zeros(nodes.shape[0], k + 1, dtype=torch.bool, device=nodes.device)
        mask.scatter_(1, torch.where(valid, codes, k), True)  # invalid slots land in column K
        return mask[:, :k]

    def step(
        self, level: int, nodes: torch.Tensor, codes: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Child of each ``nodes [R]`` along ``codes [R]``: ``(child_nodes, found)``.

        Missing edges give ``found=False`` and child 0. Graph-safe (binary search).
        """
        keys = self._edge_key[level]
        query = nodes * self.codebook_size + codes.clamp(0, self.codebook_size - 1)
        pos = torch.searchsorted(keys, query).clamp(max=keys.numel() - 1)
        found = (keys[pos] == query) & (codes >= 0) & (codes < self.codebook_size)
        return torch.where(found, pos, 0), found

    def contains(self, codes_2d: np.ndarray | torch.Tensor) -> np.ndarray:
        """Whether each row of ``codes_2d [M, d]`` is a SID (``d == depth``) or a SID prefix."""
        codes = torch.as_tensor(np.asarray(codes_2d, dtype=np.int64), device=self.device)
        if codes.ndim != 2 or not 1 <= codes.shape[1] <= self.depth:
            raise ValueError(
                f"expected [M, d] codes with 1 <= d <= {self.depth}, got {codes.shape}"
            )
        nodes = torch.zeros(codes.shape[0], dtype=torch.long, device=self.device)
        found = torch.ones(codes.shape[0], dtype=torch.bool, device=self.device)
        for level in range(codes.shape[1]):
            nodes, hit = self.step(level, nodes, codes[:, level])
            found &= hit
        return found.cpu().numpy()


def _build_csr(codes: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """CSR ``(ptr, child)`` per level from sorted unique rows ``codes [N, D]``."""
    n, depth = codes.shape
    ptrs, childs = [], []
    new = np.zeros(n, dtype=bool)  # row starts a new prefix of the current length
    new[0] = True
    parent = np.zeros(n, dtype=np.int64)  # node id of each row's prefix at the current level
    for level in range(depth):
        col = codes[:, level]
        new[1:] |= col[1:] != col[:-1]
        edges = np.flatnonzero(new)
        num_nodes = int(parent[-1]) + 1
        counts = np.bincount(parent[edges], minlength=num_nodes)
        ptr = np.zeros(num_nodes + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        ptrs.append(ptr)
        childs.append(np.ascontiguousarray(col[edges]))
        parent = np.cumsum(new) - 1
    return ptrs, childs
