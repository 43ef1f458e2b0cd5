"""Synthetic item catalogs: unique semantic IDs, and the comma-key JSON the engine reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flashrec.sid.catalog import load_catalog
from flashrec.sid.catalog import write_catalog_json as write_catalog

_DENSE = 4  # below this many candidates per wanted SID, sample a permutation instead


def synth_catalog(
    num_sids: int, codebook_size: int, num_levels: int = 3, seed: int = 0
) -> np.ndarray:
    """``num_sids`` distinct SIDs drawn uniformly, as an int64 ``[N, num_levels]`` array.

    Rows are unique and sorted lexicographically; every code is in ``[0, codebook_size)``.
    The same arguments always give the same array.
    """
    total = codebook_size**num_levels
    if total >= 2**62:
        raise ValueError(f"{codebook_size} codes ^ {num_levels} levels does not fit in int64")
    if not 0 <= num_sids <= total:
        raise ValueError(
            f"num_sids={num_sids} not in [0, {total}] ({codebook_size} codes ^ {num_levels} levels)"
        )
    rng = np.random.default_rng([seed, codebook_size, num_levels])
    if total <= _DENSE * num_sids:
        flat = rng.permutation(total)[:num_sids]
    else:  # sparse: drawing again for the duplicates converges in a few rounds
        flat = np.empty(0, dtype=np.int64)
        while len(flat) < num_sids:
            flat = np.concatenate([flat, rng.integers(0, total, size=num_sids - len(flat))])
            _, first = np.unique(flat, return_index=True)
            flat = flat[np.sort(first)]  # keep first occurrences, in draw order
    flat = np.sort(flat)  # flat index order == lexicographic order of the digit rows
    powers = codebook_size ** np.arange(num_levels - 1, -1, -1, dtype=np.int64)
    return ((flat[:, None] // powers) % codebook_size).astype(np.int64)


def write_catalog_json(codes: np.ndarray | list, path: str | Path) -> Path:
    """Write ``{"12,7,301": {"pid": i}, ...}`` (i = row index) through the engine's own
    catalog writer and return the path."""
    codes = np.asarray(codes, dtype=np.int64)
    write_catalog(codes, path, values=[{"pid": i} for i in range(len(codes))])
    return Path(path)


def read_catalog_json(path: str | Path) -> np.ndarray:
    """Inverse of ``write_catalog_json``: the SIDs as an int64 array in pid order."""
    cat = load_catalog(path, keep_pids=True)
    order = np.argsort([p["pid"] for p in cat.pids], kind="stable")
    return cat.codes[order]
