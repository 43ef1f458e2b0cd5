"""A large catalog file parsed in a child process, so that the serving process's threads run on.

Parsing a catalog of millions of SIDs (``json.load``, the text reader, the key splitting) holds
the interpreter lock for seconds: a reload parsed beside a serving engine thread stops every
step for that long (1.5M SIDs: ~2 s). A file of at least ``CHILD_BYTES`` is therefore read
by a spawned process (never forked: the server holds threads and CUDA) under the calling
thread's read limits (``--max-catalog-bytes``, ``--catalog-read-timeout-s``), and only the
unique codes come back, as one array. Errors keep their type and message (a bad file is still
a ``ValueError``: HTTP 400); a child that dies is a ``ValueError`` saying so.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import stat
from pathlib import Path

from flashrec import boundedread
from flashrec.sid.catalog import Catalog, load_catalog
from flashrec.sid.layout import SidLayout

CHILD_BYTES = 8 << 20  # files from this size are parsed in a child (a start costs ~0.3 s)


def _load(path: str, layout: SidLayout | None, packed_base: int | None, limits) -> Catalog:
    with boundedread.using(limits.max_bytes, limits.timeout_s):
        cat = load_catalog(path, layout=layout, packed_base=packed_base)
    return Catalog(cat.codes, cat.source)  # the codes alone cross back: no per-SID values


def parse_where(path: str | Path, child_bytes: int | None = None) -> str:
    """``"child"`` for a regular file of at least ``child_bytes`` (None: ``CHILD_BYTES``), else ``"here"`` (small
    files, and paths that are not regular files: the bounded reader refuses those here)."""
    try:
        st = os.stat(path)
    except OSError:
        return "here"
    limit = CHILD_BYTES if child_bytes is None else child_bytes
    return "child" if stat.S_ISREG(st.st_mode) and st.st_size >= limit else "here"


def load_catalog_codes(
    path: str | Path,
    layout: SidLayout | None = None,
    packed_base: int | None = None,
    child_bytes: int | None = None,
) -> Catalog:
    """``load_catalog(path, layout, packed_base)`` without per-SID values, parsed in a spawned
    child process where the file is large (:func:`parse_where`), else on this thread."""
    limits = boundedread.current()
    if parse_where(path, child_bytes) == "here":
        return _load(str(path), layout, packed_base, limits)
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        try:
            return pool.submit(_load, str(path), layout, packed_base, limits).result()
        except cf.process.BrokenProcessPool:
            raise ValueError(f"{path}: the catalog reader process died (out of memory?)") from None
