"""One parity server's answers on disk (``parity/answers/<name>.json``), so that ``--resume``
after an interrupted stage (a lent GPU's call limit) asks again only the servers that had not
answered every case: the reference and the finished candidates are read back when what they
were asked (server arguments, model, catalog, prompts, n, tokens, protocols) is unchanged."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from harness.parity.compare import Beam
from harness.parity.fetch import CaseKey

Answers = dict[CaseKey, "list[Beam] | str"]


def asked_key(**asked: Any) -> str:
    """A digest of everything a server was asked and how it was started."""
    text = json.dumps(asked, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def save(path: Path, key: str, answers: Answers, meta: dict) -> None:
    """Write the answers (a failed case keeps its error text) with ``key`` and ``meta``."""
    rows = [
        [p, i, n, v if isinstance(v, str) else [[list(b.token_ids), b.score, b.text] for b in v]]
        for (p, i, n), v in answers.items()
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "saved_at": time.time(), "meta": meta, "rows": rows}))
    tmp.replace(path)  # whole or absent: a run killed while writing leaves no half file


def load(path: Path, key: str) -> tuple[Answers, dict] | None:
    """The answers saved under ``key`` when every case was answered (a case that failed, an
    out-of-memory say, is asked again), else None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("key") != key:
        return None
    out: Answers = {}
    for p, i, n, v in data["rows"]:
        if isinstance(v, str):
            return None
        out[(p, int(i), int(n))] = [Beam(tuple(t), float(s), x) for t, s, x in v]
    return (out, {**data.get("meta", {}), "saved_at": data.get("saved_at")}) if out else None
