"""The catalog: the set of valid SIDs, loaded from any of the common file formats.

Formats, auto-detected from the file's first character and keys:

* comma-key JSON ``{"12,7,301": <anything>, ...}`` (values ignored; FlashRec writes ``{}`` or
  the item ids). When a layout is given and a key holds ``num_levels + 1`` codes, the last one
  is a trailing end code and is dropped (this holds for the list and text formats too).
* RecIF packed-integer JSON (``sid2pid.json``) ``{"<int>": [{"pid": ..}, ..], ...}``: every key
  has no comma and packs the codes base ``K``: ``a*K^2 + b*K + c``. ``K`` is the layout's or
  ``codebook_size`` (default 8192); the depth is the layout's ``num_levels`` (default 3).
* list-of-lists JSON ``[[12, 7, 301], ...]``.
* text, one SID a line: ``12,7,301``, ``12 7 301`` or ``<s_a_12><s_b_7><s_c_301>`` with or
  without ``<|sid_begin|>``/``<|sid_end|>``; blank lines and ``#`` comments are skipped.

Parsing is vectorised (one ``np.fromstring`` over all keys) with a per-entry fallback that
names the offending entry; every ``CatalogError`` starts with the file path.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flashrec.sid.layout import (
    CODE_TOKEN_RE,
    LEVEL_LETTERS,
    SID_BEGIN_TOKEN,
    SID_END_TOKEN,
    SidLayout,
    parse_sid_arg,
)

RECIF_CODEBOOK_SIZE = 8192
RECIF_DEPTH = 3
_INT64_MAX = np.iinfo(np.int64).max
_SEPARATORS = re.compile(r"[ \t]*,[ \t]*|[ \t]+")


class CatalogError(ValueError):
    """A catalog file is unreadable or invalid; the message starts with the file path."""


@dataclass(frozen=True, eq=False)
class Catalog:
    """Unique SIDs as an ``[N, depth]`` int64 array sorted lexicographically.

    Row ``i`` is the SID that ``SidTrie(codes)`` numbers as leaf ``i``.
    """

    codes: np.ndarray
    source: str = ""
    pids: list[Any] | None = field(default=None, repr=False)

    @property
    def depth(self) -> int:
        return int(self.codes.shape[1])

    def __len__(self) -> int:
        return int(self.codes.shape[0])


def unique_rows(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lexicographically sorted unique rows of ``codes [N, D]`` and, per input row, its output row.

    Rows pack into one int64 sort key when they fit (the common case), else ``np.lexsort``.
    """
    codes = np.asarray(codes, dtype=np.int64)
    n, depth = codes.shape
    if n == 0:
        return codes, np.zeros(0, dtype=np.int64)
    radix = int(codes.max()) + 1
    if codes.min() >= 0 and radix**depth <= _INT64_MAX:
        key = codes[:, 0].copy()
        for level in range(1, depth):
            key *= radix
            key += codes[:, level]
        order = np.argsort(key, kind="stable")
        key = key[order]
        new = np.ones(n, dtype=bool)
        np.not_equal(key[1:], key[:-1], out=new[1:])
    else:
        order = np.lexsort(codes.T[::-1])
        rows = codes[order]
        new = np.ones(n, dtype=bool)
        new[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return codes[order[new]], inverse


# -- parsing --------------------------------------------------------------------------------


class _Fail(Exception):
    """Internal: entry ``index`` is invalid because ``why``; turned into a CatalogError."""

    def __init__(self, index: int, why: str) -> None:
        super().__init__(why)
        self.index, self.why = index, why


def _parse_rows(rows: list[str]) -> np.ndarray:
    """``["12,7,301", ...]`` -> ``[N, D]`` int64; raises ``_Fail`` naming the bad row."""
    codes = _parse_fast("\n".join(rows), len(rows))
    return codes if codes is not None else _parse_slow(rows)


def _parse_fast(text: str, num_rows: int) -> np.ndarray | None:
    """Vectorised parse of ``num_rows`` newline-separated rows of comma-separated digits.

    Returns None unless every row is well-formed with the first row's number of codes.
    """
    try:
        buf = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    except UnicodeEncodeError:
        return None
    is_row_end = buf == ord("\n")
    is_sep = (buf == ord(",")) | is_row_end
    seps = np.flatnonzero(is_sep)
    if not len(buf) or (len(seps) + 1) % num_rows:
        return None
    depth = (len(seps) + 1) // num_rows
    ends = np.append(is_row_end[seps], True).reshape(num_rows, depth)
    if (
        not ends[:, -1].all()
        or ends[:, :-1].any()
        or not (is_sep | ((buf >= ord("0")) & (buf <= ord("9")))).all()
        or not _fields_fit(seps, len(buf))
    ):
        return None
    flat = np.fromstring(text.replace("\n", ","), dtype=np.int64, sep=",")
    return flat.reshape(num_rows, depth)


def _fields_fit(seps: np.ndarray, size: int) -> bool:
    """Every field between separators holds 1 to 18 digits (18 digits always fit int64)."""
    if len(seps) == 0:
        return 1 <= size <= 18
    inner = np.diff(seps)
    return (
        1 <= seps[0] <= 18
        and 1 <= size - 1 - seps[-1] <= 18
        and bool(((inner >= 2) & (inner <= 19)).all())
    )


def _parse_slow(rows: list[str]) -> np.ndarray:
    """Row-by-row parse that names the first bad row."""
    depth = rows[0].count(",") + 1
    out = np.empty((len(rows), depth), dtype=np.int64)
    for i, row in enumerate(rows):
        parts = row.split(",")
        if len(parts) != depth:
            raise _Fail(i, f"expected {depth} codes like the first entry, got {len(parts)}")
        for j, part in enumerate(parts):
            part = part.strip()
            if not (part.isascii() and part.isdigit()) or int(part) > _INT64_MAX:
                raise _Fail(i, f"code {part!r} is not a non-negative 64-bit integer")
            out[i, j] = int(part)
    return out


def _text_rows(text: str) -> tuple[list[str], Callable[[int], str]]:
    """Comma rows of a text catalog and a row -> ``line N`` labeller."""
    rows, linenos = [], []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("<"):
            try:
                line = _token_row(line)
            except _Fail as e:
                raise _Fail(lineno - 1, e.why) from None
        rows.append(_SEPARATORS.sub(",", line))
        linenos.append(lineno)
    return rows, lambda i: f"line {linenos[i]}"


def _token_row(line: str) -> str:
    """``<|sid_begin|><s_a_12><s_b_7><|sid_end|>`` -> ``12,7``."""
    body = line.removeprefix(SID_BEGIN_TOKEN).removesuffix(SID_END_TOKEN).replace(" ", "")
    pairs = CODE_TOKEN_RE.findall(body)
    letters = "".join(letter for letter, _ in pairs)
    if not pairs or CODE_TOKEN_RE.sub("", body) or letters != LEVEL_LETTERS[: len(pairs)]:
        raise _Fail(0, f"expected SID tokens <s_a_N><s_b_N>... in level order, got {line!r}")
    return ",".join(code for _, code in pairs)


def _decode_packed(packed: np.ndarray, size: int, depth: int) -> np.ndarray:
    """Base-``size`` digits of ``packed`` ``[N]`` as ``[N, depth]`` codes, most significant first."""
    if size**depth > _INT64_MAX:
        raise _Fail(0, f"{depth} levels of {size} codes do not fit a 64-bit packed integer")
    too_big = np.flatnonzero(packed >= size**depth)
    if too_big.size:
        raise _Fail(int(too_big[0]), f"packed SID exceeds {size}^{depth} - 1")
    powers = size ** np.arange(depth - 1, -1, -1, dtype=np.int64)
    return (packed[:, None] // powers) % size


def _list_rows(obj: list) -> np.ndarray:
    """``[[12, 7, 301], ...]`` -> ``[N, D]`` int64; raises ``_Fail`` naming the bad entry."""
    try:
        arr = np.array(obj)
    except ValueError:  # ragged
        arr = None
    if arr is not None and arr.ndim == 2 and arr.shape[1] and arr.dtype.kind in "iu":
        if arr.dtype.kind == "i" and (arr < 0).any():
            i = int(np.argwhere(arr < 0)[0, 0])
            raise _Fail(i, f"code {int(arr[i].min())} is not a non-negative integer")
        return arr.astype(np.int64)
    depth = None
    for i, row in enumerate(obj):
        if not isinstance(row, list) or not row:
            raise _Fail(i, f"expected a non-empty list of codes, got {row!r}")
        depth = len(row) if depth is None else depth
        if len(row) != depth:
            raise _Fail(i, f"expected {depth} codes like the first entry, got {len(row)}")
        for code in row:
            if type(code) is not int or not 0 <= code <= _INT64_MAX:
                raise _Fail(i, f"code {code!r} is not a non-negative 64-bit integer")
    return np.array(obj, dtype=np.int64)


def _pids(value: Any) -> Any:
    """RecIF ``[{"pid": 1, "count": 3}, ...]`` -> ``[1, ...]``; other values unchanged."""
    if isinstance(value, list) and all(isinstance(v, dict) and "pid" in v for v in value):
        return [v["pid"] for v in value]
    return value


def _parse(path: Path, data: Any, label: Callable[[int], str], parse: Callable) -> np.ndarray:
    if len(data) == 0:
        raise CatalogError(f"{path}: catalog holds no SIDs")
    try:
        return parse(data)
    except _Fail as e:
        raise CatalogError(f"{path}: {label(e.index)}: {e.why}") from None


_Read = tuple[np.ndarray, Callable[[int], str], "list | None"]


def _read(path: Path, layout: SidLayout | None, size: int | None, keep_values: bool) -> _Read:
    """Raw rows (range unchecked, duplicates kept), a row labeller, and per-row values."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogError(f"{path}: cannot read catalog: {e}") from None
    if text.lstrip()[:1] not in ("{", "["):
        return _read_text(path, text)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise CatalogError(
            f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    del text
    if isinstance(obj, list):
        return _parse(path, obj, lambda i: f"entry {i}", _list_rows), lambda i: f"entry {i}", None
    if not isinstance(obj, dict):
        raise CatalogError(f"{path}: expected a JSON object or list, got {type(obj).__name__}")
    keys = list(obj)
    values = list(obj.values()) if keep_values else None
    del obj

    def label(i: int) -> str:
        return f"key {keys[i]!r}"

    if keys and all("," not in k for k in keys):  # RecIF packed integers
        packed = _parse(path, keys, label, _parse_rows)[:, 0]
        depth = layout.num_levels if layout else RECIF_DEPTH
        size = size or RECIF_CODEBOOK_SIZE
        codes = _parse(path, packed, label, lambda p: _decode_packed(p, size, depth))
        return codes, label, [_pids(v) for v in values] if values is not None else None
    return _parse(path, keys, label, _parse_rows), label, values


def _read_text(path: Path, text: str) -> _Read:
    body = text.removesuffix("\n")
    codes = _parse_fast(body, body.count("\n") + 1) if body else None
    if codes is not None:  # plain "12,7,301" lines
        return codes, lambda i: f"line {i + 1}", None
    try:
        rows, label = _text_rows(text)
    except _Fail as e:
        raise CatalogError(f"{path}: line {e.index + 1}: {e.why}") from None
    return _parse(path, rows, label, _parse_rows), label, None


# -- public API -----------------------------------------------------------------------------


def load_catalog(
    path: str | Path,
    layout: SidLayout | None = None,
    codebook_size: int | None = None,
    keep_pids: bool = False,
) -> Catalog:
    """Load a catalog in any supported format (see the module docstring); duplicates merge.

    Every code must lie in ``[0, K)`` when ``K`` is known (``codebook_size`` or the layout's)
    and every SID must have the same depth, at most the layout's ``num_levels``. With
    ``keep_pids`` the per-SID values (item ids where the file has them) are kept in
    ``Catalog.pids``, merged over duplicates.
    """
    path = Path(path)
    if layout and codebook_size and layout.codebook_size != codebook_size:
        raise CatalogError(
            f"{path}: --codebook-size {codebook_size} disagrees with the layout's "
            f"{layout.codebook_size}"
        )
    size = codebook_size or (layout.codebook_size if layout else None)
    codes, label, values = _read(path, layout, size, keep_pids)
    if layout and codes.shape[1] == layout.num_levels + 1:
        codes = codes[:, :-1]  # trailing end code
    if layout and codes.shape[1] > layout.num_levels:
        raise CatalogError(
            f"{path}: SIDs have {codes.shape[1]} codes, more than the layout's "
            f"{layout.num_levels} levels"
        )
    if size is not None:
        bad = np.argwhere(codes >= size)
        if bad.size:
            row, level = (int(x) for x in bad[0])
            raise CatalogError(
                f"{path}: {label(row)}: code {codes[row, level]} at level {level} is outside "
                f"[0, {size})"
            )
    unique, inverse = unique_rows(codes)
    pids = _merge_values(values, inverse, len(unique)) if values is not None else None
    return Catalog(unique, str(path), pids)


def _merge_values(values: list, inverse: np.ndarray, n: int) -> list:
    merged: list[Any] = [None] * n
    for value, row in zip(values, inverse.tolist()):
        prev = merged[row]
        if prev is None:
            merged[row] = value
        elif isinstance(prev, list) and isinstance(value, list):
            merged[row] = prev + value
    return merged


def write_catalog_json(
    codes: np.ndarray, path: str | Path, values: Sequence[Any] | None = None
) -> None:
    """Write comma-key JSON ``{"12,7,301": value}``; ``value`` is ``{}`` unless given."""
    codes = np.asarray(codes, dtype=np.int64)
    key = '"' + ",".join(["%d"] * codes.shape[1]) + '": '
    if values is None:
        lines = [key % tuple(row) + "{}" for row in codes.tolist()]
    else:
        lines = [
            key % tuple(row) + json.dumps({} if v is None else v, separators=(",", ":"))
            for row, v in zip(codes.tolist(), values)
        ]
    Path(path).write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")


def add_catalog_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``flashrec catalog``: convert any catalog format to comma-key JSON."""
    parser.add_argument("--from", dest="src", required=True, help="catalog file, any format")
    parser.add_argument("--out", required=True, help="comma-key JSON to write")
    parser.add_argument("--sid", default=None, help="SID layout START:END/SIZE[,begin=ID,end=ID]")
    parser.add_argument(
        "--codebook-size", type=int, default=None, help="codes per level (K), for range checks"
    )


def run_catalog(args: argparse.Namespace) -> int:
    """``flashrec catalog``: load ``--from``, write ``--out``, print the count and depth."""
    try:
        layout = parse_sid_arg(args.sid) if args.sid else None
        catalog = load_catalog(args.src, layout, args.codebook_size, keep_pids=True)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_catalog_json(catalog.codes, args.out, catalog.pids)
    print(f"{len(catalog)} SIDs, depth {catalog.depth}: {catalog.source} -> {args.out}")
    return 0
