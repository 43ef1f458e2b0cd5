"""The listening socket and its connections: ``Site`` accepts them itself (through
``wire.Connection``), ``start_site`` binds an application the way production does."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import resource
import socket
import time
from collections.abc import Callable

from aiohttp import web

from flashrec.server.handlers import STATE
from flashrec.server.wire import Connection

_log = logging.getLogger("flashrec.server")

KEEPALIVE_S = 75.0  # an idle kept-alive connection is closed after this long
CLOSE_GRACE_S = 1.0  # at shutdown, how long connections may still deliver a request
FD_RESERVE = 64  # descriptors kept free under the open-file limit (--max-connections auto)
ACCEPT_BACKOFF_S = (0.05, 1.0)  # accepting pauses this long after a failure, doubling
LOG_EVERY_S = 10.0  # an accept failure or refusal is logged at most this often
REFUSE_LINGER_S = 1.0  # a refused connection is read (and dropped) this long before it closes
REFUSING_MAX = 64  # refused connections lingering at once; more are closed at once


def connection_cap(configured: int) -> int:
    """``--max-connections``, or (0) the open-file limit less the descriptors open now and
    ``FD_RESERVE``: a process at its limit cannot accept, answer or open anything."""
    if configured > 0:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = FD_RESERVE
    return max(1, soft - used - FD_RESERVE)


def _refusal() -> bytes:
    """The 503 a connection over the cap gets before it is closed (its request unread)."""
    body = json.dumps(
        {
            "error": {
                "message": "too many open connections (--max-connections); retry later",
                "type": "server_busy",
                "param": None,
                "code": 503,
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class _RateLog:
    """A warning logged at most once per ``LOG_EVERY_S``, with how many were not logged."""

    def __init__(self) -> None:
        self.last = -LOG_EVERY_S
        self.quiet = 0

    def warn(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self.last < LOG_EVERY_S:
            self.quiet += 1
            return
        more = f" ({self.quiet} more since the last report)" if self.quiet else ""
        _log.warning(msg + more, *args)
        self.last, self.quiet = now, 0


class Site:
    """``app`` listening on one socket through ``wire.Connection`` (not aiohttp's ``TCPSite``,
    whose connections cannot be chosen). The site accepts connections itself, so that at
    shutdown it can take every connection the kernel has queued before closing the socket
    (closing resets them; ``asyncio.Server.close`` also leaks ones it has accepted but not
    yet attached).

    Open connections are capped (``max_connections``): one more is answered 503 and closed.
    When accepting fails (out of file descriptors), accepting pauses, backing off, and the
    failure is logged at most every ``LOG_EVERY_S``: a listening socket left readable would
    otherwise wake the loop for nothing, at full CPU, for as long as the limit holds."""

    def __init__(
        self,
        runner: web.AppRunner,
        sock: socket.socket,
        connection: Callable[[], Connection],
        max_connections: int = 0,
        on_refuse: Callable[[int], None] | None = None,
    ) -> None:
        self.runner, self.sock, self.connection = runner, sock, connection
        self.port = int(sock.getsockname()[1])
        self.max_connections = connection_cap(max_connections)
        self.on_refuse = on_refuse
        self._aloop = asyncio.get_running_loop()
        self._taking: set[asyncio.Future] = set()  # connections being set up
        self._refusing: set[socket.socket] = set()  # answered 503, closing
        self._backoff = ACCEPT_BACKOFF_S[0]
        self._resume: asyncio.TimerHandle | None = None
        self._accept_log, self._refuse_log = _RateLog(), _RateLog()

    def start(self) -> None:
        self.sock.setblocking(False)
        self._aloop.add_reader(self.sock.fileno(), self._accept)

    @property
    def open_count(self) -> int:
        """Connections open or being set up (refused ones still closing included)."""
        server = self.runner.server
        attached = len(server.connections) if server is not None else 0
        return attached + len(self._taking) + len(self._refusing)

    @property
    def connections(self) -> list[Connection]:
        server = self.runner.server
        return [c for c in server.connections if isinstance(c, Connection)] if server else []

    def _accept(self) -> None:
        """Take every connection the kernel has queued (over the cap: 503 and close)."""
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: pause, then try again
                self._pause(exc)
                return
            self._backoff = ACCEPT_BACKOFF_S[0]
            conn.setblocking(False)
            if self.open_count >= self.max_connections:
                self._refuse(conn)
                continue
            task = asyncio.ensure_future(self._aloop.connect_accepted_socket(self.connection, conn))
            self._taking.add(task)  # a reference until it is done (the loop keeps weak ones)
            task.add_done_callback(self._taking.discard)

    def _pause(self, exc: OSError) -> None:
        """Stop accepting for the back-off time (doubling while it keeps failing)."""
        fd_limit = exc.errno in (errno.EMFILE, errno.ENFILE)
        hint = " (out of file descriptors: raise ulimit -n or lower --max-connections)"
        self._accept_log.warn(
            "accept failed: %s%s; pausing accepts %.2f s", exc, hint if fd_limit else "",
            self._backoff,
        )  # fmt: skip
        if self.sock.fileno() < 0 or self._resume is not None:
            return
        self._aloop.remove_reader(self.sock.fileno())
        self._resume = self._aloop.call_later(self._backoff, self._unpause)
        self._backoff = min(self._backoff * 2, ACCEPT_BACKOFF_S[1])

    def _unpause(self) -> None:
        self._resume = None
        if self.sock.fileno() >= 0:
            self._aloop.add_reader(self.sock.fileno(), self._accept)

    def _refuse(self, conn: socket.socket) -> None:
        """Answer 503 at once, then read and drop what the client sends for a moment before
        closing (a close with unread bytes would reset the connection, answer and all)."""
        self._refuse_log.warn(
            "%d connections open (--max-connections %d): answering 503",
            self.open_count, self.max_connections,
        )  # fmt: skip
        if self.on_refuse is not None:
            self.on_refuse(503)
        try:
            conn.send(_refusal())
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            conn.close()
            return
        if len(self._refusing) >= REFUSING_MAX:
            conn.close()
            return
        self._refusing.add(conn)
        self._aloop.add_reader(conn.fileno(), self._drain_refused, conn)
        self._aloop.call_later(REFUSE_LINGER_S, self._drop_refused, conn)

    def _drain_refused(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop_refused(conn)

    def _drop_refused(self, conn: socket.socket) -> None:
        if conn in self._refusing:
            self._refusing.discard(conn)
            self._aloop.remove_reader(conn.fileno())
            conn.close()

    async def cleanup(self) -> None:
        """Stop listening; connections accepted until then get ``CLOSE_GRACE_S`` to send their
        request and be answered (503 while shutting down) before any is closed unanswered."""
        if self.sock.fileno() >= 0:
            self._aloop.remove_reader(self.sock.fileno())
            self._accept()
            self.sock.close()
        if self._resume is not None:  # accepting was paused (out of descriptors)
            self._resume.cancel()
            self._resume = None
        for conn in list(self._refusing):
            self._drop_refused(conn)
        deadline = time.monotonic() + CLOSE_GRACE_S
        while (self.connections or self._taking) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self.runner.cleanup()


def check_port(host: str, port: int, reuse_port: bool = False) -> None:
    """OSError when ``host:port`` cannot be bound now (in use, no such address): found before
    a model loads for minutes, not after. Port 0 always binds."""
    _listen(host, port, reuse_port).close()


def _listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family, _, _, _, addr = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return socket.create_server(addr, family=family, reuse_port=reuse_port)


async def start_site(app: web.Application, host: str, port: int, reuse_port: bool = False) -> Site:
    """Bind ``app`` the way production does (``reuse_port``: with SO_REUSEPORT, so that
    several front-end processes listen on one port)."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=5.0)
    await runner.setup()
    cfg = app[STATE].config
    server = runner.server
    assert server is not None
    aloop = asyncio.get_running_loop()

    def connection() -> Connection:
        return Connection(
            server,
            loop=aloop,
            header_timeout_s=float(cfg.header_timeout_s),
            on_error=app[STATE].metrics.count_error,
            access_log=None,
            keepalive_timeout=KEEPALIVE_S,
            auto_decompress=False,  # bodies are decoded, with a size cap, in wire.read_body
        )

    try:
        site = Site(
            runner,
            _listen(host, port, reuse_port),
            connection,
            max_connections=int(cfg.max_connections),
            on_refuse=app[STATE].metrics.count_error,
        )
        site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return site
