"""The two generation endpoints, ``POST /v1/chat/completions`` and ``POST /generate``: parse
the body, hand it to the request path (``Backend.answer``), send the answer with its
``Server-Timing``; outcomes and latency counted per endpoint.

Generation handlers are cancelled by aiohttp when the client disconnects
(``handler_cancellation=True`` on the runner); the cancellation withdraws the request from the
engine. Past the drain deadline the shutdown cancels them too, and they answer 503.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from aiohttp import web

from flashrec.engine.request import GenResult
from flashrec.server import protocol
from flashrec.server.errors import APIError, busy
from flashrec.server.handlers import STATE
from flashrec.server.protocol import ChatRequest, GenerateRequest, Limits
from flashrec.server.wire import read_json

Parse = Callable[[object, Limits], ChatRequest | GenerateRequest]

_OUTCOME = {400: "invalid", 413: "too_large", 503: "rejected"}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    return await _generation(request, "chat", protocol.parse_chat)


async def generate(request: web.Request) -> web.StreamResponse:
    """``POST /generate`` (SGLang beam protocol)."""
    return await _generation(request, "generate", protocol.parse_generate)


async def _generation(request: web.Request, endpoint: str, parse: Parse) -> web.StreamResponse:
    """Run a generation request with outcome counting and latency recording."""
    st = request.app[STATE]
    t0 = time.perf_counter()
    task = asyncio.current_task()
    assert task is not None
    st.backend.active_handlers += 1
    st.held.add(task)
    try:
        resp = await _respond(request, parse)
    except APIError as exc:
        outcome = _OUTCOME.get(exc.status, "error" if exc.status >= 500 else "invalid")
        st.metrics.count(endpoint, outcome)
        return exc.response()
    except asyncio.CancelledError:
        if st.closing:  # cancelled by the shutdown, not by its client: it gets an answer
            task.uncancel()
            st.metrics.count(endpoint, "rejected")
            return busy("the server shut down before this request finished").response()
        st.metrics.count(endpoint, "cancelled")
        raise
    except Exception:
        st.metrics.count(endpoint, "error")  # the middleware answers 500
        raise
    finally:
        st.backend.active_handlers -= 1
        st.held.discard(task)
    st.metrics.count(endpoint, "success")
    st.metrics.observe_latency(endpoint, time.perf_counter() - t0)
    return resp


async def _respond(request: web.Request, parse: Parse) -> web.StreamResponse:
    st = request.app[STATE]
    st.backend.check_admitting()
    t0 = time.perf_counter()  # a /generate answer's e2e_latency counts from here
    req = parse(await read_json(request, st.config), st.limits)
    ans = await st.backend.answer(req, st.model_name, t0)
    timing = {"Server-Timing": server_timing(ans.tokenize_s, ans.results, ans.back, ans.back_cpu)}
    timing.update(weights_header(ans.results))
    if isinstance(ans.body, str):
        return web.json_response(text=ans.body, headers=timing)
    return await _send_sse(request, ans.body, timing)


def server_timing(
    tokenize_s: float,
    results: list[GenResult],
    back: float | None = None,
    back_cpu: float | None = None,
) -> str:
    """The ``Server-Timing`` header (W3C) of a generation response, in ms: ``tokenize`` (the
    prompt built from messages / text), ``queue`` (submitted -> admitted for prefill),
    ``engine`` (admitted -> ranked beams on the host), ``ipc`` (with ``--engine-process``: from
    there to the result's arrival in the server process) and ``respond`` (from there to the
    answer's text: the beams' host objects, the hand-off to the event loop, JSON); for a
    batch, the slowest request's. ``handoff``, the part of ``respond`` up to ``back`` (when
    the handler held the results on the event loop: host objects and the loop's wake-up; an
    answer body the idle engine thread built, ``FLASHREC_ANSWER_ON_ENGINE``), is
    a detail of ``respond``, not a phase of its own; so is ``body_cpu``, the event loop
    thread's CPU time from ``back`` on (``back_cpu``, its ``thread_time`` then; with other
    requests' work if the loop ran any meanwhile): against the rest of ``respond`` it tells
    code time from waits. Call it once the answer is built. What
    the client measures beyond the phases' sum is HTTP and the client's own event loop."""
    queue = max((r.queue_s or 0.0) for r in results) if results else 0.0
    engine = max((r.engine_s or 0.0) for r in results) if results else 0.0
    parts = [("tokenize", tokenize_s), ("queue", queue), ("engine", engine)]
    done = [r.done_at for r in results if r.done_at is not None]
    received = [r.received_at for r in results if r.received_at is not None]
    if done and len(received) == len(results):  # an engine process: the pipe, then respond
        parts.append(("ipc", max(0.0, max(b - a for a, b in zip(done, received)))))
        done = received
    if done:
        now, cpu_now = time.monotonic(), time.thread_time()  # together: body_cpu <= the wall
        parts.append(("respond", max(0.0, now - min(done))))
        if back is not None:
            parts.append(("handoff", min(max(0.0, back - min(done)), parts[-1][1])))
        if back_cpu is not None:
            parts.append(("body_cpu", max(0.0, cpu_now - back_cpu)))
    return ", ".join(f"{name};dur={sec * 1000.0:.3f}" for name, sec in parts)


def weights_header(results: list[GenResult]) -> dict[str, str]:
    """``X-FlashRec-Weights-Hash``: the content hash of the weights the request ran on (a
    batch's requests all ran between the same two weight updates); none from an engine that
    does not say."""
    h = next((getattr(r, "weights_hash", None) for r in results), None)
    return {} if h is None else {"X-FlashRec-Weights-Hash": h}


async def _send_sse(
    request: web.Request, events: Iterable[bytes], headers: dict[str, str]
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await resp.prepare(request)
    try:
        for event in events:
            await resp.write(event)
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the answer was ready; the client left before reading it
    return resp
