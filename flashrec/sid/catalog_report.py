"""What a catalog holds and whether the model's tokenizer can express it.

``build_report`` reads a ``RawCatalog`` (entries as read, duplicates kept) against the SID
layout, when one is known: depth, unique SIDs and duplicates, the codes used per level, and
the SIDs the tokenizer cannot express: a code at or beyond the codebook size ``K``, or more
codes than the layout has levels. A catalog shallower than the layout is expressible (the
engine serves SIDs of the catalog's depth) and is noted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from flashrec.sid.layout import LEVEL_LETTERS, SidLayout
from flashrec.sid.rows import RawCatalog

EXAMPLES = 5


@dataclass(frozen=True)
class LevelCodes:
    """Codes used at one level, over the unique SIDs."""

    level: int
    distinct: int
    min: int
    max: int


@dataclass(frozen=True)
class Inexpressible:
    """One SID the tokenizer cannot express: where it is in the file, its codes, and why."""

    where: str
    sid: tuple[int, ...]
    why: str


@dataclass(frozen=True)
class CatalogReport:
    """Summary of one catalog file; ``inexpressible`` is None when no codebook size is known."""

    source: str
    kind: str
    depth: int
    entries: int
    sids: int
    items: int | None
    levels: tuple[LevelCodes, ...]
    end_code_dropped: bool
    layout: str | None
    num_levels: int | None
    codebook_size: int | None
    inexpressible: int | None
    examples: tuple[Inexpressible, ...]

    @property
    def duplicates(self) -> int:
        """Entries that repeat an earlier entry's SID."""
        return self.entries - self.sids

    @property
    def shallower(self) -> bool:
        """The catalog has fewer levels than the layout (served as shorter SIDs)."""
        return self.num_levels is not None and self.depth < self.num_levels

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["duplicates"] = self.duplicates
        out["shallower_than_layout"] = self.shallower
        for example in out["examples"]:
            example["sid"] = list(example["sid"])
        return out

    def format(self) -> str:
        """The human-readable summary, one fact a line."""
        lines = [
            f"catalog        {self.source} ({self.kind})",
            f"depth          {self.depth}"
            + (" (trailing end code dropped)" if self.end_code_dropped else ""),
            f"SIDs           {self.sids} unique of {_count(self.entries, 'entry')} "
            f"({_count(self.duplicates, 'duplicate')})",
        ]
        if self.items is not None:
            lines.append(f"item ids       {self.items}")
        for lv in self.levels:
            lines.append(
                f"level {_letter(lv.level):<8} {lv.distinct} distinct codes, {lv.min}..{lv.max}"
            )
        if self.layout is not None:
            lines.append(
                f"layout         --sid {self.layout} "
                f"({self.num_levels} levels of {self.codebook_size} codes)"
            )
            if self.shallower:
                lines.append(
                    f"               catalog is shallower than the layout's {self.num_levels} "
                    f"levels: served as {self.depth}-code SIDs"
                )
        elif self.codebook_size is not None:
            lines.append(f"codebook size  {self.codebook_size} (no layout: depth not checked)")
        else:
            lines.append("layout         unknown (give --sid or --model-path): codes not checked")
        if self.inexpressible is not None:
            lines.append(
                f"inexpressible  {_count(self.inexpressible, 'SID') if self.inexpressible else 'none'}"
            )
            lines += [f"  {e.where}: {','.join(map(str, e.sid))}: {e.why}" for e in self.examples]
            if self.inexpressible > len(self.examples):
                lines.append(f"  ... {self.inexpressible - len(self.examples)} more")
        return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{n} {noun if n == 1 else plural}"


def _letter(level: int) -> str:
    return LEVEL_LETTERS[level] if level < len(LEVEL_LETTERS) else str(level)


def build_report(
    raw: RawCatalog,
    layout: SidLayout | None = None,
    codebook_size: int | None = None,
    examples: int = EXAMPLES,
) -> CatalogReport:
    """Report on ``raw`` against ``layout`` and/or ``codebook_size`` (either may be None)."""
    unique, inverse = raw.unique
    size = codebook_size or (layout.codebook_size if layout else None)
    levels = tuple(
        LevelCodes(level, len(np.unique(col)), int(col.min()), int(col.max()))
        for level, col in enumerate(unique.T)
    )
    count, found = None, ()
    if layout is not None or size is not None:
        bad, why = _inexpressible_rows(raw.codes, layout, size)
        count = len(np.unique(inverse[bad]))
        found = _examples(raw, bad, inverse, why, examples)
    return CatalogReport(
        source=raw.source,
        kind=raw.kind,
        depth=raw.depth,
        entries=len(raw),
        sids=len(unique),
        items=raw.items,
        levels=levels,
        end_code_dropped=raw.end_code_dropped,
        layout=layout.to_arg() if layout else None,
        num_levels=layout.num_levels if layout else None,
        codebook_size=size,
        inexpressible=count,
        examples=found,
    )


def _inexpressible_rows(codes: np.ndarray, layout: SidLayout | None, size: int | None):
    """Rows the tokenizer cannot express and a row -> reason function."""
    depth = codes.shape[1]
    if layout is not None and depth > layout.num_levels:
        why = f"{depth} codes, more than the layout's {layout.num_levels} levels"
        return np.arange(len(codes)), lambda row: why
    if size is None:
        return np.zeros(0, dtype=np.int64), None
    beyond = codes >= size

    def why(row: int) -> str:
        level = int(np.argmax(beyond[row]))
        return (
            f"code {codes[row, level]} at level {_letter(level)} is at or beyond the "
            f"codebook size {size}"
        )

    return np.flatnonzero(beyond.any(axis=1)), why


def _examples(raw: RawCatalog, bad: np.ndarray, inverse: np.ndarray, why, n: int):
    """The first ``n`` distinct inexpressible SIDs, in file order."""
    seen: set[int] = set()
    out = []
    for row in bad.tolist():
        if len(out) == n:
            break
        if int(inverse[row]) not in seen:
            seen.add(int(inverse[row]))
            out.append(Inexpressible(raw.label(row), tuple(raw.codes[row].tolist()), why(row)))
    return tuple(out)
