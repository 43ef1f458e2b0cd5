"""Response bodies for the two wire protocols, built from engine ``GenResult`` records.

Beams arrive best first and stay in that order: choice ``i`` / ``beam_results[i]`` is the
``i``-th best beam. Token counts: ``completion_tokens`` sums the tokens of every returned
beam; ``cached_tokens`` is the prompt prefix served from the radix cache.

The dict builders (``chat_completion``, ``generate_result``, ...) define the bodies; the
handlers send their ``*_json`` twins, the same dicts written by orjson (``dumps``: compact,
UTF-8, NaN and infinities as ``null``). With hundreds of beams the body is most of the
server's own time per request, and orjson writes it several times faster than ``json.dumps``
(``scripts/probes/body_bench.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson

from flashrec.engine.request import BeamColumns, BeamResult, GenResult


def num(x: float) -> float | None:
    """``x`` as a JSON-safe number: NaN and infinities become ``null`` (strict JSON)."""
    x = float(x)
    return x if math.isfinite(x) else None


def dumps(obj: Any) -> str:
    """The JSON text the server sends for ``obj``: compact, UTF-8, NaN and infinities as
    ``null``; TypeError for a value JSON has no form for."""
    return orjson.dumps(obj).decode()


def nums(xs: list[float]) -> list[float] | map:
    """``num`` of every value: ``xs`` itself where they are all finite ``float`` (the engine's
    scores: one pass in C instead of a call per value), else mapped."""
    if set(map(type, xs)) <= {float} and all(map(math.isfinite, xs)):
        return xs
    return map(num, xs)


def lists(rows: list[list[int]]) -> list[list[int]] | map:
    """Every row as a ``list``: ``rows`` itself where they all are (the engine's)."""
    return rows if set(map(type, rows)) <= {list} else map(list, rows)


def _columns(beams: list[BeamResult] | BeamColumns) -> zip:
    """Per beam, best first: (text, finish reason, sequence score, token ids, cumulative
    logprob) with the scores through ``num`` and the ids as a ``list``. The engine's
    ``BeamColumns`` give them column by column, without a beam object each."""
    cols = BeamColumns.from_beams(beams)
    texts = cols.texts() if cols is beams else [b.text for b in beams]  # each beam's own text
    return zip(
        texts, cols.finish_reasons, nums(cols.sequence_scores), lists(cols.token_ids),
        nums(cols.cum_logprobs),
    )  # fmt: skip


def _choices(result: GenResult, key: str) -> list[dict[str, Any]]:
    """The choices of a chat answer: ``message`` (whole) or ``delta`` (streamed) per beam."""
    return [
        {
            "index": i,
            key: {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": reason,
            "sglext": {"sequence_score": score, "token_ids": ids, "cum_logprob": cum},
        }
        for i, (text, reason, score, ids, cum) in enumerate(_columns(result.beams))
    ]


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
        "choices": _choices(result, "message"),
        "usage": usage(result),
    }


def chat_completion_json(result: GenResult, model: str, created: int | None = None) -> str:
    """``chat_completion``'s JSON text, as the handlers send it."""
    return dumps(chat_completion(result, model, created))


def chat_stream(result: GenResult, model: str, created: int | None = None) -> Iterator[bytes]:
    """SSE events of a streamed chat completion.

    Three events: one ``chat.completion.chunk`` holding every beam as a choice (``delta`` with
    the whole text and the finish reason), one chunk with empty ``choices`` and ``usage``, and
    ``data: [DONE]``.
    """
    created = int(time.time()) if created is None else created
    head = {"id": result.rid, "object": "chat.completion.chunk", "created": created, "model": model,
            **catalog_key(result)}  # fmt: skip
    yield sse({**head, "choices": chat_stream_choices(result)})
    yield sse({**head, "choices": [], "usage": usage(result)})
    yield b"data: [DONE]\n\n"


def chat_stream_choices(result: GenResult) -> list[dict[str, Any]]:
    """The choices of the first ``chat_stream`` chunk (one per beam, whole text as delta)."""
    return _choices(result, "delta")


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def finish_reason(reason: Any, token_ids: list[int]) -> dict[str, Any]:
    """SGLang's finish-reason object of one beam: ``{"type": "stop", "matched": <end token>}``
    or ``{"type": "length", "length": <generated tokens>}`` (``{"type": reason}`` otherwise)."""
    if reason == "stop":
        return {"type": "stop", "matched": token_ids[-1] if token_ids else None}
    if reason == "length":
        return {"type": "length", "length": len(token_ids)}
    return {"type": reason}


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
    for i, (text, reason, score, ids, cum) in enumerate(_columns(result.beams)):
        meta = _generate_meta(result, e2e_latency) if i == 0 else {}
        meta["finish_reason"] = finish_reason(reason, ids)
        meta["sequence_score"] = score
        meta["cum_logprob"] = cum
        beams.append({"output_ids": ids, "text": text, "meta_info": meta})
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
    """``generate_result``'s JSON text, as the handlers send it."""
    return dumps(generate_result(result, e2e_latency))


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
