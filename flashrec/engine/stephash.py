"""Step hashing for determinism debugging (``FLASHREC_DEBUG_STEP_HASH=1``).

The scheduler logs, per request and step, a hash of that step's forward inputs and of its
outputs; ``flashrec-bench determinism`` compares the logs of independent processes to find
the first step where inputs differ (host-side state) or where outputs differ on equal inputs
(numerics).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def hash_tensors(*ts: torch.Tensor | np.ndarray) -> str:
    """sha1 of the raw bytes (exact float bits) of host copies, 16 hex digits."""
    h = hashlib.sha1()
    for t in ts:
        a = t.detach().cpu().contiguous().numpy() if isinstance(t, torch.Tensor) else t
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


_P, _M = 0x100000001B3, (1 << 64) - 1  # FNV-1a 64-bit
_PRIME, _SEED = np.uint64(_P), np.uint64(0xCBF29CE484222325)


def _mix(h: np.ndarray, *xs: np.ndarray) -> np.ndarray:
    for x in xs:
        h = (h ^ np.asarray(x).astype(np.uint64)) * _PRIME  # uint64 arrays wrap silently
    return h


class StepHasher:
    """Per-request, per-step fingerprints of a forward's inputs (``FLASHREC_DEBUG_STEP_HASH``).

    ``inputs`` covers what one request's forward consumed: sequence length, positions, input
    token ids and KV indices, the indices resolved to what they address. Every prompt-pool slot
    and decode-buffer cell carries a tag, mirrored on each write and beam reorder, that chains
    the (token, position) pairs whose KV it holds. Which slot or row a request got (this changes
    legitimately with batch composition) leaves ``inputs`` unchanged; a stale or foreign index
    changes it. The raw indices are hashed apart (``kv``).

    NOTE: reads host copies after the forward has returned, never inside a captured CUDA graph;
    the syncs it adds exist in debug runs only.
    """

    def __init__(self, pool_tokens: int, decode_rows: int, depth: int) -> None:
        self.depth = depth
        self.slot_tag = np.zeros(pool_tokens, dtype=np.uint64)
        self.cell_tag = np.zeros(decode_rows * depth, dtype=np.uint64)  # row * depth + step

    def prefill(self, meta, input_ids: torch.Tensor, batch: list) -> None:
        ids, pos = input_ids.cpu().numpy(), meta.positions.cpu().numpy()
        loc = meta.out_loc.cpu().numpy()
        off = 0
        for st, seq, pre, new in zip(batch, meta.seq_slots, meta.prefix_lens, meta.new_lens):
            slots = seq.cpu().numpy()
            h = int(self.slot_tag[slots[pre - 1]]) if pre else int(_SEED)
            for j in range(off, off + new):  # KV of token j extends the chain of its prefix
                h = ((((h ^ int(ids[j])) * _P) & _M) ^ int(pos[j])) * _P & _M
                self.slot_tag[loc[j]] = h
            off += new
            st.step_inputs = (
                hash_tensors(np.array([len(slots)]), self.slot_tag[slots]),
                hash_tensors(slots),
            )

    def decode(self, meta, input_ids: torch.Tensor, batch: list) -> None:
        ids, pos = input_ids.cpu().numpy(), meta.positions.cpu().numpy()
        rows_all, loc = meta.rows.cpu().numpy(), meta.out_loc.cpu().numpy()
        d = self.depth
        for st, grp in zip(batch, meta.groups):
            s, e, t = grp.start, grp.end, grp.step
            slots, rows = grp.prompt_slots.cpu().numpy(), rows_all[s:e]
            prompt = np.uint64(int(hash_tensors(self.slot_tag[slots]), 16))
            prev = self.cell_tag[rows * d + t - 1] if t > 0 else np.full(e - s, _SEED)
            self.cell_tag[loc[s:e]] = _mix(
                prev, np.broadcast_to(prompt, prev.shape), ids[s:e], pos[s:e]
            )
            read = self.cell_tag[rows[:, None] * d + np.arange(t + 1)[None, :]]
            st.step_inputs = (
                hash_tensors(
                    np.array([len(slots) + t + 1]), pos[s:e], ids[s:e], self.slot_tag[slots], read
                ),
                hash_tensors(slots, rows),
            )

    def reorder(self, rows: torch.Tensor, src: torch.Tensor, positions: int | None = None) -> None:
        """Mirror ``KVCache.reorder``: the tags of positions ``[0, positions)`` (all when
        None) follow their beams."""
        view = self.cell_tag.reshape(-1, self.depth)[
            :, : self.depth if positions is None else positions
        ]
        view[rows.cpu().numpy()] = view[src.cpu().numpy()]
