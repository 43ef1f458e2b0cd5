"""SID -> item id (PID) mapping for the benchmark's PID mode.

``sid2pid.json`` (RecIF): keys are SIDs, packed ``c1*8192^2 + c2*8192 + c3`` (or another
base, ``packed_base``) or comma separated ``"c1,c2,c3"``, read by the catalog's own key
decoder (``flashrec.sid.rows.decode_sid_keys``: one reading of a file everywhere); values are
lists of ``{"pid", "count", "count_after_downsample"}``
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

from flashrec.sid.rows import RECIF_PACKED_BASE, RowError, decode_sid_keys, pack_sid

Sid = tuple[int, ...]
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


def _keys(path: Path, keys: list[str], packed_base: int | None) -> list[Sid]:
    """The SIDs of sid2pid keys, decoded as every catalog reader decodes them."""
    try:
        codes, _ = decode_sid_keys(keys, PACK_DEPTH, packed_base)
    except RowError as e:
        where = "" if e.index is None else f"key {keys[e.index]!r}: "
        raise ValueError(f"{path}: {where}{e.why}") from None
    return [tuple(row) for row in codes.tolist()]


def pack(sid: Sid, base: int | None = None) -> int:
    """``(c1, c2, c3)`` -> the sid2pid.json key ``c1*B^2 + c2*B + c3``, ``B`` RecIF's 8192
    unless given (``flashrec.sid.rows.pack_sid``)."""
    return pack_sid(sid, RECIF_PACKED_BASE if base is None else base)


def load_pid_map(path: str | Path, packed_base: int | None = None) -> dict[Sid, Any]:
    """SID -> the item id standing for it, from a sid2pid.json or a catalog with item ids;
    packed keys decode base ``packed_base`` (default RecIF's 8192)."""
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
        if data:
            for sid, value in zip(_keys(p, list(data), packed_base), data.values()):
                pid = _pick(value)
                if pid is not None:
                    out[sid] = pid
    else:
        from flashrec.sid.catalog import load_catalog

        cat = load_catalog(p, keep_pids=True, packed_base=packed_base)
        if cat.pids is None:
            raise ValueError(f"{p}: the catalog lists no item ids, so it maps no SID to a PID")
        codes = np.asarray(cat.codes).tolist()
        out = {tuple(row): _pick(v) for row, v in zip(codes, cat.pids) if _pick(v) is not None}
    if not out:
        raise ValueError(f"{p}: maps no SID to an item id")
    return out
