"""RecIF ``pid2sid`` parquet: one row per item, its id and its SID.

RecIF-Bench (OpenOneRec) ships ``video_ad_pid2sid.parquet`` and ``product_pid2sid.parquet``
with two columns: ``pid`` (the item id) and ``sid`` (a list of the item's codes, three for
OneRec). Also read: any one list-of-integers column, or one integer column per level named by
a common prefix and the level (``sid_a, sid_b, sid_c``; ``c0, c1, c2``; ``code_1 .. code_3``).

pyarrow is needed only here, imported when a parquet file is read.
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

import numpy as np

from flashrec.sid.rows import INT64_MAX, RowError

PARQUET_MAGIC = b"PAR1"
PID_COLUMN = "pid"
SID_COLUMN = "sid"
_LEVEL_COLUMN_RE = re.compile(r"(.*?)(\d+|[a-z])")
_WANTED = (
    f"a list column {SID_COLUMN!r} of integer codes (RecIF pid2sid: {PID_COLUMN}, "
    f"{SID_COLUMN}) or one integer column per level (sid_a, sid_b, ... or c0, c1, ...)"
)


def is_parquet(path: Path) -> bool:
    """``.parquet`` suffix or the parquet magic ``PAR1`` at the start of the file."""
    if path.suffix.lower() == ".parquet":
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == PARQUET_MAGIC
    except OSError:
        return False


def read_pid2sid(path: Path) -> tuple[np.ndarray, np.ndarray | None, str]:
    """``codes [N, D]`` int64, the ``pid`` column (None when absent) and the SID column(s) used.

    Raises ``RowError`` naming the row of a null, ragged or negative SID, or, with index
    None, a file without usable columns (listing the columns found) or without pyarrow.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise RowError(
            None, "reading a parquet catalog needs pyarrow: pip install pyarrow"
        ) from None
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as e:
        raise RowError(None, f"cannot read parquet: {e}") from None
    sid_columns = _sid_columns(schema, pa)
    columns = sid_columns + ([PID_COLUMN] if PID_COLUMN in schema.names else [])
    try:
        table = pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowException) as e:
        raise RowError(None, f"cannot read parquet: {e}") from None
    pids = None
    if PID_COLUMN in schema.names:
        pids = table.column(PID_COLUMN).to_numpy(zero_copy_only=False)
    try:
        if len(sid_columns) == 1:
            codes = _list_codes(table.column(sid_columns[0]).combine_chunks(), pa)
        else:
            codes = np.stack([_int_column(table.column(c)) for c in sid_columns], axis=1)
        return _non_negative(codes), pids, ", ".join(sid_columns)
    except RowError as e:
        raise RowError(e.index, e.why, row_label(e.index, pids)) from None


def row_label(row: int, pids: np.ndarray | None) -> str:
    """``row 7 (pid 123)``: a row named by its index and, where the file has one, its item id."""
    return f"row {row}" + ("" if pids is None else f" (pid {pids[row]})")


def _sid_columns(schema: Any, pa: Any) -> list[str]:
    """The SID column: ``sid``, else the one list-of-int column, else one int column per level."""
    candidates = [f for f in schema if f.name != PID_COLUMN and not f.name.startswith("__")]
    lists = [f.name for f in candidates if _is_int_list(f.type, pa)]
    if SID_COLUMN in lists or len(lists) == 1:
        return [SID_COLUMN if SID_COLUMN in lists else lists[0]]
    groups: dict[str, dict[str, str]] = {}
    for f in candidates:
        match = _LEVEL_COLUMN_RE.fullmatch(f.name)
        if match and pa.types.is_integer(f.type):
            groups.setdefault(match.group(1), {})[match.group(2)] = f.name
    levels = [_levels(by_suffix) for by_suffix in groups.values()]
    levels = [names for names in levels if names]
    if len(levels) == 1 and not lists:
        return levels[0]
    found = ", ".join(f"{f.name} ({f.type})" for f in schema) or "none"
    if len(lists) + len(levels) > 1:
        found = "several candidates: " + found
    raise RowError(None, f"no usable SID columns: expected {_WANTED}; found {found}")


def _levels(by_suffix: dict[str, str]) -> list[str] | None:
    """Column names in level order when the suffixes run 0.., 1.. or a.. without a gap."""
    n = len(by_suffix)
    for run in (
        [str(i) for i in range(n)],
        [str(i) for i in range(1, n + 1)],
        list(string.ascii_lowercase[:n]),
    ):
        if n >= 2 and set(by_suffix) == set(run):
            return [by_suffix[s] for s in run]
    return None


def _is_int_list(dtype: Any, pa: Any) -> bool:
    is_list = (
        pa.types.is_list(dtype)
        or pa.types.is_large_list(dtype)
        or pa.types.is_fixed_size_list(dtype)
    )
    return is_list and pa.types.is_integer(dtype.value_type)


def _list_codes(column: Any, pa: Any) -> np.ndarray:
    """A list column -> ``[N, D]``: every row a non-null list of D non-null codes."""
    import pyarrow.compute as pc

    if column.null_count:
        raise RowError(_first(column.is_null()), "SID is null")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if not len(lengths):
        return np.zeros((0, 0), dtype=np.int64)
    depth = int(lengths[0])
    ragged = np.flatnonzero(lengths != depth)
    if ragged.size:
        row = int(ragged[0])
        raise RowError(row, f"expected {depth} codes like the first row, got {lengths[row]}")
    if depth == 0:
        raise RowError(0, "SID has no codes")
    flat = pc.list_flatten(column)
    if flat.null_count:
        raise RowError(_first(flat.is_null()) // depth, "SID holds a null code")
    return _as_int64(flat.to_numpy(zero_copy_only=False), depth).reshape(-1, depth)


def _int_column(column: Any) -> np.ndarray:
    if column.null_count:
        raise RowError(_first(column.is_null()), "SID holds a null code")
    return _as_int64(column.to_numpy())


def _first(mask: Any) -> int:
    return int(np.flatnonzero(mask.to_numpy(zero_copy_only=False))[0])


def _as_int64(values: np.ndarray, depth: int = 1) -> np.ndarray:
    """``values`` (``depth`` codes a row) as int64; uint64 codes past int64 are refused."""
    if values.dtype == np.uint64 and len(values) and values.max() > INT64_MAX:
        raise RowError(int(np.argmax(values > INT64_MAX)) // depth, "code does not fit int64")
    return values.astype(np.int64, copy=False)


def _non_negative(codes: np.ndarray) -> np.ndarray:
    bad = np.argwhere(codes < 0)
    if bad.size:
        row, level = (int(x) for x in bad[0])
        raise RowError(row, f"code {codes[row, level]} is not a non-negative integer")
    return codes
