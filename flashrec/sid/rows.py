"""SID rows: catalog entries as an ``[N, depth]`` int64 array, parsed from text, JSON lists or
packed integers, and sorted unique.

Parsers raise ``RowError(index, why)``; the catalog reader turns it into a ``CatalogError``
that names the file and the entry (``line 4``, ``key '1,2'``, ``row 7``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from flashrec.sid.layout import CODE_TOKEN_RE, LEVEL_LETTERS, SID_BEGIN_TOKEN, SID_END_TOKEN

INT64_MAX = np.iinfo(np.int64).max
# RecIF's sid2pid.json packs 3 codes base 8192: c1*8192^2 + c2*8192 + c3
RECIF_PACKED_BASE = 8192
RECIF_DEPTH = 3
_SEPARATORS = re.compile(r"[ \t]*,[ \t]*|[ \t]+")


class RowError(Exception):
    """Entry ``index`` (None: the file as a whole) is invalid because ``why``; ``where``, when
    given, names the entry in place of the reader's labeller."""

    def __init__(self, index: int | None, why: str, where: str | None = None) -> None:
        super().__init__(why)
        self.index, self.why, self.where = index, why, where


@dataclass(frozen=True, eq=False)
class RawCatalog:
    """A catalog file's entries as read: duplicates kept, codes not yet range-checked.

    ``codes[i]`` is entry ``i`` (``label(i)`` names it in messages); ``values[i]`` its value
    (item ids where the file has them) when kept; ``items`` the number of item ids the file
    lists, where it lists them; ``kind`` the format read; ``end_code_dropped`` is True when a
    trailing end code past the layout's levels was cut off every entry; ``packed_base`` the base
    its packed-integer keys were decoded in (None: it has none).
    """

    codes: np.ndarray
    label: Callable[[int], str]
    kind: str
    source: str
    values: list[Any] | np.ndarray | None = None
    items: int | None = None
    end_code_dropped: bool = False
    packed_base: int | None = None

    @property
    def depth(self) -> int:
        return int(self.codes.shape[1])

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    @cached_property
    def unique(self) -> tuple[np.ndarray, np.ndarray]:
        """``unique_rows(codes)``, sorted once for the report and the merged catalog alike."""
        return unique_rows(self.codes)


def unique_rows(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lexicographically sorted unique rows of ``codes [N, D]`` and, per input row, its output row.

    Rows pack into one int64 sort key when they fit (the common case), else ``np.lexsort``.
    """
    codes = np.asarray(codes, dtype=np.int64)
    n, depth = codes.shape
    if n == 0:
        return codes, np.zeros(0, dtype=np.int64)
    radix = int(codes.max()) + 1
    if codes.min() >= 0 and radix**depth <= INT64_MAX:
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


def parse_rows(rows: list[str]) -> np.ndarray:
    """``["12,7,301", ...]`` -> ``[N, D]`` int64; raises ``RowError`` naming the bad row."""
    codes = parse_fast("\n".join(rows), len(rows))
    return codes if codes is not None else _parse_slow(rows)


def parse_fast(text: str, num_rows: int) -> np.ndarray | None:
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
            raise RowError(i, f"expected {depth} codes like the first entry, got {len(parts)}")
        for j, part in enumerate(parts):
            part = part.strip()
            if not (part.isascii() and part.isdigit()) or int(part) > INT64_MAX:
                raise RowError(i, f"code {part!r} is not a non-negative 64-bit integer")
            out[i, j] = int(part)
    return out


def text_rows(text: str) -> tuple[list[str], Callable[[int], str]]:
    """Comma rows of a text catalog and a row -> ``line N`` labeller."""
    rows, linenos = [], []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("<"):
            try:
                line = _token_row(line)
            except RowError as e:
                raise RowError(lineno - 1, e.why) from None
        rows.append(_SEPARATORS.sub(",", line))
        linenos.append(lineno)
    return rows, lambda i: f"line {linenos[i]}"


def _token_row(line: str) -> str:
    """``<|sid_begin|><s_a_12><s_b_7><|sid_end|>`` -> ``12,7``."""
    body = line.removeprefix(SID_BEGIN_TOKEN).removesuffix(SID_END_TOKEN).replace(" ", "")
    pairs = CODE_TOKEN_RE.findall(body)
    letters = "".join(letter for letter, _ in pairs)
    if not pairs or CODE_TOKEN_RE.sub("", body) or letters != LEVEL_LETTERS[: len(pairs)]:
        raise RowError(0, f"expected SID tokens <s_a_N><s_b_N>... in level order, got {line!r}")
    return ",".join(code for _, code in pairs)


def decode_packed(packed: np.ndarray, base: int, depth: int) -> np.ndarray:
    """Base-``base`` digits of ``packed`` ``[N]`` as ``[N, depth]`` codes, most significant
    first. ``base`` is the one the file was packed in, never a model's codebook size: a digit
    beyond the codebook is then an inexpressible code, not another SID."""
    if base < 2:
        raise RowError(None, f"packed-key base {base} must be at least 2")
    if base**depth > INT64_MAX:
        raise RowError(None, f"{depth} levels of base {base} do not fit a 64-bit packed integer")
    too_big = np.flatnonzero(packed >= base**depth)
    if too_big.size:
        raise RowError(
            int(too_big[0]), f"packed SID exceeds {base}^{depth} - 1 (keys packed base {base})"
        )
    powers = base ** np.arange(depth - 1, -1, -1, dtype=np.int64)
    return (packed[:, None] // powers) % base


def decode_sid_keys(
    keys: list[str], depth: int = RECIF_DEPTH, base: int | None = None
) -> tuple[np.ndarray, bool]:
    """The one reading of SID keys (catalog files, sid2pid mappings): a key with commas is its
    codes (``"12,7,301"``), a key without is packed base ``base`` (default RecIF's 8192) into
    ``depth`` codes. Returns ``([N, D] codes, whether any key was packed)``; raises ``RowError``
    naming the first bad key (index into ``keys``)."""
    base = RECIF_PACKED_BASE if base is None else base
    comma = [("," in k) for k in keys]
    if all(comma):
        return parse_rows(keys), False
    if not any(comma):
        return decode_packed(parse_rows(keys)[:, 0], base, depth), True
    # a mix: each kind read as above, then put back in file order
    packed_at = [i for i, c in enumerate(comma) if not c]
    comma_at = [i for i, c in enumerate(comma) if c]
    out = np.empty((len(keys), depth), dtype=np.int64)
    unpack = lambda k: decode_packed(parse_rows(k)[:, 0], base, depth)  # noqa: E731
    out[packed_at] = _subset(unpack, keys, packed_at)
    rows = _subset(parse_rows, keys, comma_at)
    if rows.shape[1] != depth:
        why = f"expected {depth} codes like the packed keys, got {rows.shape[1]}"
        raise RowError(comma_at[0], why)
    out[comma_at] = rows
    return out, True


def _subset(parse: Callable[[list[str]], np.ndarray], keys: list[str], at: list[int]) -> np.ndarray:
    """``parse`` over ``keys[at]``; a ``RowError`` names the key's index in ``keys``."""
    try:
        return parse([keys[i] for i in at])
    except RowError as e:
        raise RowError(None if e.index is None else at[e.index], e.why, e.where) from None


def pack_sid(sid: Sequence[int], base: int = RECIF_PACKED_BASE) -> int:
    """``(c1, c2, c3)`` -> the packed key ``c1*base^2 + c2*base + c3`` (``decode_sid_keys``
    reads it back); ValueError for a code that base cannot hold."""
    out = 0
    for code in sid:
        if not 0 <= int(code) < base:
            raise ValueError(
                f"code {code} of SID {tuple(sid)} does not fit a packed key base {base}"
            )
        out = out * base + int(code)
    return out


def list_rows(obj: list) -> np.ndarray:
    """``[[12, 7, 301], ...]`` -> ``[N, D]`` int64; raises ``RowError`` naming the bad entry."""
    try:
        arr = np.array(obj)
    except ValueError:  # ragged
        arr = None
    if arr is not None and arr.ndim == 2 and arr.shape[1] and arr.dtype.kind in "iu":
        if arr.dtype.kind == "i" and (arr < 0).any():
            i = int(np.argwhere(arr < 0)[0, 0])
            raise RowError(i, f"code {int(arr[i].min())} is not a non-negative integer")
        return arr.astype(np.int64)
    depth = None
    for i, row in enumerate(obj):
        if not isinstance(row, list) or not row:
            raise RowError(i, f"expected a non-empty list of codes, got {row!r}")
        depth = len(row) if depth is None else depth
        if len(row) != depth:
            raise RowError(i, f"expected {depth} codes like the first entry, got {len(row)}")
        for code in row:
            if type(code) is not int or not 0 <= code <= INT64_MAX:
                raise RowError(i, f"code {code!r} is not a non-negative 64-bit integer")
    return np.array(obj, dtype=np.int64)
