"""Request handlers, the error middleware and the shared server state.

Every error leaves as an OpenAI-shaped JSON body (``flashrec.server.errors``); an unexpected
exception in a handler is a 500, never a dropped connection. Generation handlers are cancelled
by aiohttp when the client disconnects (``handler_cancellation=True`` on the runner); the
cancellation withdraws the request from the engine.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from flashrec.config import ServerConfig
from flashrec.engine.request import GenRequest, ReloadBusyError
from flashrec.profiler import ProfileController, ProfileError
from flashrec.server import protocol, responses, wire
from flashrec.server.backend import Backend
from flashrec.server.control import detached, in_flight
from flashrec.server.errors import NOT_FOUND, APIError, bad_request, busy, error_body
from flashrec.server.frontends import Snapshot
from flashrec.server.gcwatch import GcWatch
from flashrec.server.metrics import ServerMetrics
from flashrec.server.server_info import server_info_body

_log = logging.getLogger("flashrec.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass
class ServerState:
    """Everything the handlers share; lives in ``app[STATE]``."""

    backend: Backend
    config: ServerConfig
    metrics: ServerMetrics
    profiler: ProfileController
    model_name: str
    started: float = dataclasses.field(default_factory=time.time)
    gc: GcWatch | None = None  # installed by ``Server.run``
    # several front-end processes (--api-server-count): this one's index, and the handle that
    # gathers the others' snapshots (``frontends.FrontendGroup`` / ``frontends.Member``)
    frontend_index: int = 0
    frontends: Any = None
    # generation handlers running now; past the drain deadline they are cancelled and answer 503
    held: set[asyncio.Task] = dataclasses.field(default_factory=set)
    closing: bool = False  # the drain deadline has passed

    @property
    def limits(self) -> protocol.Limits:
        return self.backend.limits


STATE = web.AppKey("flashrec_state", ServerState)


def limits_for(engine: Any, config: ServerConfig) -> protocol.Limits:
    """The request limits implied by the engine and the configuration."""
    rows = int(engine.max_beam_rows)
    return protocol.Limits(
        max_beam_rows=rows,
        vocab_size=int(engine.vocab_size),
        max_seq_len=int(config.max_seq_len),
        default_n=max(1, min(int(config.beam_width), rows)),
        default_max_tokens=int(engine.layout.num_levels) + 1,
        max_batch=max(1, int(config.max_queue_len)),
    )


def model_name(config: ServerConfig) -> str:
    """``--served-model-name``, else the checkpoint directory name."""
    return config.served_model_name or Path(config.model_path).name or "flashrec"


# -- plumbing --------------------------------------------------------------------------------


async def read_json(request: web.Request, allow_empty: bool = False) -> Any:
    """The parsed body (``Content-Type`` is not checked: the body is JSON); the size, coding
    and time errors of ``wire.read_body``, 400 when it is not JSON."""
    cfg = request.app[STATE].config
    raw = await wire.read_body(request, int(cfg.max_body_bytes), float(cfg.body_timeout_s))
    if not raw.strip():
        if allow_empty:
            return {}
        raise bad_request("the request body is empty; expected a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"malformed JSON body: {exc}") from None


_OUTCOME = {400: "invalid", 413: "too_large", 503: "rejected"}


async def _generation(request: web.Request, endpoint: str, fn: Handler) -> web.StreamResponse:
    """Run a generation handler with outcome counting and latency recording."""
    st = request.app[STATE]
    t0 = time.perf_counter()
    task = asyncio.current_task()
    st.backend.active_handlers += 1
    st.held.add(task)
    try:
        resp = await fn(request)
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


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Shape every error as an OpenAI error body, count it; log unexpected exceptions as 500.
    While draining, every answer closes its connection (the client's next request opens a
    new one, which gets 503 until the listener closes)."""
    st = request.app[STATE]
    resp = await _answer(request, handler)
    if resp.status >= 400:
        st.metrics.count_error(resp.status)
    if st.backend.draining or resp.status == 408:  # a 408 closes its connection (wire.py)
        resp.force_close()
    return resp


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = NOT_FOUND if exc.status == 404 else "invalid_request_error"
        body = error_body(exc.reason or "error", exc.status, None, kind)
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return web.json_response(body, status=exc.status, headers=headers)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        _log.exception("unhandled error on %s %s", request.method, request.path)
        body = error_body(
            f"internal error: {type(exc).__name__}: {exc}", 500, None, "internal_error"
        )
        return web.json_response(body, status=500)


# -- generation ------------------------------------------------------------------------------


async def _chat(request: web.Request) -> web.StreamResponse:
    st = request.app[STATE]
    st.backend.check_admitting()
    body = await read_json(request)
    req = protocol.parse_chat(body, st.limits)
    t_tok = time.perf_counter()
    ids = await st.backend.build_prompt(
        "messages", messages=req.messages, chat_template_kwargs=req.chat_template_kwargs
    )
    t_tok = time.perf_counter() - t_tok
    p = req.params
    gen = GenRequest(
        rid=f"chatcmpl-{uuid.uuid4().hex}",
        input_ids=ids,
        n=p.n,
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        seed=p.seed,
    )
    (result,) = await st.backend.generate([gen])
    back = time.monotonic()  # the result is the handler's, on the event loop
    st.metrics.completion_tokens += result.completion_tokens
    st.metrics.cached_tokens += result.cached_tokens
    model = req.model or st.model_name
    if not req.stream:
        text = await st.backend.chat_json(result, model)
        timing = {"Server-Timing": server_timing(t_tok, [result], back)}
        return web.json_response(text=text, headers=timing)
    events = list(responses.chat_stream(result, model))
    timing = {"Server-Timing": server_timing(t_tok, [result], back)}
    return await _send_sse(request, iter(events), timing)


async def _generate(request: web.Request) -> web.StreamResponse:
    st = request.app[STATE]
    st.backend.check_admitting()
    t0 = time.perf_counter()
    body = await read_json(request)
    req = protocol.parse_generate(body, st.limits)
    t_tok = time.perf_counter()
    gens = []
    for i, prompt in enumerate(req.prompts):
        param = "input_ids" if prompt.input_ids is not None else "text"
        if req.batched:
            param = f"{param}[{i}]"
        if prompt.input_ids is not None:
            ids = await st.backend.build_prompt(param, input_ids=prompt.input_ids)
        else:
            ids = await st.backend.build_prompt(param, text=prompt.text)
        p = req.params
        gens.append(
            GenRequest(
                rid=uuid.uuid4().hex,
                input_ids=ids,
                n=p.n,
                max_tokens=p.max_tokens,
                temperature=p.temperature,
                seed=p.seed,
            )
        )
    t_tok = time.perf_counter() - t_tok  # prompt building (the requests are created at once)
    results = await st.backend.generate(gens)
    back = time.monotonic()  # the results are the handler's, on the event loop
    results = [responses.returned(r, req.params.num_return) for r in results]  # best n of k
    latency = time.perf_counter() - t0
    for r in results:
        st.metrics.completion_tokens += r.completion_tokens
        st.metrics.cached_tokens += r.cached_tokens
    if not req.stream:
        texts = list(await asyncio.gather(*(st.backend.generate_json(r, latency) for r in results)))
        text = f"[{', '.join(texts)}]" if req.batched else texts[0]
        timing = {"Server-Timing": server_timing(t_tok, results, back)}
        return web.json_response(text=text, headers=timing)
    outs = [responses.generate_result(r, latency) for r in results]
    out: Any = outs if req.batched else outs[0]
    events = [responses.sse(out), b"data: [DONE]\n\n"]
    timing = {"Server-Timing": server_timing(t_tok, results, back)}
    return await _send_sse(request, iter(events), timing)


def server_timing(tokenize_s: float, results: list, back: float | None = None) -> str:
    """The ``Server-Timing`` header (W3C) of a generation response, in ms: ``tokenize`` (the
    prompt built from messages / text), ``queue`` (submitted -> admitted for prefill),
    ``engine`` (admitted -> ranked beams on the host), ``ipc`` (with ``--engine-process``: from
    there to the result's arrival in the server process) and ``respond`` (from there to the
    answer's text: the beams' host objects, the hand-off to the event loop, JSON); for a
    batch, the slowest request's. ``handoff``, the part of ``respond`` up to ``back`` (when
    the handler held the results on the event loop: host objects and the loop's wake-up), is
    a detail of ``respond``, not a phase of its own. Call it once the answer is built. What
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
        now = time.monotonic()
        parts.append(("respond", max(0.0, now - min(done))))
        if back is not None:
            parts.append(("handoff", min(max(0.0, back - min(done)), parts[-1][1])))
    return ", ".join(f"{name};dur={sec * 1000.0:.3f}" for name, sec in parts)


async def _send_sse(request: web.Request, events: Any, headers: dict | None = None):
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            **(headers or {}),
        }
    )
    await resp.prepare(request)
    try:
        for event in events:
            await resp.write(event)
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the answer was ready; the client left before reading it
    return resp


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    return await _generation(request, "chat", _chat)


async def generate(request: web.Request) -> web.StreamResponse:
    """``POST /generate`` (SGLang beam protocol)."""
    return await _generation(request, "generate", _generate)


# -- control and introspection ---------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 ``{"status": "ok"}`` once warm; 503 before, while draining, and
    ``degraded`` (with a ``reason``) while a prompt has waited too long for a thread."""
    be = request.app[STATE].backend
    if be.healthy:
        reason = be.degraded()
        if reason is None:
            return web.json_response({"status": "ok"})
        return web.json_response({"status": "degraded", "reason": reason}, status=503)
    status = "draining" if be.draining else "starting"
    return web.json_response({"status": status}, status=503)


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the one served model."""
    st = request.app[STATE]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": st.model_name,
                    "object": "model",
                    "created": int(st.started),
                    "owned_by": "flashrec",
                    "root": st.config.model_path,
                    "max_model_len": st.config.max_seq_len,
                }
            ],
        }
    )


async def server_info(request: web.Request) -> web.Response:
    """``GET /get_server_info``: effective configuration, SID layout, limits, versions."""
    info = await server_info_body(request.app[STATE], request)
    return web.json_response(info, dumps=lambda o: json.dumps(o, default=str))


def snapshot(st: ServerState, copy_metrics: bool = True) -> Snapshot:
    """This front end's part of ``/metrics`` (on the event loop: its counters are copied, unless
    ``copy_metrics`` is False: read at once by this event loop, not sent to another front end)."""
    be = st.backend
    return Snapshot(
        frontend=st.frontend_index,
        metrics=copy.deepcopy(st.metrics) if copy_metrics else st.metrics,
        gc=st.gc.metrics() if st.gc is not None else None,
        inflight=len(be.inflight),
        ready=be.healthy,
        draining=be.draining,
    )


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text."""
    st = request.app[STATE]
    be = st.backend

    def engine_side() -> tuple[dict, str, dict | None]:
        # an engine process answers in one call over the pipe: off the event loop
        snapshot = getattr(be.loop, "metrics_snapshot", None)
        if snapshot is not None:
            return snapshot()
        return be.loop.stats(), st.profiler.state, None

    try:
        stats, profiler_state, engine_gc = await asyncio.to_thread(engine_side)
        others = await asyncio.to_thread(st.frontends.others) if st.frontends else []
    except Exception as exc:  # noqa: BLE001 - the engine process is gone: say so, not 500 text
        raise busy(f"the engine does not answer: {exc}") from None
    # alone, this front end's counters are rendered before the loop runs anything else
    snaps = sorted([snapshot(st, copy_metrics=bool(others)), *others], key=lambda s: s.frontend)
    extra = {
        "flashrec_ready": int(all(s.ready for s in snaps)),
        "flashrec_draining": int(any(s.draining for s in snaps)),
        "flashrec_http_inflight_requests": sum(s.inflight for s in snaps),
        "flashrec_profiler_active": int(profiler_state == "active"),
    }
    served = ServerMetrics.merged(s.metrics for s in snaps) if others else st.metrics
    text = served.render(
        stats,
        extra,
        next((s.gc for s in snaps if s.frontend == 0), None),
        engine_gc=engine_gc,
        frontends=[(s.frontend, s.metrics.served(), s.gc) for s in snaps] if others else (),
    )
    return web.Response(
        text=text,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


async def flush_cache(request: web.Request) -> web.Response:
    """``POST /flush_cache``: empty the radix prefix cache. Always succeeds: the tokens of
    running requests are referenced, not cached, and stay."""
    st = request.app[STATE]
    await asyncio.to_thread(st.backend.loop.flush_cache)
    return web.json_response({"success": True, "message": "Cache flushed."})


async def start_profile(request: web.Request) -> web.Response:
    """``POST /start_profile`` (body optional)."""
    st = request.app[STATE]
    body = await read_json(request, allow_empty=True)
    try:
        info = await asyncio.to_thread(st.profiler.start, protocol.require_object(body))
    except ProfileError as exc:
        raise bad_request(str(exc)) from None
    return web.json_response({"success": True, "message": "Start profiling.", **info})


async def stop_profile(request: web.Request) -> web.Response:
    """``POST /stop_profile``: stop, write the trace, answer with its path."""
    st = request.app[STATE]
    try:
        info = await asyncio.to_thread(st.profiler.stop)
    except ProfileError as exc:
        raise bad_request(str(exc)) from None
    return web.json_response({"success": True, "message": "Stop profiling.", **info})


async def update_catalog(request: web.Request) -> web.Response:
    """``POST /update_catalog {"path": ..., "packed_base": B}``: catalog hot reload. The file
    is loaded, validated and built off the engine thread, then swapped in between steps;
    requests in flight finish on their catalog. ``packed_base`` (optional): the base of the
    file's packed-integer keys (default ``--packed-base``, else 8192). 400 for a file that
    cannot serve (the old catalog keeps serving), 409 while another reload runs."""
    st = request.app[STATE]
    body = protocol.require_object(await read_json(request))
    path = body.get("path")
    if not isinstance(path, str) or not path:
        raise bad_request("'path' (a catalog file the server can read) is required", "path")
    packed_base = body.get("packed_base")
    if packed_base is not None and (type(packed_base) is not int or packed_base < 2):
        raise bad_request(
            "'packed_base' (the base the file's packed-integer keys were written in) must be "
            f"an integer >= 2, got {packed_base!r}",
            "packed_base",
        )
    reload = getattr(st.backend.loop, "reload_catalog", None)
    if reload is None:
        raise bad_request("this engine cannot reload its catalog")
    try:  # in flight: the drain waits for it, then 503; its thread holds no exit
        call = detached(reload, path, packed_base, name="flashrec-catalog-reload")
        info = await in_flight(st, call, "catalog reload")
    except ReloadBusyError as exc:
        raise APIError(str(exc), 409) from None
    except ValueError as exc:
        raise bad_request(str(exc), "path") from None
    return web.json_response(info)
