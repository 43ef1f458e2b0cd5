"""What arrives on the wire: connections and request bodies, bounded in size and time.

``Connection`` is aiohttp's connection handler with two changes: a request's headers must be
complete within ``--header-timeout-s`` of its first byte (of the connection's opening, for
its first request), else the connection gets a 408 (or, when nothing was sent, is closed);
and errors the HTTP parser raises (bad request line, headers, ``Transfer-Encoding``) are
answered with the JSON error body instead of aiohttp's plain text.

``read_body`` reads a body as sent (aiohttp's own decompression is off: it raised 500s and
reset connections on bad input), then decodes its ``Content-Encoding`` chain with the output
capped, so a compression bomb is refused with 413 after at most ``--max-body-bytes`` of
output, never inflated whole; ``read_json`` parses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from flashrec.server.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    bad_request,
    error_body,
    timed_out,
    too_large,
    unsupported_media,
)

if TYPE_CHECKING:
    from flashrec.config import ServerConfig

_log = logging.getLogger("flashrec.server")

# content coding -> zlib window bits (RFC 9110 8.4.1: gzip; deflate is the zlib format)
CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
MAX_CODINGS = 4  # a longer chain is refused (415), not decoded layer after layer
READ_CHUNK = 1 << 16


class Connection(RequestHandler):
    """One client connection (aiohttp's handler) with a header deadline and JSON parse errors.

    ``on_error(status)`` is told of every error this class answers itself (parse errors, 408)
    so that ``/metrics`` counts them like the application's own.

    NOTE: it reads two private fields of aiohttp's handler, ``_request_in_progress`` and
    ``_messages`` (the parsed requests not yet handled), and sets ``_lingering_time``, as of
    aiohttp 3.14;
    ``tests/server/test_server_wire.py`` fails if they change meaning.
    """

    def __init__(
        self,
        manager: web.Server,
        *,
        header_timeout_s: float,
        on_error: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._on_error = on_error
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_bytes = False  # bytes of a request whose headers are not complete yet

    def close_after_answer(self) -> None:
        """Close the connection as soon as the current answer is written: no lingering read
        of the rest of a body that is not coming (aiohttp waits up to 10 s for it)."""
        self._lingering_time = 0.0
        self.close()

    @property
    def idle(self) -> bool:
        """No request being handled or queued on this connection."""
        return not self._request_in_progress and not self._messages

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        waiting = self.idle  # these bytes begin (or continue) the next request's headers
        if waiting and self._header_timer is None:
            self._arm()
        super().data_received(data)
        if not self.idle:  # a request's headers are complete
            self._disarm()
        elif waiting and data:
            self._header_bytes = True

    def _arm(self) -> None:
        if self._header_timeout_s > 0:
            self._header_timer = self._loop.call_later(self._header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._header_bytes = False

    def _expire(self) -> None:
        """Headers not complete in time: 408 to a client that sent some, then close."""
        self._header_timer = None
        if not self.idle or self.transport is None or self._force_close:
            return
        if self._header_bytes:
            err = timed_out(f"request headers not received within {self._header_timeout_s:g} s")
            body = json.dumps(err.body()).encode()
            head = (
                "HTTP/1.1 408 Request Timeout\r\n"
                "Content-Type: application/json; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            self.transport.write(head.encode() + body)  # asyncio flushes it before closing
            if self._on_error is not None:
                self._on_error(408)
        self.force_close()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """An error outside the application (the parser's, mostly): the JSON error body."""
        if request.writer.output_size > 0:  # as aiohttp: an answer has begun, cannot send one
            raise ConnectionError("a response was already sent; cannot send the error")
        if status >= 500:
            _log.error("error handling a request", exc_info=exc)
            text, kind = "internal error", INTERNAL_ERROR
        else:
            _log.debug("bad request from %s: %s", request.remote, message)
            text, kind = (message or "bad request").strip(), INVALID_REQUEST
        if self._on_error is not None:
            self._on_error(status)
        resp = web.json_response(error_body(text, status, None, kind), status=status)
        resp.force_close()
        return resp


def codings(content: str, transfer: str = "") -> list[str]:
    """The coding chain in the order applied: ``Content-Encoding``, then ``Transfer-Encoding``
    less its final ``chunked`` (which aiohttp undoes); 415 for a content coding not decoded
    here, 400 for such a transfer coding."""
    chain = []
    for what, header, refuse in (
        ("Content-Encoding", content, unsupported_media),
        ("Transfer-Encoding", transfer, bad_request),
    ):
        names = [c.strip().lower() for c in header.split(",") if c.strip()]
        if what == "Transfer-Encoding" and names[-1:] == ["chunked"]:
            names.pop()
        for name in names:
            if name not in CODINGS and name != "identity":
                raise refuse(f"{what} {name!r} is not supported (gzip, deflate, identity are)")
        chain += [c for c in names if c != "identity"]
    if len(chain) > MAX_CODINGS:
        raise unsupported_media(f"more than {MAX_CODINGS} codings")
    return chain


class Decoder:
    """Decodes a coding chain chunk by chunk; 413 once the output passes ``limit``."""

    def __init__(self, chain: list[str], limit: int) -> None:
        # applied in order, so undone in reverse
        self._stages = [zlib.decompressobj(CODINGS[c]) for c in reversed(chain)]
        self._chain = ", ".join(chain)
        self._limit = limit
        self._out: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> None:
        for stage in self._stages:
            data = self._step(stage, data)
        self._keep(data)

    def _step(self, stage: Any, data: bytes) -> bytes:
        try:
            # at most limit + 1 bytes out: one past the limit proves the body too large
            out = stage.decompress(data, self._limit + 1)
        except zlib.error as exc:
            raise bad_request(f"cannot decode the {self._chain} body: {exc}") from None
        if stage.unconsumed_tail or len(out) > self._limit:
            raise too_large(self._limit, "decoded request body")
        return out

    def _keep(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._limit:
            raise too_large(self._limit, "decoded request body")
        self._out.append(data)

    def finish(self) -> bytes:
        """The whole decoded body; 400 for a truncated stream or bytes after its end."""
        data = b""
        for stage in self._stages:
            if data:
                data = self._step(stage, data)
            data += stage.flush()  # nothing is left unconsumed (``_step``): this is small
            if not stage.eof:
                raise bad_request(f"the {self._chain} body is truncated")
            if stage.unused_data:
                raise bad_request(f"data after the end of the {self._chain} body")
        self._keep(data)
        return b"".join(self._out)


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The body, decoded; 413 over ``limit`` bytes as sent or as decoded, 415 for an unknown
    ``Content-Encoding``, 400 when it does not decode, 408 unless it all arrives within
    ``timeout_s`` (0 = no limit)."""
    length = request.content_length
    if length is not None and length > limit:  # before anything else: refused unread
        raise too_large(limit)
    headers = request.headers
    chain = codings(
        ",".join(headers.getall("Content-Encoding", [])),
        ",".join(headers.getall("Transfer-Encoding", [])),
    )
    decoder = Decoder(chain, limit) if chain else None
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s if timeout_s > 0 else None):
            while chunk := await request.content.read(READ_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                if decoder is not None:
                    decoder.feed(chunk)
                else:
                    parts.append(chunk)
    except TimeoutError:
        conn = request.protocol
        if isinstance(conn, Connection):  # the 408 closes the connection as it is sent
            conn.close_after_answer()
        raise timed_out(f"request body not received within {timeout_s:g} s") from None
    return decoder.finish() if decoder is not None else b"".join(parts)


async def read_json(request: web.Request, config: ServerConfig, allow_empty: bool = False) -> Any:
    """The parsed body (``Content-Type`` is not checked: the body is JSON); the size, coding
    and time errors of ``read_body`` under ``--max-body-bytes`` / ``--body-timeout-s``, 400
    when it is not JSON (``allow_empty``: an empty body is ``{}``)."""
    raw = await read_body(request, int(config.max_body_bytes), float(config.body_timeout_s))
    if not raw.strip():
        if allow_empty:
            return {}
        raise bad_request("the request body is empty; expected a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"malformed JSON body: {exc}") from None
