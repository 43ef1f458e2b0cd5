"""Response bodies for the two wire protocols, built from engine ``GenResult`` records.

Beams arrive best first and stay in that order: choice ``i`` / ``beam_results[i]`` is the
``i``-th best beam. Token counts: ``completion_tokens`` sums the tokens of every returned
beam; ``cached_tokens`` is the prompt prefix served from the radix cache.

The dict builders (``chat_completion``, ``generate_result``, ...) define the bodies. The
handlers send the ``*_json`` twins, which write the same text as ``json.dumps`` of those dicts
(same keys, order, separators, escaping and number formatting) without building one dict per
beam: with hundreds of beams, the per-beam dicts and the generic encoder were most of the
server's own time per request. A beam whose values are not of the plain types the engine
produces (``list`` of ``int`` token ids, ``float`` scores, ``str`` text and finish reason)
sends the whole body through the dict builder and ``json.dumps`` instead.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import chain, repeat
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

from flashrec.engine.request import BeamColumns, BeamResult, GenResult


def num(x: float) -> float | None:
    """``x`` as a JSON-safe number: NaN and infinities become ``null`` (strict JSON)."""
    x = float(x)
    return x if math.isfinite(x) else None


class _NotPlain(Exception):
    """A beam value outside the fast encoder's types; the caller falls back to json.dumps."""


_float_repr = float.__repr__  # what json.dumps writes for a finite float


def _json_num(x: Any) -> str:
    """``json.dumps(num(x))`` for a ``float`` ``x``."""
    if type(x) is not float:
        raise _NotPlain
    return _float_repr(x) if x - x == 0 else "null"  # x - x is nan for inf and nan


# One choice / beam as json.dumps writes it (default and compact separators), cut around its
# values; the field order is that of the dict builders below. Each beam is the pieces joined
# with its index, text, finish reason, sequence score, token ids and cumulative logprob.
def _pieces(compact: bool, key: str) -> tuple[str, ...]:
    c, s = (":", ",") if compact else (": ", ", ")
    return (
        f'{{"index"{c}',
        f'{s}"{key}"{c}{{"role"{c}"assistant"{s}"content"{c}',
        f'}}{s}"logprobs"{c}null{s}"finish_reason"{c}',
        f'{s}"sglext"{c}{{"sequence_score"{c}',
        f'{s}"token_ids"{c}',
        f'{s}"cum_logprob"{c}',
        "}}",
    )


# one /generate beam after the first: output ids, text, finish reason, score, cum logprob
_GENERATE_PIECES = (
    '{"output_ids": ', ', "text": ', ', "meta_info": {"finish_reason": ',
    ', "sequence_score": ', ', "cum_logprob": ', "}}",
)  # fmt: skip


def _columns(beams: list[BeamResult] | BeamColumns, compact: bool = False) -> tuple[list[str], ...]:
    """The JSON text of every beam's text, finish reason, sequence score, token ids and
    cumulative logprob, column by column: one C-level pass per column instead of a Python call
    per value. The engine's
    ``BeamColumns`` already hold the columns: no beam object is made. _NotPlain unless every
    value has the engine's plain type."""
    cols = BeamColumns.from_beams(beams)
    texts = cols.texts() if cols is beams else [b.text for b in beams]  # each beam's own text
    reasons, ids = cols.finish_reasons, cols.token_ids
    scores, cums = cols.sequence_scores, cols.cum_logprobs
    if (
        {*map(type, texts), *map(type, reasons)} - {str}
        or {*map(type, scores), *map(type, cums)} - {float}
        or set(map(type, ids)) - {list}
        or set(map(type, chain.from_iterable(ids))) - {int}
    ):
        raise _NotPlain
    if all(map(math.isfinite, scores)) and all(map(math.isfinite, cums)):
        score_txt, cum_txt = list(map(_float_repr, scores)), list(map(_float_repr, cums))
    else:  # NaN / infinity: null, value by value
        score_txt, cum_txt = list(map(_json_num, scores)), list(map(_json_num, cums))
    id_txt = list(map(repr, ids))  # "[1, 2]": json.dumps's text for a list of ints
    if compact:
        id_txt = [t.replace(" ", "") for t in id_txt]
    return (
        list(map(_json_str, texts)),
        list(map(_json_str, reasons)),
        score_txt,
        id_txt,
        cum_txt,
    )


def _chat_choices(result: GenResult, key: str, compact: bool) -> str:
    """The text of ``chat_completion``'s (compact: ``chat_stream``'s) choices; _NotPlain."""
    n = len(result.beams)
    texts, reasons, scores, ids, cums = _columns(result.beams, compact)
    p0, p1, p2, p3, p4, p5, p6 = _pieces(compact, key)
    parts = zip(
        repeat(p0, n), map(str, range(n)), repeat(p1), texts, repeat(p2), reasons,
        repeat(p3), scores, repeat(p4), ids, repeat(p5), cums, repeat(p6),
    )  # fmt: skip
    return "[" + ("," if compact else ", ").join(map("".join, parts)) + "]"


def _with_fallback(fast: Callable[[], str], slow: Callable[[], Any], **dumps_kw: Any) -> str:
    try:
        return fast()
    except _NotPlain:
        return json.dumps(slow(), **dumps_kw)


def sglext(beam: BeamResult) -> dict[str, Any]:
    """The per-choice SGLang extension object."""
    return {
        "sequence_score": num(beam.sequence_score),
        "token_ids": list(beam.token_ids),
        "cum_logprob": num(beam.cum_logprob),
    }


def catalog_key(result: GenResult) -> dict[str, Any]:
    """``{"catalog_hash": ...}``: the catalog the request decoded with (a hot reload may swap
    catalogs between requests); empty without one."""
    h = getattr(result, "catalog_hash", None)
    return {} if h is None else {"catalog_hash": h}


def usage(result: GenResult) -> dict[str, Any]:
    """OpenAI ``usage`` with ``prompt_tokens_details.cached_tokens``."""
    completion = result.completion_tokens
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }


def chat_completion(result: GenResult, model: str, created: int | None = None) -> dict[str, Any]:
    """A ``chat.completion`` object: one choice per beam, best first."""
    return {
        "id": result.rid,
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        **catalog_key(result),
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": beam.text},
                "logprobs": None,
                "finish_reason": beam.finish_reason,
                "sglext": sglext(beam),
            }
            for i, beam in enumerate(result.beams)
        ],
        "usage": usage(result),
    }


def chat_completion_json(result: GenResult, model: str, created: int | None = None) -> str:
    """``json.dumps(chat_completion(result, model, created))``, built per beam as text."""
    created = int(time.time()) if created is None else created

    def fast() -> str:
        choices = _chat_choices(result, "message", compact=False)
        head = {"id": result.rid, "object": "chat.completion", "created": created, "model": model,
                **catalog_key(result)}  # fmt: skip
        text = json.dumps(head)
        return f'{text[:-1]}, "choices": {choices}, "usage": {json.dumps(usage(result))}}}'

    return _with_fallback(fast, lambda: chat_completion(result, model, created))


def chat_stream(result: GenResult, model: str, created: int | None = None) -> Iterator[bytes]:
    """SSE events of a streamed chat completion.

    Three events: one ``chat.completion.chunk`` holding every beam as a choice (``delta`` with
    the whole text and the finish reason), one chunk with empty ``choices`` and ``usage``, and
    ``data: [DONE]``.
    """
    created = int(time.time()) if created is None else created
    head = {"id": result.rid, "object": "chat.completion.chunk", "created": created, "model": model,
            **catalog_key(result)}  # fmt: skip

    def fast() -> str:
        choices = _chat_choices(result, "delta", compact=True)
        return f'{json.dumps(head, separators=(",", ":"))[:-1]},"choices":{choices}}}'

    def slow() -> dict[str, Any]:
        return {**head, "choices": chat_stream_choices(result)}

    first = _with_fallback(fast, slow, separators=(",", ":"))
    yield b"data: " + first.encode() + b"\n\n"
    yield sse({**head, "choices": [], "usage": usage(result)})
    yield b"data: [DONE]\n\n"


def chat_stream_choices(result: GenResult) -> list[dict[str, Any]]:
    """The choices of the first ``chat_stream`` chunk (one per beam, whole text as delta)."""
    return [
        {
            "index": i,
            "delta": {"role": "assistant", "content": beam.text},
            "logprobs": None,
            "finish_reason": beam.finish_reason,
            "sglext": sglext(beam),
        }
        for i, beam in enumerate(result.beams)
    ]


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def finish_reason(reason: Any, token_ids: list[int]) -> dict[str, Any]:
    """SGLang's finish-reason object of one beam: ``{"type": "stop", "matched": <end token>}``
    or ``{"type": "length", "length": <generated tokens>}`` (``{"type": reason}`` otherwise)."""
    if reason == "stop":
        return {"type": "stop", "matched": token_ids[-1] if token_ids else None}
    if reason == "length":
        return {"type": "length", "length": len(token_ids)}
    return {"type": reason}


def _finish_json(beams: list[BeamResult] | BeamColumns) -> list[str]:
    """``json.dumps(finish_reason(...))`` of every beam; _NotPlain outside stop / length."""
    cols = BeamColumns.from_beams(beams)
    out = []
    for reason, ids in zip(cols.finish_reasons, cols.token_ids):
        if reason == "length" and type(reason) is str:
            out.append(f'{{"type": "length", "length": {len(ids)}}}')
        elif reason == "stop" and type(reason) is str:
            out.append(f'{{"type": "stop", "matched": {ids[-1] if ids else "null"}}}')
        else:
            raise _NotPlain
    return out


def _generate_meta(result: GenResult, e2e_latency: float) -> dict[str, Any]:
    """The request's own ``meta_info`` keys (the best beam's meta_info starts with them)."""
    return {
        "id": result.rid,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "cached_tokens": result.cached_tokens,
        "e2e_latency": e2e_latency,
        **catalog_key(result),
    }


def generate_result(result: GenResult, e2e_latency: float) -> dict[str, Any]:
    """SGLang's beam-search /generate answer for one prompt: the best beam at the top level
    (``text``, ``output_ids``, ``meta_info``) and every beam, best first, in
    ``meta_info.beam_results`` (``output_ids``, ``text``, ``meta_info`` with ``finish_reason``
    and ``sequence_score``). As upstream, the best beam's meta_info also carries the request's
    (id, token counts, latency); ``cum_logprob`` is ours."""
    beams = []
    for i, beam in enumerate(result.beams):
        meta = _generate_meta(result, e2e_latency) if i == 0 else {}
        meta["finish_reason"] = finish_reason(beam.finish_reason, beam.token_ids)
        meta["sequence_score"] = num(beam.sequence_score)
        meta["cum_logprob"] = num(beam.cum_logprob)
        beams.append({"output_ids": list(beam.token_ids), "text": beam.text, "meta_info": meta})
    if not beams:
        return {
            "text": "",
            "output_ids": [],
            "meta_info": {**_generate_meta(result, e2e_latency), "beam_results": []},
        }
    best = beams[0]
    return {
        "text": best["text"],
        "output_ids": best["output_ids"],
        "meta_info": {**best["meta_info"], "beam_results": beams},
    }


def generate_result_json(result: GenResult, e2e_latency: float) -> str:
    """``json.dumps(generate_result(result, e2e_latency))``, built per beam as text."""

    def fast() -> str:
        n = len(result.beams)
        if n == 0:
            raise _NotPlain  # nothing to gain
        texts, _, scores, ids, cums = _columns(result.beams)
        reasons = _finish_json(result.beams)
        head = json.dumps(_generate_meta(result, e2e_latency))[1:-1]
        meta0 = (
            f'{head}, "finish_reason": {reasons[0]}, "sequence_score": {scores[0]}, '
            f'"cum_logprob": {cums[0]}'
        )
        p0, p1, p2, p3, p4, p5 = _GENERATE_PIECES
        parts = zip(
            repeat(p0, n - 1), ids[1:], repeat(p1), texts[1:], repeat(p2), reasons[1:],
            repeat(p3), scores[1:], repeat(p4), cums[1:], repeat(p5),
        )  # fmt: skip
        first = f'{{"output_ids": {ids[0]}, "text": {texts[0]}, "meta_info": {{{meta0}}}}}'
        beams = ", ".join(chain((first,), map("".join, parts)))
        return (
            f'{{"text": {texts[0]}, "output_ids": {ids[0]}, '
            f'"meta_info": {{{meta0}, "beam_results": [{beams}]}}}}'
        )

    return _with_fallback(fast, lambda: generate_result(result, e2e_latency))


def returned(result: GenResult, n: int | None) -> GenResult:
    """``result`` with only its ``n`` best beams (all of them when ``n`` is None or larger):
    a /generate request searches ``beam_width`` beams and returns its ``n`` best."""
    beams = result.beams
    if n is None or n >= len(beams):
        return result
    if isinstance(beams, BeamColumns):
        top: list[BeamResult] | BeamColumns = BeamColumns(
            beams.token_ids[:n], beams.cum_logprobs[:n], beams.sequence_scores[:n],
            beams.finish_reasons[:n], beams.text_source,
        )  # fmt: skip
    else:
        top = list(beams[:n])
    return replace(result, beams=top)
