"""Forward metadata: the host arrays of a prefill or decode batch, moved to the device in one
pinned asynchronous copy each."""

from __future__ import annotations

import functools

import numpy as np
import torch

from flashrec.kernels.beam_attention import choose_splits
from flashrec.layers.attention import DecodeGroup, DecodeMeta, PackedDecode, PrefillMeta

ALIGN_BYTES = 16  # Triton specializes pointer arguments on 16-byte alignment


def host_to_device(arrays: list, device, dtype=np.int64) -> list[torch.Tensor]:
    """Many small integer host arrays -> device views through ONE copy (pinned on CUDA, so
    the copy is asynchronous: no per-array launches, no sync).

    Every view starts at a 16-byte boundary of the buffer. Triton compiles one variant of a
    kernel per pattern of pointer alignments: a view at an offset set by the batch (``T``
    positions before the KV slots, an odd ``T`` leaving them 8-byte aligned) would switch a
    kernel such as the fused q/k norm + RoPE + KV write between two variants, and the first
    batch of the unseen parity would stop the engine for a compile (~0.5 s) mid-run."""
    step = max(1, ALIGN_BYTES // np.dtype(dtype).itemsize)
    sizes = [len(a) for a in arrays]
    starts, total = [], 0
    for n in sizes:
        starts.append(total)
        total += -(-n // step) * step
    dev = torch.device(device)
    if dev.type == "cuda":
        # filled in place in page-locked memory (no pageable staging array and no second
        # host copy); the caching host allocator reuses the block only after the copy ran
        host = torch.empty(total, dtype=_torch_dtype(np.dtype(dtype)), pin_memory=True)
        host_np = host.numpy()
    else:
        host_np = np.empty(total, dtype=dtype)
        host = torch.from_numpy(host_np)
    ends = starts[1:] + [total]
    for a, start, n, end in zip(arrays, starts, sizes, ends):
        host_np[start : start + n] = a
        host_np[start + n : end] = 0  # the alignment padding: never read, but never garbage
    buf = host.to(dev, non_blocking=True) if dev.type == "cuda" else host
    return [buf[start : start + n] for start, n in zip(starts, sizes)]


@functools.cache
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype a numpy array of ``dtype`` converts to."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def make_prefill_meta(seqs, device, ids=None) -> PrefillMeta:
    """seqs: list of (prefix_len, new_slots, all_slots) with slot lists or arrays; ``ids``:
    the new tokens, concatenated (optional). One pinned asynchronous copy carries it all:
    no pageable copy, so the host never waits here for the device to drain."""
    new_lens = [len(new) for _, new, _ in seqs]
    prefix_lens = [pre for pre, _, _ in seqs]
    positions = np.concatenate([np.arange(p, p + n) for p, n in zip(prefix_lens, new_lens)])
    out_loc = np.concatenate([np.asarray(new, dtype=np.int64) for _, new, _ in seqs])
    last = np.cumsum(new_lens) - 1
    head = [positions, out_loc, last, np.asarray(ids if ids is not None else [], dtype=np.int64)]
    parts = host_to_device(head + [np.asarray(a) for _, _, a in seqs], device)
    meta = PrefillMeta(parts[0], parts[1], parts[4:], new_lens, prefix_lens, parts[2])
    if ids is not None:
        meta.input_ids = parts[3]
    return meta


BLOCK_M = 64  # query rows per program of the beam-decode kernel


def make_decode_meta(
    groups_in,
    depth: int,
    device,
    packed: bool = False,
    group_size: int = 1,
    num_kv_heads: int = 1,
    sms: int = 1,
    split_rows: int | None = None,
    max_splits: int = 8,
) -> DecodeMeta:
    """groups_in: per request (rows_np, slots_np, slots_t, step, position); one host->device
    copy carries positions, rows, out_loc and (``packed``) the fused kernel's metadata,
    including the prompt split count (``choose_splits`` over ``split_rows`` rows, default the
    batch's rows: a graph replay passes its padded size)."""
    ns = [len(g[0]) for g in groups_in]
    rows = np.concatenate([g[0] for g in groups_in])
    steps = np.repeat([g[3] for g in groups_in], ns)
    positions = np.repeat([g[4] for g in groups_in], ns)
    arrays = [positions, rows, rows * depth + steps]
    starts = np.concatenate([[0], np.cumsum(ns)[:-1]]).astype(np.int64)
    dev = host_to_device(arrays, device)
    groups = [DecodeGroup(int(a), int(a) + n, g[2], g[3]) for a, n, g in zip(starts, ns, groups_in)]
    meta = DecodeMeta(dev[0], dev[1], dev[2], groups)
    if packed:  # int32, as the kernel and the graph's static buffers take it
        lens = [len(g[1]) for g in groups_in]
        slot_start = np.concatenate([[0], np.cumsum(lens)[:-1]])
        blocks = [(group_size * n + BLOCK_M - 1) // BLOCK_M for n in ns]
        rows_total = split_rows if split_rows is not None else int(sum(ns))
        splits = choose_splits(sum(blocks), num_kv_heads, rows_total, min(lens), sms, max_splits)
        work = [(i, b, sp) for i, k in enumerate(blocks) for b in range(k) for sp in range(splits)]
        slots = np.concatenate([g[1] for g in groups_in])
        meta.host = (np.asarray(ns), np.asarray(lens), slots)
        pk = host_to_device(
            [slots, starts, ns, slot_start, lens,
             [g[3] for g in groups_in], np.asarray(work).reshape(-1), [splits, len(work)]],
            device, np.int32,
        )  # fmt: skip
        meta.packed = PackedDecode(*pk[:6], pk[6].view(-1, 3), pk[7], splits)
    return meta
