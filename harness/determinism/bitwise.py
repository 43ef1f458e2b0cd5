"""Determinism records and their bit-for-bit comparison: the workload's items, what one
process answered for each, and drift of every process against process 0."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from harness.parity import make_prompts

DEFAULT_NS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Item:
    """One distinct request of the workload."""

    index: int
    messages: list[dict]
    text: str
    n: int


@dataclass
class Answer:
    """What one process returned for one request: beams as (token ids, score floats)."""

    rid: str = ""
    beams: list[tuple[tuple[int, ...], tuple[float, ...]]] = field(default_factory=list)
    error: str = ""


def make_workload(
    requests: int,
    ns: tuple[int, ...] = DEFAULT_NS,
    median_tokens: int = 96,
    seed: int = 0,
    system_prompt_tokens: int = 32,
    model_path: str | None = None,
) -> list[Item]:
    """``requests`` distinct synthetic prompts (shared system prompt), n cycling over ``ns``."""
    prompts = make_prompts(requests, median_tokens, seed, system_prompt_tokens, model_path)
    return [Item(p.index, p.messages, p.text, ns[i % len(ns)]) for i, p in enumerate(prompts)]


def parse_answer(protocol: str, data: Any) -> Answer:
    """Beams with every score field (sequence_score, cum_logprob when present) and the rid."""
    keys = ("sequence_score", "cum_logprob")
    if protocol == "chat":
        beams = [
            (
                tuple(c["sglext"].get("token_ids") or ()),
                tuple(c["sglext"][k] for k in keys if k in c["sglext"]),
            )
            for c in data["choices"]
        ]
        return _checked(str(data.get("id", "")), beams)
    if isinstance(data, list):
        data = data[0]
    meta = data["meta_info"]
    beams = [
        (  # SGLang's output_ids; token_ids from FlashRec servers before them
            tuple(b["output_ids"] if "output_ids" in b else b.get("token_ids") or ()),
            tuple(b["meta_info"][k] for k in keys if k in b["meta_info"]),
        )
        for b in meta["beam_results"]
    ]
    return _checked(str(meta.get("id", "")), beams)


def _checked(rid: str, beams: list) -> Answer:
    """An answer with nothing to compare (no beam, a beam without token ids) is an error of
    its request: two such answers would otherwise compare equal."""
    if not beams:
        return Answer(rid, beams, "an answer with no beams")
    if any(not ids for ids, _ in beams):
        return Answer(rid, beams, "a beam without token ids")
    return Answer(rid, beams)


# --------------------------------------------------------------------------- comparison


def bits(x: float) -> bytes:
    """The exact IEEE-754 double of a JSON float (Python's repr round-trips)."""
    return struct.pack("<d", x)


def identical(a: Answer, b: Answer) -> bool:
    """Bit-for-bit equality: same beams, same order, same token ids, same score bits."""
    if a.error or b.error or len(a.beams) != len(b.beams):
        return False
    for (ta, sa), (tb, sb) in zip(a.beams, b.beams):
        if ta != tb or len(sa) != len(sb) or any(bits(x) != bits(y) for x, y in zip(sa, sb)):
            return False
    return True


def drift(a: Answer, b: Answer) -> dict[str, Any]:
    """How ``b`` differs from the baseline ``a``."""
    ranks = max(len(a.beams), len(b.beams))
    changed = sum(
        1
        for i in range(ranks)
        if i >= len(a.beams) or i >= len(b.beams) or a.beams[i][0] != b.beams[i][0]
    )
    sa, sb = dict(a.beams), dict(b.beams)
    diffs = [abs(x - y) for k in sa.keys() & sb.keys() for x, y in zip(sa[k], sb[k])]
    return {
        "rank_changes": changed,
        "top1_changed": bool(a.beams and b.beams and a.beams[0][0] != b.beams[0][0]),
        "beams": [len(a.beams), len(b.beams)],
        "max_score_diff": max(diffs, default=0.0),
        "bits_only": changed == 0,
    }


def compare_processes(runs: list[list[Answer]], items: list[Item]) -> dict[str, Any]:
    """Every process against process 0; a request drifts when any process differs."""
    rows = []
    errors = sum(1 for run in runs for a in run if a.error)
    for i, item in enumerate(items):
        base = runs[0][i]
        worst = None
        for p in range(1, len(runs)):
            if identical(base, runs[p][i]):
                continue
            d = {"process": p, **drift(base, runs[p][i])}
            if worst is None or (d["rank_changes"], d["max_score_diff"]) > (
                worst["rank_changes"],
                worst["max_score_diff"],
            ):
                worst = d
        if worst is not None:
            rows.append({"index": item.index, "n": item.n, **worst})
    return {
        "processes": len(runs),
        "requests": len(items),
        "errors": errors,
        "drifting_requests": len(rows),
        "requests_with_rank_changes": sum(1 for r in rows if r["rank_changes"]),
        "top1_changes": sum(1 for r in rows if r["top1_changed"]),
        "max_score_diff": max((r["max_score_diff"] for r in rows), default=0.0),
        "drifting": rows,
    }
