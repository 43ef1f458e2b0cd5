"""SID -> item id (PID) mapping for the benchmark's PID mode.

``sid2pid.json`` (RecIF): keys are SIDs, packed ``c1*8192^2 + c2*8192 + c3`` or comma
separated ``"c1,c2,c3"``; values are lists of ``{"pid", "count", "count_after_downsample"}``
(``iid`` for goods). The most popular item after down-sampling stands for a SID (the
benchmark's ``most_popular_after_downsampling``; its ties are broken at random there, here
by list order, i.e. by original popularity, so that runs repeat). A ``pid2sid`` parquet or
any catalog whose values are plain id lists (``flashrec.sid`` reads them) maps a SID to the
first id listed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

Sid = tuple[int, ...]
PACK_BASE = 8192
PACK_DEPTH = 3


def _pick(value: Any) -> Any:
    """The item id standing for a SID, from its sid2pid value."""
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(v, dict) for v in value):
        best, best_count = None, None
        for v in value:
            pid = v.get("pid", v.get("iid"))
            count = v.get("count_after_downsample", v.get("count", 0))
            if pid is None or pid == 0:
                continue
            if best_count is None or count > best_count:
                best, best_count = pid, count
        return best
    return value[0]


def _key(key: str) -> Sid:
    if "," in key:
        return tuple(int(c) for c in key.split(","))
    packed = int(key)
    codes = []
    for _ in range(PACK_DEPTH):
        packed, code = divmod(packed, PACK_BASE)
        codes.append(code)
    if packed:
        raise ValueError(f"packed SID key {key} exceeds {PACK_BASE}^{PACK_DEPTH} - 1")
    return tuple(reversed(codes))


def pack(sid: Sid) -> int:
    """``(c1, c2, c3)`` -> the sid2pid.json key ``c1*8192^2 + c2*8192 + c3``."""
    out = 0
    for c in sid:
        out = out * PACK_BASE + int(c)
    return out


def load_pid_map(path: str | Path) -> dict[Sid, Any]:
    """SID -> the item id standing for it, from a sid2pid.json or a catalog with item ids."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such PID mapping file")
    if p.suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}: not JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{p}: a sid2pid mapping is a JSON object of SID -> item list")
        out: dict[Sid, Any] = {}
        for key, value in data.items():
            try:
                sid = _key(str(key))
            except ValueError as exc:
                raise ValueError(f"{p}: key {key!r}: {exc}") from None
            pid = _pick(value)
            if pid is not None:
                out[sid] = pid
    else:
        from flashrec.sid.catalog import load_catalog

        cat = load_catalog(p, keep_pids=True)
        if cat.pids is None:
            raise ValueError(f"{p}: the catalog lists no item ids, so it maps no SID to a PID")
        codes = np.asarray(cat.codes).tolist()
        out = {tuple(row): _pick(v) for row, v in zip(codes, cat.pids) if _pick(v) is not None}
    if not out:
        raise ValueError(f"{p}: maps no SID to an item id")
    return out
