"""The fixed probe: one chat request, sent every N seconds, whose answer must not change.

Its answer is reduced to beams (text, best first) and their ``sglext.sequence_score``; every
later answer is compared with the first (with ``probe_key: catalog``, with the first answer
of the same ``catalog_hash``). Two answers are the same when they hold the same beams with
scores within ``tol`` of each other; a beam only one of them holds is allowed only where it
ties the other's cut-off (its score within ``tol`` of the other's last beam), since without
``--deterministic`` the batch a request shares moves scores by float rounding and may swap a
near tie. Any other difference is a change, recorded with its time and diff.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

PROBE_MESSAGES = [
    {"role": "user", "content": "Probe: a fixed history of watched, liked and shared items."}
]


@dataclass(frozen=True)
class Answer:
    """A probe's answer: beams best first with their scores, and the catalog it used."""

    beams: tuple[str, ...]
    scores: tuple[float, ...]
    catalog_hash: str | None = None

    def as_dict(self) -> dict:
        return {
            "beams": list(self.beams),
            "scores": list(self.scores),
            "catalog_hash": self.catalog_hash,
        }


def body(n: int, max_tokens: int) -> dict:
    """The probe's chat body: greedy beam search, ``n`` beams."""
    return {
        "model": "default",
        "messages": PROBE_MESSAGES,
        "n": n,
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }


def parse(data: dict) -> Answer:
    """A chat answer -> :class:`Answer` (ValueError when it has no scored beams)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices:
        raise ValueError("an answer with no choices")
    beams, scores = [], []
    for c in choices:
        score = (c.get("sglext") or {}).get("sequence_score")
        if score is None:
            raise ValueError("a choice without sglext.sequence_score")
        beams.append(c["message"]["content"] or "")
        scores.append(float(score))
    return Answer(tuple(beams), tuple(scores), data.get("catalog_hash"))


async def ask(
    session: aiohttp.ClientSession, base_url: str, n: int, max_tokens: int, timeout_s: float
) -> tuple[Answer | None, str, float]:
    """Send the probe: (answer or None, error text, latency in seconds)."""
    t0 = time.perf_counter()
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        url = f"{base_url}/v1/chat/completions"
        async with session.post(url, json=body(n, max_tokens), timeout=timeout) as r:
            raw = await r.read()
        if r.status != 200:
            return None, f"HTTP {r.status}: {raw[:200].decode(errors='replace')}", 0.0
        return parse(json.loads(raw)), "", time.perf_counter() - t0
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:300], 0.0
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"unreadable answer: {exc}"[:300], 0.0


def diff(ref: Answer, new: Answer, tol: float) -> list[str]:
    """How ``new`` differs from ``ref`` (empty: the same answer), one line per difference."""
    out = []
    if ref.catalog_hash != new.catalog_hash:
        out.append(f"catalog_hash {ref.catalog_hash} -> {new.catalog_hash}")
    a, b = dict(zip(ref.beams, ref.scores)), dict(zip(new.beams, new.scores))
    for beam in ref.beams:
        if beam in b and abs(a[beam] - b[beam]) > tol:
            out.append(f"score of {beam}: {a[beam]:.6g} -> {b[beam]:.6g}")
    for answer, other, word in ((a, b, "lost"), (b, a, "new")):
        cut = min(other.values()) if other else 0.0  # the other answer's last beam
        for beam, score in answer.items():
            if beam not in other and abs(score - cut) > tol:
                out.append(f"{word} beam {beam} (score {score:.6g})")
    if len(ref.beams) != len(new.beams):
        out.append(f"{len(ref.beams)} beams -> {len(new.beams)}")
    return out


class Probe:
    """The reference answer(s) and every change seen, with the time it was seen."""

    def __init__(self, tol: float, key: str = "none") -> None:
        self.tol, self.key = tol, key
        self.refs: dict[str | None, Answer] = {}
        self.sent = 0
        self.errors: list[dict] = []
        self.changes: list[dict] = []
        self.max_move = 0.0  # the largest score move of a beam two answers share, any probe

    def check(self, t_s: float, answer: Answer | None, error: str = "") -> bool:
        """Record one probe's outcome at ``t_s``; False when it failed or changed."""
        self.sent += 1
        if answer is None:
            self.errors.append({"t_s": round(t_s, 3), "error": error})
            return False
        k = answer.catalog_hash if self.key == "catalog" else None
        ref = self.refs.setdefault(k, answer)
        lines = diff(ref, answer, self.tol)
        new = dict(zip(answer.beams, answer.scores))
        moves = [abs(s - new[b]) for b, s in zip(ref.beams, ref.scores) if b in new]
        self.max_move = max([self.max_move, *moves])
        if lines:
            self.changes.append({"t_s": round(t_s, 3), "diff": lines, "answer": answer.as_dict()})
        return not lines

    @property
    def summary(self) -> dict:
        return {
            "sent": self.sent,
            "changes": len(self.changes),
            "errors": len(self.errors),
            "tolerance": self.tol,
            "max_score_move": self.max_move,
            "reference": {str(k): v.as_dict() for k, v in self.refs.items()},
            "change_log": self.changes,
            "error_log": self.errors,
        }
