"""One loaded catalog as the engine serves it: its trie and its identity (a content hash of
the sorted unique SIDs), built and validated in full before anything serves it, so a catalog
hot reload (``POST /update_catalog``) can refuse a bad file while the old catalog serves on.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from flashrec.sid.childload import load_catalog_codes
from flashrec.sid.layout import SidLayout
from flashrec.sid.trie import SidTrie


def catalog_hash(codes: np.ndarray, sorted_unique: bool = False) -> str:
    """SHA-256 (first 16 hex digits) of the sorted unique SIDs ``[N, depth]`` as little-endian
    int64, depth first: the same SIDs give the same hash whatever the file's format or order.
    ``sorted_unique``: the rows already are (``Catalog.codes``), skip the sort."""
    codes = np.asarray(codes, dtype=np.int64)
    if not sorted_unique:
        codes = np.unique(codes, axis=0)
    codes = np.ascontiguousarray(codes, "<i8")
    h = hashlib.sha256(np.int64(codes.shape[1]).tobytes())
    h.update(codes.tobytes())
    return h.hexdigest()[:16]


@dataclass(eq=False)
class CatalogVersion:
    """A catalog the engine can serve: ``trie`` None is the unconstrained search (no
    ``--sid-vocab-file``); ``hash`` / ``size`` are then None."""

    trie: SidTrie | None
    path: str | None
    hash: str | None
    size: int | None
    depth: int
    loaded_at: float = field(default_factory=time.time)  # wall clock, for /get_server_info
    load_ms: float = 0.0
    build_ms: float = 0.0

    def info(self) -> dict:
        """What ``/get_server_info`` shows of it."""
        return {
            "path": self.path,
            "hash": self.hash,
            "sids": self.size,
            "depth": self.depth,
            "loaded_at": self.loaded_at,
        }


def unconstrained(depth: int) -> CatalogVersion:
    return CatalogVersion(None, None, None, None, depth)


def build_catalog_version(
    path: str | Path,
    layout: SidLayout,
    depth: int | None,
    device: str | torch.device,
    packed_base: int | None = None,
) -> CatalogVersion:
    """Read, validate and build ``path`` into a servable catalog; ValueError (with the reason)
    when the file is missing, unreadable, empty, of another depth than ``depth`` (None: any
    depth the layout holds), or holds a code the layout cannot express. Packed-integer keys
    decode base ``packed_base`` (default RecIF's 8192), never the layout's codebook size. The
    trie is built on the CPU, then moved to ``device``. A large file is parsed in a child
    process (:mod:`flashrec.sid.childload`), so that a reload leaves the engine thread running."""
    path = str(path)
    if not Path(path).exists():
        raise ValueError(f"catalog file not found: {path}")
    t0 = time.perf_counter()
    try:
        cat = load_catalog_codes(path, layout=layout, packed_base=packed_base)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file
        raise ValueError(f"{path}: cannot read the catalog: {type(exc).__name__}: {exc}") from None
    t1 = time.perf_counter()
    if len(cat) == 0:
        raise ValueError(f"{path}: catalog holds no SIDs")
    if depth is not None and cat.depth != depth:
        raise ValueError(
            f"{path}: SIDs have {cat.depth} levels; the server decodes {depth} "
            "(a reload cannot change the depth)"
        )
    codes = cat.codes
    if codes.min() < 0 or codes.max() >= layout.codebook_size:
        raise ValueError(
            f"{path}: codes span [{codes.min()}, {codes.max()}], outside the layout's "
            f"[0, {layout.codebook_size})"
        )
    trie = SidTrie(codes, layout.codebook_size, device="cpu")
    dev = torch.device(device)
    if dev.type != "cpu":
        trie = trie.to(dev)
    if dev.type == "cuda":  # copied on this thread's stream: done before the engine reads it
        torch.cuda.synchronize(dev)
    t2 = time.perf_counter()
    return CatalogVersion(
        trie,
        path,
        catalog_hash(codes, sorted_unique=True),
        len(cat),
        cat.depth,
        load_ms=(t1 - t0) * 1e3,
        build_ms=(t2 - t1) * 1e3,
    )
