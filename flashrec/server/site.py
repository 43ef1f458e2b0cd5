"""The listening socket and its connections: ``Site`` accepts them itself (through
``wire.Connection``), ``start_site`` binds an application the way production does."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable

from aiohttp import web

from flashrec.server.handlers import STATE
from flashrec.server.wire import Connection

_log = logging.getLogger("flashrec.server")

KEEPALIVE_S = 75.0  # an idle kept-alive connection is closed after this long
CLOSE_GRACE_S = 1.0  # at shutdown, how long connections may still deliver a request


class Site:
    """``app`` listening on one socket through ``wire.Connection`` (not aiohttp's ``TCPSite``,
    whose connections cannot be chosen). The site accepts connections itself, so that at
    shutdown it can take every connection the kernel has queued before closing the socket
    (closing resets them; ``asyncio.Server.close`` also leaks ones it has accepted but not
    yet attached)."""

    def __init__(
        self,
        runner: web.AppRunner,
        sock: socket.socket,
        connection: Callable[[], Connection],
    ) -> None:
        self.runner, self.sock, self.connection = runner, sock, connection
        self.port = int(sock.getsockname()[1])
        self._aloop = asyncio.get_running_loop()
        self._taking: set[asyncio.Future] = set()  # connections being set up

    def start(self) -> None:
        self.sock.setblocking(False)
        self._aloop.add_reader(self.sock.fileno(), self._accept)

    @property
    def connections(self) -> list[Connection]:
        server = self.runner.server
        return [c for c in server.connections if isinstance(c, Connection)] if server else []

    def _accept(self) -> None:
        """Take every connection the kernel has queued."""
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: retried at the next ready
                _log.warning("accept failed: %s", exc)
                return
            conn.setblocking(False)
            task = asyncio.ensure_future(self._aloop.connect_accepted_socket(self.connection, conn))
            self._taking.add(task)  # a reference until it is done (the loop keeps weak ones)
            task.add_done_callback(self._taking.discard)

    async def cleanup(self) -> None:
        """Stop listening; connections accepted until then get ``CLOSE_GRACE_S`` to send their
        request and be answered (503 while shutting down) before any is closed unanswered."""
        if self.sock.fileno() >= 0:
            self._aloop.remove_reader(self.sock.fileno())
            self._accept()
            self.sock.close()
        deadline = time.monotonic() + CLOSE_GRACE_S
        while (self.connections or self._taking) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self.runner.cleanup()


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
        site = Site(runner, _listen(host, port, reuse_port), connection)
        site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return site
