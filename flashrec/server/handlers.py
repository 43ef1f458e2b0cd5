"""The server's shared state and the error middleware; the endpoints are ``generation``
(chat completions, /generate) and ``control`` (health, models, info, metrics, cache, profile,
catalog).

Every error leaves as an OpenAI-shaped JSON body (``flashrec.server.errors``); an unexpected
exception in a handler is a 500, never a dropped connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from flashrec.config import ServerConfig
from flashrec.server import protocol
from flashrec.server.backend import Backend
from flashrec.server.engine_api import Profiler, ServedEngine
from flashrec.server.errors import NOT_FOUND, APIError, error_body
from flashrec.server.frontends import FrontendGroup, Member
from flashrec.server.gcwatch import GcWatch
from flashrec.server.metrics import ServerMetrics

_log = logging.getLogger("flashrec.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass
class ServerState:
    """Everything the handlers share; lives in ``app[STATE]``."""

    backend: Backend
    config: ServerConfig
    model_name: str
    started: float = dataclasses.field(default_factory=time.time)
    gc: GcWatch | None = None  # installed by ``Server.run``
    # several front-end processes (--api-server-count): this one's index, and the handle that
    # gathers the others' snapshots (front end 0's group, another front end's membership)
    frontend_index: int = 0
    frontends: FrontendGroup | Member | None = None
    # generation handlers running now; past the drain deadline they are cancelled and answer 503
    held: set[asyncio.Task] = dataclasses.field(default_factory=set)
    closing: bool = False  # the drain deadline has passed

    @property
    def engine(self) -> ServedEngine:
        return self.backend.engine

    @property
    def limits(self) -> protocol.Limits:
        return self.backend.limits

    @property
    def metrics(self) -> ServerMetrics:
        """This front end's HTTP counters (the backend counts the served tokens)."""
        return self.backend.metrics

    @property
    def profiler(self) -> Profiler:
        return self.backend.engine.profiler


STATE = web.AppKey("flashrec_state", ServerState)


def limits_for(engine: ServedEngine, config: ServerConfig) -> protocol.Limits:
    """The request limits implied by the engine and the configuration."""
    rows = int(engine.max_beam_rows)
    return protocol.Limits(
        max_beam_rows=rows,
        vocab_size=int(engine.vocab_size),
        max_seq_len=int(config.max_seq_len),
        default_n=max(1, min(int(config.beam_width), rows)),
        default_max_tokens=int(engine.layout.num_levels) + 1,
        max_batch=max(1, int(config.max_queue_len)),
        catalogs=config.catalog_names,
    )


def model_name(config: ServerConfig) -> str:
    """``--served-model-name``, else the checkpoint directory name."""
    return config.served_model_name or Path(config.model_path).name or "flashrec"


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
