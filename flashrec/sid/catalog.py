"""The catalog: the set of valid SIDs, loaded from any of the common file formats.

Formats, auto-detected from the file's first bytes, suffix and keys:

* comma-key JSON ``{"12,7,301": <anything>, ...}`` (values ignored; FlashRec writes ``{}`` or
  the item ids). When a layout is given and a key holds ``num_levels + 1`` codes, the last one
  is a trailing end code and is dropped (this holds for every format).
* RecIF packed-integer JSON (``sid2pid.json``) ``{"<int>": [{"pid": ..}, ..], ...}``: a key
  without a comma packs the codes base ``B``: ``a*B^2 + b*B + c``. ``B`` is the base the file
  was written in: RecIF's 8192 unless ``packed_base`` says otherwise, never the model's
  codebook size (a code the codebook cannot hold is then an inexpressible SID, not another
  SID); the depth is the layout's ``num_levels`` (default 3). ``rows.decode_sid_keys`` is the
  one decoder of keys, shared with the harness's sid2pid reader.
* RecIF ``pid2sid`` parquet (``.parquet`` or magic ``PAR1``): columns ``pid`` and ``sid`` (a
  list of codes), or one code column per level; see ``flashrec.sid.parquet``. Needs pyarrow.
* list-of-lists JSON ``[[12, 7, 301], ...]``.
* text, one SID a line: ``12,7,301``, ``12 7 301`` or ``<s_a_12><s_b_7><s_c_301>`` with or
  without ``<|sid_begin|>``/``<|sid_end|>``; blank lines and ``#`` comments are skipped.

Parsing is vectorised (one ``np.fromstring`` over all keys) with a per-entry fallback that
names the offending entry; every ``CatalogError`` starts with the file path. ``flashrec
catalog`` reports on a catalog (``catalog_report``) and converts it to comma-key JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flashrec.boundedread import FileLimitError, check_file, read_text
from flashrec.sid.catalog_report import CatalogReport, build_report
from flashrec.sid.layout import SidLayout, infer_sid_layout, parse_sid_arg
from flashrec.sid.parquet import is_parquet, read_pid2sid, row_label
from flashrec.sid.rows import (
    RECIF_DEPTH,
    RECIF_PACKED_BASE,
    RawCatalog,
    RowError,
    decode_sid_keys,
    list_rows,
    parse_fast,
    parse_rows,
    text_rows,
    unique_rows,
)

__all__ = [
    "Catalog",
    "CatalogError",
    "RECIF_PACKED_BASE",
    "RawCatalog",
    "add_catalog_args",
    "load_catalog",
    "read_raw_catalog",
    "run_catalog",
    "unique_rows",
    "write_catalog_json",
]


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


# -- reading --------------------------------------------------------------------------------


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
    except RowError as e:
        where = "" if e.index is None else f"{e.where or label(e.index)}: "
        raise CatalogError(f"{path}: {where}{e.why}") from None


def _read(
    path: Path, layout: SidLayout | None, packed_base: int | None, keep_values: bool
) -> RawCatalog:
    """Entries as read (range unchecked, duplicates kept), labelled, values kept on request."""
    try:  # a regular file within --max-catalog-bytes, read within its timeout (boundedread)
        check_file(path, "catalog")
        if is_parquet(path):
            return _read_parquet(path, keep_values)
        text = read_text(path, "catalog")
    except FileLimitError as e:
        raise CatalogError(str(e)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogError(f"{path}: cannot read catalog: {e}") from None
    if text.lstrip()[:1] not in ("{", "["):
        return _read_text(path, text)
    keys = _written_keys(text)
    if keys is not None:  # the layout write_catalog_json writes: no JSON objects built
        del text
        values: list[Any] | None = None  # every value an empty object
    else:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise CatalogError(
                f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
            ) from None
        del text
        if isinstance(obj, list):
            label = "entry {}".format
            return RawCatalog(
                _parse(path, obj, label, list_rows), label, "list-of-lists JSON", str(path)
            )
        if not isinstance(obj, dict):
            raise CatalogError(f"{path}: expected a JSON object or list, got {type(obj).__name__}")
        keys = list(obj)
        values = list(obj.values())
        del obj
    lists = values is not None and all(isinstance(v, list) for v in values)
    items = sum(map(len, values)) if lists else None

    def label(i: int) -> str:
        return f"key {keys[i]!r}"

    depth = layout.num_levels if layout else RECIF_DEPTH
    base = RECIF_PACKED_BASE if packed_base is None else packed_base
    codes, packed = _parse(path, keys, label, lambda k: decode_sid_keys(k, depth, base))
    kind = f"RecIF sid2pid JSON, packed keys base {base}" if packed else "comma-key JSON"
    pids = None
    if keep_values:
        pids = [{} for _ in keys] if values is None else [_pids(v) for v in values]
    return RawCatalog(
        codes, label, kind, str(path), pids, items, packed_base=base if packed else None
    )


# one entry a line as write_catalog_json writes it: '"12,7,301": {}', a comma after all but the last
_WRITTEN_ENTRY = re.compile(r'^"([0-9]+(?:,[0-9]+)*)": \{\},?$', re.M)


def _written_keys(text: str) -> list[str] | None:
    """The keys of a comma-key JSON file in exactly the layout ``write_catalog_json`` writes
    with empty values (``{``, one ``"a,b,c": {}`` entry a line, ``}``), in file order,
    duplicates merged as ``json.loads`` merges them; None for anything else, which
    ``json.loads`` then reads. It builds no object per entry."""
    if not text.startswith("{\n"):
        return None
    end = text.rstrip().rfind("}")
    body = text[2:end]
    n = body.count("\n")
    if end < 2 or text[end + 1 :].strip() or n == 0 or not body.endswith("{}\n"):
        return None
    if not _WRITTEN_ENTRY.match(body, 0, body.find("\n")):  # another layout: no full scan
        return None
    keys = _WRITTEN_ENTRY.findall(body)
    # every line an entry, and every entry but the last followed by a comma
    if len(keys) != n or body.count("{},\n") != n - 1:
        return None
    return keys if len(set(keys)) == n else list(dict.fromkeys(keys))


def _read_text(path: Path, text: str) -> RawCatalog:
    body = text.removesuffix("\n")
    codes = parse_fast(body, body.count("\n") + 1) if body else None
    if codes is not None:  # plain "12,7,301" lines
        return RawCatalog(codes, lambda i: f"line {i + 1}", "text", str(path))
    try:
        rows, label = text_rows(text)
    except RowError as e:
        raise CatalogError(f"{path}: line {e.index + 1}: {e.why}") from None
    return RawCatalog(_parse(path, rows, label, parse_rows), label, "text", str(path))


def _read_parquet(path: Path, keep_values: bool) -> RawCatalog:
    try:
        codes, pids, columns = read_pid2sid(path)
    except RowError as e:
        where = "" if e.where is None else f"{e.where}: "
        raise CatalogError(f"{path}: {where}{e.why}") from None

    def label(i: int) -> str:
        return row_label(i, pids)

    _parse(path, codes, label, lambda c: c)  # an empty file holds no SIDs
    kind = f"RecIF pid2sid parquet, SIDs from {columns}"
    kind += "" if pids is None else ", item ids from pid"
    values = pids if keep_values else None
    return RawCatalog(codes, label, kind, str(path), values, None if pids is None else len(pids))


# -- public API -----------------------------------------------------------------------------


def read_raw_catalog(
    path: str | Path,
    layout: SidLayout | None = None,
    codebook_size: int | None = None,
    keep_pids: bool = False,
    packed_base: int | None = None,
) -> RawCatalog:
    """A catalog file's entries, duplicates kept and codes not range-checked (for reports).

    A trailing end code (``num_levels + 1`` codes under a layout) is dropped; ``keep_pids``
    keeps each entry's value (item ids where the file has them). Packed-integer keys decode
    base ``packed_base`` (default RecIF's 8192), whatever the layout's codebook size.
    """
    path = Path(path)
    if layout and codebook_size and layout.codebook_size != codebook_size:
        raise CatalogError(
            f"{path}: --codebook-size {codebook_size} disagrees with the layout's "
            f"{layout.codebook_size}"
        )
    if packed_base is not None and packed_base < 2:
        raise CatalogError(f"{path}: --packed-base {packed_base} must be at least 2")
    raw = _read(path, layout, packed_base, keep_pids)
    if layout and raw.depth == layout.num_levels + 1:
        raw = dataclasses.replace(raw, codes=raw.codes[:, :-1], end_code_dropped=True)
    return raw


def load_catalog(
    path: str | Path,
    layout: SidLayout | None = None,
    codebook_size: int | None = None,
    keep_pids: bool = False,
    packed_base: int | None = None,
) -> Catalog:
    """Load a catalog in any supported format (see the module docstring); duplicates merge.

    Every code must lie in ``[0, K)`` when ``K`` is known (``codebook_size`` or the layout's):
    a SID with a code beyond it is inexpressible and the file is refused, counting them as
    ``flashrec catalog`` does. Every SID must have the same depth, at most the layout's
    ``num_levels``. With ``keep_pids`` the per-SID values (item ids where the file has them)
    are kept in ``Catalog.pids``, merged over duplicates. ``packed_base``: as
    ``read_raw_catalog``.
    """
    raw = read_raw_catalog(path, layout, codebook_size, keep_pids, packed_base)
    codes = raw.codes
    if layout and raw.depth > layout.num_levels:
        raise CatalogError(
            f"{path}: SIDs have {raw.depth} codes, more than the layout's "
            f"{layout.num_levels} levels"
        )
    size = codebook_size or (layout.codebook_size if layout else None)
    if size is not None and (codes >= size).any():
        report = build_report(raw, layout, size, examples=1)
        first = report.examples[0]
        raise CatalogError(
            f"{inexpressible_message(raw, report)}; first: {first.where}: "
            f"{','.join(map(str, first.sid))}: {first.why}"
        )
    return _merge(raw)


def inexpressible_message(raw: RawCatalog, report: CatalogReport) -> str:
    """``PATH: N of M SIDs cannot be expressed by the SID layout``, and for packed keys the
    base they were decoded in (a file packed in another base reads as codes beyond the
    codebook: the fix is the base, not the model)."""
    text = (
        f"{raw.source}: {report.inexpressible} of {report.sids} SIDs cannot be expressed by "
        f"the SID layout"
    )
    if raw.packed_base is not None:
        text += (
            f" (packed keys decoded base {raw.packed_base}; a file packed in another base "
            "needs --packed-base, or packed_base on /update_catalog)"
        )
    return text


def _merge(raw: RawCatalog) -> Catalog:
    unique, inverse = raw.unique
    if raw.values is None:
        return Catalog(unique, raw.source)
    if isinstance(raw.values, np.ndarray):  # one item id a row: a list of them per SID
        return Catalog(unique, raw.source, _group(raw.values, inverse, len(unique)))
    merged: list[Any] = [None] * len(unique)
    for value, row in zip(raw.values, inverse.tolist()):
        prev = merged[row]
        if prev is None:
            merged[row] = value
        elif isinstance(prev, list) and isinstance(value, list):
            merged[row] = prev + value
    return Catalog(unique, raw.source, merged)


def _group(values: np.ndarray, inverse: np.ndarray, n: int) -> list[list[Any]]:
    """``values[i]`` gathered by ``inverse[i]`` into ``n`` lists, file order within each."""
    order = np.argsort(inverse, kind="stable")
    flat = values[order].tolist()
    ends = np.cumsum(np.bincount(inverse, minlength=n)).tolist()
    return [flat[start:end] for start, end in zip([0, *ends[:-1]], ends)]


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


# -- flashrec catalog -----------------------------------------------------------------------


def add_catalog_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``flashrec catalog``: report on any catalog file, convert it to comma-key JSON."""
    parser.add_argument(
        "path", nargs="?", default=None, metavar="PATH", help="catalog file, any format"
    )
    parser.add_argument("--from", dest="src", default=None, metavar="PATH", help="the same as PATH")
    parser.add_argument(
        "--out", default=None, help="comma-key JSON to write (without it: the report only)"
    )
    parser.add_argument("--sid", default=None, help="SID layout START:END/SIZE[,begin=ID,end=ID]")
    parser.add_argument(
        "--model-path",
        default=None,
        help="checkpoint whose tokenizer defines the SID layout (as the engine infers it); "
        "--sid wins when both are given",
    )
    parser.add_argument(
        "--codebook-size", type=int, default=None, help="codes per level (K), for range checks"
    )
    parser.add_argument(
        "--packed-base",
        type=int,
        default=None,
        metavar="B",
        help="base the packed-integer keys were written in (a*B^2 + b*B + c); default "
        f"{RECIF_PACKED_BASE}, RecIF's sid2pid.json; never taken from the model's codebook size",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def _layout(args: argparse.Namespace) -> SidLayout | None:
    if args.sid:
        return parse_sid_arg(args.sid)
    if args.model_path:
        from transformers import AutoTokenizer

        return infer_sid_layout(AutoTokenizer.from_pretrained(args.model_path))
    return None


def run_catalog(args: argparse.Namespace) -> int:
    """``flashrec catalog [PATH | --from PATH]``: report on the file; write ``--out`` unless a
    SID is inexpressible.

    Exit status 1 on an unreadable catalog, a bad layout, or any SID the layout cannot express
    (then nothing is written); 2 when no file, or two different ones, are named.
    """
    given = [p for p in (getattr(args, "path", None), args.src) if p]
    if not given or len(set(given)) > 1:
        why = "no catalog file" if not given else f"two catalog files ({given[0]}, {given[1]})"
        print(f"error: {why}: name one, as PATH or --from PATH", file=sys.stderr)
        return 2
    src = given[0]
    try:
        layout = _layout(args)
        raw = read_raw_catalog(
            src, layout, args.codebook_size, bool(args.out), getattr(args, "packed_base", None)
        )
        report = build_report(raw, layout, args.codebook_size)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    written = not report.inexpressible and bool(args.out)
    if written:
        catalog = _merge(raw)
        write_catalog_json(catalog.codes, args.out, catalog.pids)
    if args.json:
        print(json.dumps(report.to_json() | {"out": args.out if written else None}))
    else:
        print(report.format())
        if written:
            print(f"{len(catalog)} SIDs, depth {catalog.depth}: {catalog.source} -> {args.out}")
    if report.inexpressible:
        print(
            f"error: {inexpressible_message(raw, report)}{'; nothing written' if args.out else ''}",
            file=sys.stderr,
        )
        return 1
    return 0
