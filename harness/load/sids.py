"""Semantic IDs in beam text: parsing, validity against the catalog, duplicates, quality.

A beam's text holds one SID as level tokens ``<s_a_12><s_b_7><s_c_301>``, optionally wrapped in
``<|sid_begin|>`` / ``<|sid_end|>``. A beam is *invalid* when it is malformed (anything else in
the text, a wrong number of levels, levels out of order) or its codes are not in the catalog.
A *duplicate* is a SID already returned earlier in the same response.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

SID_TOKEN = re.compile(r"<s_([a-z])_(\d+)>")
_WRAPPERS = re.compile(r"<\|sid_begin\|>|<\|sid_end\|>|\s+")

Sid = tuple[int, ...]


def parse_sid(text: str, levels: int) -> Sid | None:
    """The codes of a beam's SID, or None when the text is malformed."""
    tokens = SID_TOKEN.findall(text)
    if len(tokens) != levels:
        return None
    if [t[0] for t in tokens] != [chr(ord("a") + i) for i in range(levels)]:
        return None
    if _WRAPPERS.sub("", SID_TOKEN.sub("", text)):
        return None
    return tuple(int(code) for _, code in tokens)


def parse_sid_list(text: str, levels: int) -> list[Sid]:
    """All SIDs in a free text (e.g. a ground-truth answer), in order; partial groups dropped."""
    tokens = SID_TOKEN.findall(text)
    out: list[Sid] = []
    current: list[int] = []
    for letter, code in tokens:
        if letter == "a":
            current = []
        if ord(letter) - ord("a") == len(current):
            current.append(int(code))
            if len(current) == levels:
                out.append(tuple(current))
                current = []
        else:
            current = []
    return out


def format_sid(sid: Sid) -> str:
    """``(12, 7, 301)`` -> ``"12-7-301"`` (the records' text form)."""
    return "-".join(str(c) for c in sid)


def load_catalog_sids(path: str | Path, packed_base: int | None = None) -> set[Sid]:
    """The catalog's SIDs as a set of code tuples, read by ``flashrec.sid.catalog.load_catalog``
    (every format the engine reads, packed keys in the one decoder: base ``packed_base``,
    default RecIF's 8192), so that the harness and the server never read a file differently."""
    from flashrec.sid.catalog import load_catalog

    return {tuple(row) for row in load_catalog(path, packed_base=packed_base).codes.tolist()}


@dataclass(frozen=True)
class BeamCheck:
    """What one response's beams were: counts and the de-duplicated ranked SIDs."""

    beams: int
    invalid: int
    duplicates: int
    ranked: tuple[Sid, ...]  # valid-format SIDs, first occurrence kept, in rank order
    top1: str


class SidChecker:
    """Checks beams against a catalog (``None``: format only)."""

    def __init__(self, levels: int, catalog: set[Sid] | None = None) -> None:
        if catalog:
            depth = len(next(iter(catalog)))
            levels = depth
        self.levels = levels
        self.catalog = catalog

    def check(self, texts: list[str]) -> BeamCheck:
        """Validity and duplicates of one response's beam texts (best first)."""
        invalid = dup = 0
        seen: set[Sid] = set()
        ranked: list[Sid] = []
        for text in texts:
            sid = parse_sid(text, self.levels)
            if sid is None or (self.catalog is not None and sid not in self.catalog):
                invalid += 1
            if sid is None:
                continue
            if sid in seen:
                dup += 1
                continue
            seen.add(sid)
            ranked.append(sid)
        top1 = ""
        if texts:
            first = parse_sid(texts[0], self.levels)
            top1 = format_sid(first) if first else "invalid"
        return BeamCheck(len(texts), invalid, dup, tuple(ranked), top1)


def quality(ranked: tuple[Sid, ...], truth: tuple[Sid, ...], ks: list[int]) -> dict[str, float]:
    """hit / recall / NDCG / MRR at each k of a de-duplicated ranked list against ground truth."""
    want = set(truth)
    out: dict[str, float] = {}
    for k in ks:
        top = ranked[:k]
        hits = [i for i, sid in enumerate(top) if sid in want]
        dcg = sum(1.0 / math.log2(i + 2) for i in hits)
        idcg = sum(1.0 / math.log2(i + 2) for i in range(min(k, len(want))))
        out[f"hit@{k}"] = 1.0 if hits else 0.0
        out[f"recall@{k}"] = len(hits) / len(want) if want else 0.0
        out[f"ndcg@{k}"] = dcg / idcg if idcg else 0.0
        out[f"mrr@{k}"] = 1.0 / (hits[0] + 1) if hits else 0.0
    return out
