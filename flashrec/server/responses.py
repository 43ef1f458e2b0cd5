"""Response bodies for the two wire protocols, built from engine ``GenResult`` records.

Beams arrive best first and stay in that order: choice ``i`` / ``beam_results[i]`` is the
``i``-th best beam. Token counts: ``completion_tokens`` sums the tokens of every returned
beam; ``cached_tokens`` is the prompt prefix served from the radix cache.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

from flashrec.engine.request import BeamResult, GenResult


def num(x: float) -> float | None:
    """``x`` as a JSON-safe number: NaN and infinities become ``null`` (strict JSON)."""
    x = float(x)
    return x if math.isfinite(x) else None


def sglext(beam: BeamResult) -> dict[str, Any]:
    """The per-choice SGLang extension object."""
    return {
        "sequence_score": num(beam.sequence_score),
        "token_ids": list(beam.token_ids),
        "cum_logprob": num(beam.cum_logprob),
    }


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


def chat_stream(result: GenResult, model: str, created: int | None = None) -> Iterator[bytes]:
    """SSE events of a streamed chat completion.

    Three events: one ``chat.completion.chunk`` holding every beam as a choice (``delta`` with
    the whole text and the finish reason), one chunk with empty ``choices`` and ``usage``, and
    ``data: [DONE]``.
    """
    created = int(time.time()) if created is None else created
    head = {"id": result.rid, "object": "chat.completion.chunk", "created": created, "model": model}
    choices = [
        {
            "index": i,
            "delta": {"role": "assistant", "content": beam.text},
            "logprobs": None,
            "finish_reason": beam.finish_reason,
            "sglext": sglext(beam),
        }
        for i, beam in enumerate(result.beams)
    ]
    yield sse({**head, "choices": choices})
    yield sse({**head, "choices": [], "usage": usage(result)})
    yield b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def generate_result(result: GenResult, e2e_latency: float) -> dict[str, Any]:
    """SGLang's beam-search /generate answer for one prompt."""
    best = result.beams[0].text if result.beams else ""
    return {
        "text": best,
        "meta_info": {
            "id": result.rid,
            "beam_results": [
                {
                    "text": beam.text,
                    "token_ids": list(beam.token_ids),
                    "meta_info": {
                        "sequence_score": num(beam.sequence_score),
                        "cum_logprob": num(beam.cum_logprob),
                        "finish_reason": beam.finish_reason,
                    },
                }
                for beam in result.beams
            ],
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "cached_tokens": result.cached_tokens,
            "e2e_latency": e2e_latency,
        },
    }
