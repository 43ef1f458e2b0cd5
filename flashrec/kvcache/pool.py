"""KV memory: a token-granular prompt pool (shared with the radix cache) and a dense
per-beam-row decode buffer.

    prompt pool   k[layer]: [pool_tokens, n_kv, head_dim]   one slot per prompt token
    decode buffer dk[layer]: [slots * depth, n_kv, head_dim]  row r, step t -> r * depth + t

All beams of a request read the same prompt slots (never copied per beam). After each beam
step the decode rows of a request are gathered by parent index (``reorder``): only the
positions a later forward still reads (``reorder_positions``), moved as 8-byte words.
"""

from __future__ import annotations

import torch

from flashrec.config import ModelConfig


class TokenAllocator:
    """Free list of integer slots. Deterministic (the same sequence of calls hands out the same
    slots) and O(k) per call of k slots: freed slots go back on top of the stack and are reused
    first, lowest first within one free (never a sort of the whole free list: with a large
    pool that would stall the engine on every finished request)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = list(range(size - 1, -1, -1))  # pop() from the end -> lowest first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.size - len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"need {n} slots, {len(self._free)} free")
        if n == 0:
            return []
        out = self._free[-n:]
        del self._free[-n:]
        out.reverse()
        return out

    def free(self, slots) -> None:
        if len(self._free) + len(slots) > self.size:
            raise RuntimeError("double free in TokenAllocator")
        self._free.extend(sorted(slots, reverse=True))


class KVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        pool_tokens: int,
        row_slots: int,
        depth: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape_kv = (cfg.num_key_value_heads, cfg.head_dim)
        self.dtype = dtype
        self.depth = depth
        self.pool_tokens = pool_tokens
        self.row_slots = row_slots
        self.k = [
            torch.zeros(pool_tokens, *shape_kv, dtype=dtype, device=device)
            for _ in range(cfg.num_hidden_layers)
        ]
        self.v = [torch.zeros_like(t) for t in self.k]
        # one tensor for all layers' decode K and V, so a beam reorder is a single gather
        # row ``row_slots`` is a scratch row no request owns (padding rows of graph replays)
        self.scratch_row = row_slots
        self.dkv = torch.zeros(
            2 * cfg.num_hidden_layers, row_slots + 1, depth, *shape_kv, dtype=dtype, device=device
        )
        flat = self.dkv.view(2 * cfg.num_hidden_layers, (row_slots + 1) * depth, *shape_kv)
        self.dk = [flat[i] for i in range(cfg.num_hidden_layers)]
        self.dv = [flat[cfg.num_hidden_layers + i] for i in range(cfg.num_hidden_layers)]
        self.tokens = TokenAllocator(pool_tokens)
        self.rows = TokenAllocator(row_slots)
        # decode positions a beam reorder moves: None = all ``depth``. The runner sets it to
        # (decode forwards - 1): a reorder follows a forward, and the next forward reads only the
        # positions written before it (it writes its own); after the last forward nothing reads
        # the rows. With 3 SID levels and a free end token that is ONE of 3 positions.
        self.reorder_positions: int | None = None
        # the same bytes as 8-byte words where a head's row allows it: the index kernels of a
        # reorder move one element per thread, so an FP8 (BF16) buffer moved as words takes 8x
        # (4x) fewer threads (the 1-byte form costs milliseconds per step at n=512)
        row_bytes = cfg.head_dim * self.dkv.element_size()
        self._words = self.dkv.view(torch.int64) if row_bytes % 8 == 0 else self.dkv

    def reorder(self, rows: torch.Tensor, src: torch.Tensor) -> None:
        """Decode KV of beam rows ``rows`` becomes that of rows ``src`` (all layers, K and V,
        positions ``[0, reorder_positions)``: the ones a later forward reads; the others are
        rewritten before they are read, or never read again)."""
        p = self.depth if self.reorder_positions is None else self.reorder_positions
        if rows.numel() and p > 0:
            buf = self._words if p >= self.depth else self._words[:, :, :p]
            buf[:, rows] = buf[:, src]
