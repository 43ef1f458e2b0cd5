"""Request and result records exchanged between the front ends and the engine."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from flashrec.prompt import load_tokenizer

# the largest temperature the engine can hold: temperatures become float32 tensors, and a
# larger one fails to convert (and, unchecked, would fail every request batched with it)
MAX_TEMPERATURE = 3.4028234663852886e38  # float32's largest finite value
MAX_SEED = 2**63  # seeds become int64 tensors: [0, 2**63)


def check_sampling(temperature: float, seed: int | None) -> None:
    """ValueError naming the field unless ``temperature`` and ``seed`` fit the tensors the
    engine makes of them (shared by the HTTP validation's ranges and the engine's checks)."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise ValueError(f"temperature must be a number, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and 0 <= temperature <= MAX_TEMPERATURE):
        raise ValueError(
            f"temperature must be finite and in [0, {MAX_TEMPERATURE:g}] (float32), "
            f"got {temperature!r}"
        )
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED
    ):
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")


def check_request_limits(r: GenRequest, max_rows: int, max_seq_len: int, pool_tokens: int) -> None:
    """ValueError for a request outside an engine's limits (beam rows, --max-seq-len, KV pool,
    the temperature and seed its tensors can hold); shared with the server process's view of
    an engine in its own process and with the scheduler's admission."""
    if r.n < 1 or r.n > max_rows:
        raise ValueError(f"n={r.n} must be in [1, {max_rows}] (--batch-slots)")
    if r.max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    if r.prompt_len > max_seq_len:
        raise ValueError(f"prompt of {r.prompt_len} tokens exceeds --max-seq-len {max_seq_len}")
    if r.prompt_len > pool_tokens:
        raise ValueError(f"prompt of {r.prompt_len} tokens exceeds the KV pool ({pool_tokens})")
    check_sampling(r.temperature, r.seed)


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
    # the catalog it decodes over, by name (``--sid-vocab-file NAME=PATH``; None: the default)
    catalog: str | None = None
    # what the waiting thread would do first with the result (the server: its answer body),
    # run by the engine thread instead when it has nothing else to do; its value is the
    # result's ``finished``. Never crosses to an engine process (RemoteEngine drops it).
    finisher: Callable[[GenResult], Any] | None = field(default=None, compare=False, repr=False)

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)


class BeamResult:
    """One returned beam, best first in ``GenResult.beams``.

    ``text_source`` is the text itself or a function of ``token_ids`` that makes it: the
    engine passes its detokenizer, so the text is built by whoever reads ``text`` (the HTTP
    handler, the CLI), not on the engine thread that retires the request.

    A plain class with ``__slots__``, not a frozen dataclass: the engine thread makes one per
    returned beam (4,096 for eight n=512 requests retiring together) and a frozen dataclass's
    ``__init__`` costs several times as much, time in which the GPU waits. Treat instances as
    read-only; equality compares the four data fields."""

    __slots__ = (
        "token_ids",
        "cum_logprob",
        "sequence_score",
        "finish_reason",
        "text_source",
        "_text",
    )

    def __init__(
        self,
        token_ids: list[int],
        cum_logprob: float,
        sequence_score: float,
        finish_reason: str,  # "stop" (produced <|sid_end|>) or "length"
        text_source: str | Callable[[list[int]], str] = "",
    ) -> None:
        self.token_ids = token_ids
        self.cum_logprob = cum_logprob
        self.sequence_score = sequence_score
        self.finish_reason = finish_reason
        self.text_source = text_source
        self._text: str | None = text_source if isinstance(text_source, str) else None

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self.text_source(self.token_ids)  # type: ignore[operator]
        return self._text

    def _key(self) -> tuple:
        return (self.token_ids, self.cum_logprob, self.sequence_score, self.finish_reason)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BeamResult):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # token_ids is a list

    def __repr__(self) -> str:
        return (
            f"BeamResult(token_ids={self.token_ids!r}, cum_logprob={self.cum_logprob!r}, "
            f"sequence_score={self.sequence_score!r}, finish_reason={self.finish_reason!r})"
        )


class BeamColumns(Sequence):
    """A request's returned beams, best first, held column by column: what the engine makes
    when it retires a request, what crosses the engine-process pipe and what the answer's JSON
    is written from, without one Python object per beam on the way.

    It reads as the list of ``BeamResult`` it stands for (``len``, indexing, iteration,
    equality with such a list), making each object on first access: per-beam objects would
    otherwise be made three times between the engine and the server process (engine objects,
    wire tuples, objects again), costing host time per wide request. Treat as read-only."""

    __slots__ = ("token_ids", "cum_logprobs", "sequence_scores", "finish_reasons", "text_source",
                 "_objs")  # fmt: skip

    def __init__(
        self,
        token_ids: list[list[int]],
        cum_logprobs: list[float],
        sequence_scores: list[float],
        finish_reasons: list[str],
        text_source: str | Callable[[list[int]], str] = "",
    ) -> None:
        n = len(token_ids)
        if not len(cum_logprobs) == len(sequence_scores) == len(finish_reasons) == n:
            raise ValueError("beam columns of different lengths")
        self.token_ids = token_ids
        self.cum_logprobs = cum_logprobs
        self.sequence_scores = sequence_scores
        self.finish_reasons = finish_reasons
        self.text_source = text_source
        self._objs: list[BeamResult | None] | None = None

    @classmethod
    def from_beams(
        cls, beams: Sequence[BeamResult], text_source: str | Callable[[list[int]], str] = ""
    ) -> BeamColumns:
        """The columns of a list of ``BeamResult`` (their own texts are not carried over:
        ``text_source`` makes the columns' texts)."""
        if isinstance(beams, BeamColumns):
            return beams
        return cls(
            [b.token_ids for b in beams], [b.cum_logprob for b in beams],
            [b.sequence_score for b in beams], [b.finish_reason for b in beams], text_source,
        )  # fmt: skip

    def texts(self) -> list[str]:
        """Every beam's text, in one pass (the same text each beam's object gives)."""
        src = self.text_source
        if isinstance(src, str):
            return [src] * len(self.token_ids)
        many = getattr(src, "texts", None)  # a source that reads every row at once (SidText)
        return many(self.token_ids) if many is not None else list(map(src, self.token_ids))

    def __len__(self) -> int:
        return len(self.token_ids)

    def _obj(self, i: int) -> BeamResult:
        if self._objs is None:
            self._objs = [None] * len(self.token_ids)
        b = self._objs[i]
        if b is None:
            b = self._objs[i] = BeamResult(
                self.token_ids[i], self.cum_logprobs[i], self.sequence_scores[i],
                self.finish_reasons[i], self.text_source,
            )  # fmt: skip
        return b

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._obj(k) for k in range(*i.indices(len(self)))]
        n = len(self.token_ids)
        if not -n <= i < n:
            raise IndexError("beam index out of range")
        return self._obj(i % n)

    def __iter__(self) -> Iterator[BeamResult]:
        return (self._obj(i) for i in range(len(self.token_ids)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BeamColumns):
            return (
                self.token_ids == other.token_ids
                and self.cum_logprobs == other.cum_logprobs
                and self.sequence_scores == other.sequence_scores
                and self.finish_reasons == other.finish_reasons
            )
        if isinstance(other, list):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BeamColumns({list(self)!r})"


@dataclass
class GenResult:
    rid: str
    beams: list[BeamResult] | BeamColumns
    prompt_tokens: int
    cached_tokens: int = 0
    error: str | None = None
    # seconds (queued: arrival -> admitted for prefill; engine: admitted -> retired)
    queue_s: float | None = None
    engine_s: float | None = None
    # time.monotonic() when the engine had the ranked beams on the host (engine_s ends here);
    # the server's Server-Timing "respond" phase runs from it to the answer's text being built
    done_at: float | None = None
    # time.monotonic() when the result reached the server process from an engine process of
    # its own (--engine-process); Server-Timing's "ipc" runs from done_at to here
    received_at: float | None = None
    # content hash of the catalog the request was decoded with (None: unconstrained); it
    # tells a client which side of a catalog hot reload its request started on
    catalog_hash: str | None = None
    # the request's ``finisher(self)`` where the engine thread ran it (None: it did not)
    finished: Any = None

    @property
    def completion_tokens(self) -> int:
        if isinstance(self.beams, BeamColumns):
            return sum(map(len, self.beams.token_ids))
        return sum(len(b.token_ids) for b in self.beams)


class EngineError(RuntimeError):
    """A batch failed inside the engine; only the requests of that batch see it."""


class QueueFullError(RuntimeError):
    """The waiting queue is at --max-queue-len."""


class ReloadBusyError(RuntimeError):
    """A catalog reload is already running (``POST /update_catalog`` answers 409)."""


class SidText:
    """The text of a beam's tokens: SID tokens from a table read once through the tokenizer
    (no tokenizer call per beam), anything else through ``tokenizer.decode``; "" without a
    tokenizer. ``BeamResult`` calls it when its ``text`` is first read. It lives here, with no
    torch import, so a process that only writes answers (``--respond-workers``) can use it."""

    def __init__(self, tokenizer, layout) -> None:
        self.tokenizer = tokenizer
        self.table = _sid_token_text(tokenizer, layout) if tokenizer is not None else {}
        self._model_path: str | None = None

    @classmethod
    def from_table(cls, table: dict[int, str], model_path: str | None) -> SidText:
        """The same text from a table read elsewhere: the tokenizer, needed only for tokens
        outside the table, is loaded from ``model_path`` on first need (None: such beams get
        "", as without a tokenizer)."""
        text = cls(None, None)
        text.table, text._model_path = dict(table), model_path
        return text

    def __call__(self, tokens: list[int]) -> str:
        try:  # map over the dict's own lookup: ~3x faster per beam than a generator
            return "".join(map(self.table.__getitem__, tokens))
        except KeyError:  # a token outside the SID range
            if self.tokenizer is None and self._model_path is not None:
                self.tokenizer = load_tokenizer(self._model_path)
            if self.tokenizer is None:
                return ""
            return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def texts(self, rows: list[list[int]]) -> list[str]:
        """``self(row)`` for every row. Rows of one length (a request's beams) are looked up as
        one run of tokens and joined in groups of that length, with no Python call per row
        (the wide answer's body builds every beam's text); any other rows, or a token outside
        the table, go one by one."""
        if rows:
            g = len(rows[0])
            if g and sum(map(len, rows)) == g * len(rows):
                run = map(self.table.__getitem__, chain.from_iterable(rows))
                try:
                    return list(map("".join, zip(*[run] * g)))
                except KeyError:
                    pass
        return list(map(self, rows))


def _sid_token_text(tokenizer, layout) -> dict[int, str]:
    """Text of every SID token (codes, begin, end), read once through the tokenizer."""
    lo, hi = layout.sid_range
    ids = list(range(lo, hi))
    return dict(zip(ids, tokenizer.convert_ids_to_tokens(ids)))
