"""A large catalog file parsed in a child process, so that the serving process's threads run on.

Parsing a catalog of millions of SIDs (``json.load``, the text reader, the key splitting) holds
the interpreter lock for seconds: a reload parsed beside a serving engine thread stops every
step for that long (1.5M SIDs: ~2 s). A file of at least ``CHILD_BYTES`` is therefore read by
a child interpreter (``python -m flashrec.sid.childload``: a plain subprocess, so that a
daemonic engine process may start it, and never a fork of a process holding threads and CUDA)
under the calling thread's read limits (``--max-catalog-bytes``, ``--catalog-read-timeout-s``);
only the unique codes come back, as one ``.npy`` file. Errors keep their type and message (a
bad file is still a ``ValueError``: HTTP 400); a child that dies is a ``ValueError`` saying so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import tempfile
from pathlib import Path

import numpy as np

from flashrec import boundedread
from flashrec.childrun import run_json_child
from flashrec.sid.catalog import Catalog, CatalogError, load_catalog
from flashrec.sid.layout import SidLayout, SidLayoutError

CHILD_BYTES = 8 << 20  # files from this size are parsed in a child (a start costs ~0.3 s)
# the errors a child names that come back as themselves (any other keeps its name)
_ERRORS: dict[str, type[Exception]] = {
    e.__name__: e for e in (ValueError, CatalogError, SidLayoutError, boundedread.FileLimitError)
}


def _load(path: str, layout: SidLayout | None, packed_base: int | None, limits) -> Catalog:
    with boundedread.using(limits.max_bytes, limits.timeout_s):
        cat = load_catalog(path, layout=layout, packed_base=packed_base)
    return Catalog(cat.codes, cat.source)  # the codes alone cross back: no per-SID values


def parse_where(path: str | Path, child_bytes: int | None = None) -> str:
    """``"child"`` for a regular file of at least ``child_bytes`` (None: ``CHILD_BYTES``), else
    ``"here"`` (small files, and paths that are not regular files: the bounded reader refuses
    those here)."""
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
    """``load_catalog(path, layout, packed_base)`` without per-SID values, parsed by a child
    interpreter where the file is large (:func:`parse_where`), else on this thread."""
    limits = boundedread.current()
    if parse_where(path, child_bytes) == "here":
        return _load(str(path), layout, packed_base, limits)
    with tempfile.TemporaryDirectory(prefix="flashrec-catalog-") as tmp:
        out = Path(tmp) / "codes.npy"
        job = {
            "path": str(path),
            "layout": dataclasses.asdict(layout) if layout is not None else None,
            "packed_base": packed_base,
            "max_bytes": limits.max_bytes,
            "timeout_s": limits.timeout_s,
            "out": str(out),
        }
        answer = run_json_child("flashrec.sid.childload", job, f"{path}: the catalog reader")
        if "error" in answer:
            name = answer["error"]
            cls = _ERRORS.get(name) or type(name, (Exception,), {})
            raise cls(answer["message"])
        return Catalog(np.load(out), answer["source"])


def _child() -> int:
    """The child's side: a job (JSON) on stdin, the codes to ``out``, one JSON line on stdout
    (``{"source"}``, or ``{"error", "message"}`` and exit 2)."""
    job = json.load(sys.stdin)
    try:
        layout = SidLayout(**job["layout"]) if job["layout"] is not None else None
        limits = boundedread.Limits(job["max_bytes"], job["timeout_s"])
        cat = _load(job["path"], layout, job["packed_base"], limits)
        np.save(job["out"], cat.codes)
    except Exception as exc:  # noqa: BLE001 - named back to the parent, which raises it
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return 2
    print(json.dumps({"source": cat.source}))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
