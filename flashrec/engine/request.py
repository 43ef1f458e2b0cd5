"""Request and result records exchanged between the front ends and the engine."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class GenRequest:
    """One beam-search request. ``input_ids`` is the full prompt and ends with <|sid_begin|>."""

    rid: str
    input_ids: list[int]
    n: int
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    arrival: float = field(default_factory=time.monotonic)

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class BeamResult:
    """One returned beam, best first in ``GenResult.beams``.

    ``text_source`` is the text itself or a function of ``token_ids`` that makes it: the
    engine passes its detokenizer, so the text is built by whoever reads ``text`` (the HTTP
    handler, the CLI), not on the engine thread that retires the request."""

    token_ids: list[int]
    cum_logprob: float
    sequence_score: float
    finish_reason: str  # "stop" (produced <|sid_end|>) or "length"
    text_source: str | Callable[[list[int]], str] = ""
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def text(self) -> str:
        src = self.text_source
        if isinstance(src, str):
            return src
        if "text" not in self._cache:
            self._cache["text"] = src(self.token_ids)
        return self._cache["text"]


@dataclass
class GenResult:
    rid: str
    beams: list[BeamResult]
    prompt_tokens: int
    cached_tokens: int = 0
    error: str | None = None
    # seconds (queued: arrival -> admitted for prefill; engine: admitted -> retired)
    queue_s: float | None = None
    engine_s: float | None = None
    # time.monotonic() when the engine had the ranked beams on the host (engine_s ends here);
    # the server's Server-Timing "respond" phase runs from it to the answer's text being built
    done_at: float | None = None

    @property
    def completion_tokens(self) -> int:
        return sum(len(b.token_ids) for b in self.beams)


class EngineError(RuntimeError):
    """A batch failed inside the engine; only the requests of that batch see it."""


class QueueFullError(RuntimeError):
    """The waiting queue is at --max-queue-len."""
