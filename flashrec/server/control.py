"""The control and introspection endpoints: ``/health``, ``/v1/models``, ``/get_server_info``
(also ``/server_info``), ``/model_info`` (also ``/get_model_info``), ``/metrics``,
``/flush_cache``, ``/start_profile``, ``/stop_profile``, ``/update_catalog``,
``/rollback_catalog``.

A control call that may run long (a catalog reload) runs on a daemon thread that no exit waits
for (``detached``), and in flight like a generation (``in_flight``), so that the drain waits for
it up to ``--shutdown-timeout-s`` and then answers it 503.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from flashrec.config.engine import unknown_catalog
from flashrec.engine.request import ReloadBusyError
from flashrec.profiler import ProfileError
from flashrec.server import protocol
from flashrec.server.errors import APIError, bad_request, busy
from flashrec.server.frontends import Snapshot
from flashrec.server.handlers import STATE, ServerState
from flashrec.server.metrics import ServerMetrics
from flashrec.server.server_info import server_info_body
from flashrec.server.wire import read_json

T = TypeVar("T")


def detached(fn: Callable[..., T], *args: Any, name: str) -> asyncio.Future[T]:
    """``fn(*args)`` on a daemon thread of its own, as an awaitable: unlike ``to_thread``
    (the loop's executor, joined at exit), a call that never returns cannot hold the
    process's exit."""
    aloop = asyncio.get_running_loop()
    fut = aloop.create_future()

    def settle(value: T | None, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)

    def run() -> None:
        try:
            value, exc = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - raised again on the awaiting side
            value, exc = None, e
        try:
            aloop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:
            pass  # the event loop is closed: nobody awaits it any more

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


async def in_flight(st: ServerState, call: asyncio.Future[T], what: str) -> T:
    """Await ``call`` as an in-flight request of the server whose state is ``st``:
    past the drain deadline it is cancelled and this raises 503 naming ``what``."""
    task = asyncio.current_task()
    assert task is not None
    st.backend.active_handlers += 1
    st.held.add(task)
    try:
        return await call
    except asyncio.CancelledError:
        if not st.closing:  # the client left: cancelled as any request
            raise
        task.uncancel()
        raise busy(f"the server shut down before this {what} finished") from None
    finally:
        st.backend.active_handlers -= 1
        st.held.discard(task)


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


async def model_info(request: web.Request) -> web.Response:
    """``GET /model_info`` (and its older name ``/get_model_info``): SGLang's model-info shape,
    read by a router (sglang-router) when it registers this server as a worker. No
    ``model_path`` / ``tokenizer_path``: given one, the router loads (or downloads) a tokenizer
    that its HTTP routing never uses."""
    st = request.app[STATE]
    engine_info = await asyncio.to_thread(st.engine.server_info)
    arch = (engine_info.get("model") or {}).get("architecture")
    return web.json_response(
        {
            "served_model_name": st.model_name,
            "is_generation": True,
            "architectures": [arch] if arch else None,
        }
    )


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
    try:  # an engine process answers in one call over the pipe: off the event loop
        stats, profiler_state, engine_gc = await asyncio.to_thread(st.engine.metrics_snapshot)
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
    await asyncio.to_thread(st.engine.flush_cache)
    return web.json_response({"success": True, "message": "Cache flushed."})


async def start_profile(request: web.Request) -> web.Response:
    """``POST /start_profile`` (body optional)."""
    st = request.app[STATE]
    body = await read_json(request, st.config, allow_empty=True)
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


def _catalog_name(body: dict, config) -> str | None:
    """The body's ``name``: None (the default catalog) or one the server holds, else 400
    listing the held names."""
    name = protocol.get_str(body, "name", "name")
    if name is not None and name not in config.catalog_names:
        raise bad_request(unknown_catalog(name, config.catalog_names), "name")
    return name


async def update_catalog(request: web.Request) -> web.Response:
    """``POST /update_catalog {"path": ..., "name": N, "packed_base": B}``: catalog hot
    reload. The file is loaded, validated and built off the engine thread, then swapped in
    between steps; requests in flight finish on their catalog. ``name`` (optional): the named
    catalog it replaces (default: the default one), whose replaced version is kept for
    ``/rollback_catalog``. ``packed_base`` (optional): the base of the file's packed-integer
    keys (default ``--packed-base``, else 8192). 400 for a file that cannot serve or an
    unknown name (the old catalog keeps serving), 409 while another reload or a rollback
    runs."""
    st = request.app[STATE]
    body = protocol.require_object(await read_json(request, st.config))
    path = body.get("path")
    if not isinstance(path, str) or not path:
        raise bad_request("'path' (a catalog file the server can read) is required", "path")
    name = _catalog_name(body, st.config)
    packed_base = body.get("packed_base")
    if packed_base is not None and (type(packed_base) is not int or packed_base < 2):
        raise bad_request(
            "'packed_base' (the base the file's packed-integer keys were written in) must be "
            f"an integer >= 2, got {packed_base!r}",
            "packed_base",
        )
    return await _catalog_swap(st, "catalog reload", "path", st.engine.reload_catalog, path,
                               packed_base, name)  # fmt: skip


async def rollback_catalog(request: web.Request) -> web.Response:
    """``POST /rollback_catalog {"name": N}``: catalog ``name`` (default: the default one)
    serves the version the last ``/update_catalog`` replaced, swapped in between steps;
    requests in flight finish on theirs. 400 for an unknown name or a catalog with no previous
    version (nothing changes), 409 while a reload or another rollback runs."""
    st = request.app[STATE]
    raw = await read_json(request, st.config) if request.can_read_body else {}
    body = protocol.require_object(raw)
    name = _catalog_name(body, st.config)
    return await _catalog_swap(st, "catalog rollback", "name", st.engine.rollback_catalog, name)


async def _catalog_swap(
    st: ServerState, what: str, param: str, fn: Callable[..., Any], *args: Any
) -> web.Response:
    """``fn(*args)`` (a catalog reload or rollback) in flight on a thread of its own: the drain
    waits for it, then 503, and its thread holds no exit. 409 while another one runs, 400 on
    ``param`` for what cannot be swapped in (nothing changes)."""
    try:
        call = detached(fn, *args, name="flashrec-" + what.replace(" ", "-"))
        info = await in_flight(st, call, what)
    except ReloadBusyError as exc:
        raise APIError(str(exc), 409) from None
    except ValueError as exc:
        raise bad_request(str(exc), param) from None
    return web.json_response(info)


# the body fields of /update_weights_from_disk (SGLang's UpdateWeightFromDiskReqInput, those
# that make sense here) and the values each may take beyond its default
_WEIGHT_FIELDS = ("model_path", "load_format", "weight_version", "flush_cache",
                  "abort_all_requests")  # fmt: skip


def _weights_refused(message: str, status: int = 400) -> web.Response:
    return web.json_response({"success": False, "message": message}, status=status)


async def update_weights_from_disk(request: web.Request) -> web.Response:
    """``POST /update_weights_from_disk {"model_path": DIR, "load_format", "weight_version",
    "flush_cache", "abort_all_requests"}`` (SGLang's request and answer shape): new weights
    without a restart. The checkpoint is read and checked off the engine thread (config,
    SID layout and vocabulary of its tokenizer, every tensor's shape and dtype), then copied
    into the served weights' buffers once the running requests have finished; the radix
    cache is flushed. 400 ``{"success": false, "message"}`` for a checkpoint that cannot
    serve (the old weights keep serving), 409 while another update runs."""
    from flashrec.engine.weights import LOAD_FORMATS

    st = request.app[STATE]
    body = protocol.require_object(await read_json(request, st.config))
    unknown = sorted(set(body) - set(_WEIGHT_FIELDS))
    if unknown:
        return _weights_refused(
            f"unsupported field(s) {unknown}; supported: {', '.join(_WEIGHT_FIELDS)}"
        )
    path = body.get("model_path")
    if not isinstance(path, str) or not path:
        return _weights_refused(
            "'model_path' (a checkpoint directory the server can read) is required"
        )
    if body.get("load_format") not in LOAD_FORMATS:
        return _weights_refused(
            f"'load_format' {body.get('load_format')!r} is not supported; supported: "
            "auto, safetensors"
        )
    label = body.get("weight_version")
    if label is not None and not isinstance(label, str):
        return _weights_refused(f"'weight_version' must be a string, got {label!r}")
    if body.get("flush_cache", True) is not True:
        return _weights_refused(
            "'flush_cache' must be true: the prefix cache holds KV computed with the old weights"
        )
    if body.get("abort_all_requests", False) is not False:
        return _weights_refused(
            "'abort_all_requests' is not supported: running requests finish on the old weights"
        )
    try:  # in flight: the drain waits for it, then 503; its thread holds no exit
        call = detached(st.engine.update_weights, path, label, name="flashrec-weights-update")
        info = await in_flight(st, call, "weight update")
    except ReloadBusyError as exc:
        return _weights_refused(str(exc), 409)
    except ValueError as exc:
        return _weights_refused(str(exc))
    return web.json_response(info)
