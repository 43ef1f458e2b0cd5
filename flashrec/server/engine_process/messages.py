"""What crosses the pipe between the server process and the engine process.

Every message is a ``typing.NamedTuple`` with named, typed fields. On the pipe it travels as
``encode(msg)``, a plain ``(tag, fields)`` tuple, and ``decode`` makes the typed message
again: a message class pickled as is costs a class reference and a module look-up on both
ends, per message, where a result per request should cost no more than a bare tuple.
Results carry the beams as columns and no callables (the server process makes the SID text
itself); exceptions cross as a kind and a message and are raised again as the same type.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING, Any, NamedTuple

from flashrec.engine.request import (
    BeamColumns,
    EngineError,
    GenResult,
    QueueFullError,
    ReloadBusyError,
)

if TYPE_CHECKING:
    from flashrec.engine.request import GenRequest
    from flashrec.sid.layout import SidLayout


# ---- server process -> engine process ------------------------------------------------------
class Submit(NamedTuple):
    """Run a request; a ``Result`` or a ``RequestError`` with its ``rid`` answers it."""

    req: GenRequest


class Cancel(NamedTuple):
    """Drop a request (a client that went away); its future fails with ``CancelledError``."""

    rid: str


class Call(NamedTuple):
    """Run the engine-process function ``name(*args)``; a ``Reply`` or ``CallError`` answers."""

    call_id: int
    name: str
    args: tuple


class Stop(NamedTuple):
    """From the server process: stop the engine loop and exit (sent once it drained); from
    another front end (``--api-server-count``): it leaves, the engine serves on."""


# ---- engine process -> server process ------------------------------------------------------
class Ready(NamedTuple):
    """The engine is built and its loop runs: the limits the server process checks against."""

    server_info: dict[str, Any]
    layout: SidLayout
    vocab_size: int
    max_beam_rows: int
    pool_tokens: int
    pid: int


class Failed(NamedTuple):
    """The engine could not be built; the process exits after sending this."""

    message: str
    traceback: str


class Result(NamedTuple):
    """A finished request: ``GenResult`` with its beams as the four ``BeamColumns`` columns."""

    rid: str
    token_ids: list[list[int]]
    cum_logprobs: list[float]
    sequence_scores: list[float]
    finish_reasons: list[str]
    prompt_tokens: int
    cached_tokens: int
    error: str | None
    queue_s: float | None
    engine_s: float | None
    done_at: float | None
    catalog_hash: str | None = None  # the catalog the request decoded with
    weights_hash: str | None = None  # the weights it ran on (``EngineLoop._resolve``)


class RequestError(NamedTuple):
    """A request that failed (refused, cancelled, or its batch failed in the engine)."""

    rid: str
    kind: str
    message: str

    @classmethod
    def of(cls, rid: str, exc: BaseException) -> RequestError:
        return cls(rid, error_kind(exc), describe(exc))

    def exception(self) -> BaseException:
        return make_error(self.kind, self.message)


class Reply(NamedTuple):
    """The value a ``Call`` returned."""

    call_id: int
    value: Any


class CallError(NamedTuple):
    """The exception a ``Call`` raised."""

    call_id: int
    kind: str
    message: str

    @classmethod
    def of(cls, call_id: int, exc: BaseException) -> CallError:
        return cls(call_id, error_kind(exc), describe(exc))

    def exception(self) -> BaseException:
        return make_error(self.kind, self.message)


Message = Submit | Cancel | Call | Stop | Ready | Failed | Result | RequestError | Reply | CallError


# ---- the wire ----------------------------------------------------------------------------
# every kind of message, in tag order (a tag is the index here; both ends run the same code)
_KINDS: tuple[type, ...] = (
    Submit, Cancel, Call, Stop, Ready, Failed, Result, RequestError, Reply, CallError
)  # fmt: skip
_TAGS: dict[type, int] = {kind: tag for tag, kind in enumerate(_KINDS)}


def encode(msg: Message) -> tuple[int, tuple]:
    """``msg`` as it crosses the pipe: its kind's tag and its fields, as plain tuples."""
    return _TAGS[type(msg)], tuple(msg)


def decode(wire: tuple[int, tuple]) -> Message:
    """The typed message of ``encode``'s output."""
    tag, fields = wire
    return tuple.__new__(_KINDS[tag], fields)  # what ``_make`` does, without a Python call


# ---- results -----------------------------------------------------------------------------
def result_to_wire(res: GenResult) -> Result:
    """``res`` as a ``Result`` message (the beams' columns taken as they are)."""
    b = BeamColumns.from_beams(res.beams)
    fields = (
        res.rid, b.token_ids, b.cum_logprobs, b.sequence_scores, b.finish_reasons,
        res.prompt_tokens, res.cached_tokens, res.error, res.queue_s, res.engine_s, res.done_at,
        res.catalog_hash, getattr(res, "weights_hash", None),
    )  # fmt: skip
    # Result(*fields), without the Python-level __new__ of a NamedTuple: one per request
    return tuple.__new__(Result, fields)


def result_from_wire(msg: Result, text: Callable[[list[int]], str] | str = "") -> GenResult:
    """The inverse of ``result_to_wire``; ``text`` makes each beam's text from its tokens."""
    beams = BeamColumns(
        msg.token_ids, msg.cum_logprobs, msg.sequence_scores, msg.finish_reasons, text
    )
    res = GenResult(
        msg.rid,
        beams,
        msg.prompt_tokens,
        msg.cached_tokens,
        error=msg.error,
        queue_s=msg.queue_s,
        engine_s=msg.engine_s,
        done_at=msg.done_at,
        catalog_hash=msg.catalog_hash,
    )
    if msg.weights_hash is not None:
        res.weights_hash = msg.weights_hash  # type: ignore[attr-defined]
    return res


# ---- exceptions --------------------------------------------------------------------------
# the kind sent for a failed request or call, and the exception each becomes again; and
# "profile": ProfileError (imported late: the profiler imports torch)
_ERRORS: dict[str, type[BaseException]] = {
    "cancelled": CancelledError,
    "queue_full": QueueFullError,
    "reload_busy": ReloadBusyError,
    "value": ValueError,
    "engine": EngineError,
    "other": RuntimeError,
}


def error_kind(exc: BaseException) -> str:
    """The kind under which ``exc`` crosses (``"other"`` for a type not listed)."""
    from flashrec.profiler import ProfileError

    if isinstance(exc, CancelledError):
        return "cancelled"
    if isinstance(exc, QueueFullError):
        return "queue_full"
    if isinstance(exc, ReloadBusyError):
        return "reload_busy"
    if isinstance(exc, ProfileError):
        return "profile"
    if isinstance(exc, EngineError):
        return "engine"
    if isinstance(exc, ValueError):
        return "value"
    return "other"


def make_error(kind: str, message: str) -> BaseException:
    """The exception of ``kind`` again (a ``RuntimeError`` for ``"other"``)."""
    if kind == "profile":
        from flashrec.profiler import ProfileError

        return ProfileError(message)
    return _ERRORS.get(kind, RuntimeError)(message)


def describe(exc: BaseException) -> str:
    """The message sent: the text alone for the known kinds, with the type for the rest."""
    if isinstance(
        exc, CancelledError | QueueFullError | ReloadBusyError | ValueError | EngineError
    ):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
