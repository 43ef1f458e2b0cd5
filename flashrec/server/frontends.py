"""Several HTTP front-end processes over one engine process (``--api-server-count N``).

With short prompts at high request rates the server process's own work (HTTP, JSON, chat
templates, answer text) fills its one GIL before the GPU is busy. N front ends split that
work. The server process (front end 0) spawns the engine process with N pipes, binds the port
with SO_REUSEPORT, then spawns front ends 1..N-1 (``app.frontend_main``); each binds the same port
(the kernel spreads new connections over the listening sockets) and reaches the engine over a
pipe of its own::

    client --> front end 0 (server process) --pipe 0----\\
           --> front end 1 (spawned)        --pipe 1----->  engine process (one EngineLoop)
           --> front end N-1 (spawned)      --pipe N-1--/
               control pipes (``Link``): front end 0 <-> each other front end

Front end 0 runs the start-up (warm-up, GC freeze) and tells the others when they are ready.
``/metrics`` on any front end sums every front end's HTTP counters (a front end asks front
end 0, which asks the others); profiling, cache flushes and catalog reloads are engine calls
and work from any front end. On SIGTERM every front end drains its own requests and front
end 0 waits for the others to exit before it stops the engine. A front end that dies stops
the whole server (exit 1); no front end outlives front end 0 or the engine process.
"""

from __future__ import annotations

import functools
import itertools
import logging
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NamedTuple

from flashrec.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from flashrec.config import ServerConfig
    from flashrec.server.engine_process import EngineClient

_log = logging.getLogger("flashrec.server")

START_TIMEOUT_S = 300.0  # a front end's spawn, imports, tokenizer copies and bind
ASK_TIMEOUT_S = 10.0  # one control round trip (a /metrics snapshot)


class FrontendError(RuntimeError):
    """A front-end process failed to start, or exited."""


class Snapshot(NamedTuple):
    """What ``/metrics`` reads of one front end: its HTTP counters, GC and state."""

    frontend: int
    metrics: ServerMetrics
    gc: dict[str, Any] | None
    inflight: int
    ready: bool
    draining: bool


class Link:
    """One end of a control pipe between front end 0 and another front end: one-way notices
    (``"bound"``, ``"ready"``, ``"stop"``) and asks, each answered by the other end on a
    thread of its own (so an answer that itself asks never blocks the reader)."""

    def __init__(
        self,
        conn: Connection,
        name: str,
        on_notice: Callable[[str], None],
        on_ask: Callable[[str, Any], Any],
        on_close: Callable[[], None],
    ) -> None:
        self.conn, self.name = conn, name
        self.on_notice, self.on_ask, self.on_close = on_notice, on_ask, on_close
        self.closed = False
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count()
        self._reader = threading.Thread(target=self._read, name=f"{name}-read", daemon=True)

    def start(self) -> Link:
        self._reader.start()
        return self

    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def notice(self, kind: str) -> bool:
        """Tell the other end ``kind``; False when it is gone."""
        try:
            self._send(("notice", kind))
            return True
        except (OSError, ValueError):
            return False

    def ask_async(self, kind: str, payload: Any = None) -> Future:
        """Ask the other end; the future holds its answer (or the error it raised)."""
        fut: Future = Future()
        ask_id = next(self._ids)
        with self._lock:
            if self.closed:
                fut.set_exception(FrontendError(f"{self.name}: the other end is gone"))
                return fut
            self._pending[ask_id] = fut
        try:
            self._send(("ask", ask_id, kind, payload))
        except (OSError, ValueError) as exc:
            with self._lock:
                self._pending.pop(ask_id, None)
            fut.set_exception(FrontendError(f"{self.name}: {exc}"))
        return fut

    def ask(self, kind: str, payload: Any = None, timeout: float = ASK_TIMEOUT_S) -> Any:
        return self.ask_async(kind, payload).result(timeout=timeout)

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break
            tag = msg[0]
            if tag == "notice":
                self.on_notice(msg[1])
            elif tag == "ask":
                threading.Thread(
                    target=self._answer, args=msg[1:], name=f"{self.name}-{msg[2]}", daemon=True
                ).start()
            elif tag == "answer":
                _, ask_id, value, error = msg
                with self._lock:
                    fut = self._pending.pop(ask_id, None)
                if fut is not None:
                    if error is None:
                        fut.set_result(value)
                    else:
                        fut.set_exception(FrontendError(error))
        with self._lock:
            self.closed = True
            pending, self._pending = list(self._pending.values()), {}
        for fut in pending:
            fut.set_exception(FrontendError(f"{self.name}: the other end is gone"))
        self.on_close()

    def _answer(self, ask_id: int, kind: str, payload: Any) -> None:
        try:
            msg: tuple = ("answer", ask_id, self.on_ask(kind, payload), None)
        except Exception as exc:  # noqa: BLE001 - raised again on the asking end
            msg = ("answer", ask_id, None, f"{type(exc).__name__}: {exc}")
        try:
            self._send(msg)
        except (OSError, ValueError):
            pass  # the asking end is gone

    def close(self) -> None:
        self.conn.close()


class FrontendGroup:
    """Front end 0's handle on the other front ends: spawns them over the engine process's
    spare pipes, tells them when they are ready or must stop, collects their snapshots and
    reports a death (``on_death``)."""

    def __init__(
        self,
        config: ServerConfig,
        engine: EngineClient,
        port: int,
        local: Callable[[], Snapshot],
        target: Callable[..., None],
    ) -> None:
        # target: a spawned front end's main (``app.frontend_main``), called with (index,
        # engine pipe, control pipe, config, the engine's Ready, port, log level)
        self.config, self.engine, self.port, self.local = config, engine, port, local
        self.target = target
        self.procs: dict[int, Any] = {}
        self.links: dict[int, Link] = {}
        self._bound: dict[int, threading.Event] = {}
        self._stopping = False
        self.on_death: Callable[[str], None] | None = None

    @property
    def count(self) -> int:
        return 1 + len(self.procs)

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Spawn front ends 1..N-1 and wait until each listens; FrontendError otherwise."""
        ctx = mp.get_context("spawn")
        level = logging.getLogger().getEffectiveLevel()
        conns = self.engine.frontend_conns
        try:
            for index, conn in enumerate(conns, start=1):
                ours, theirs = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=self.target,
                    args=(index, conn, theirs, self.config, self.engine.info, self.port, level),
                    name=f"flashrec-frontend-{index}",
                )
                self._bound[index] = threading.Event()
                proc.start()
                theirs.close()
                self.procs[index] = proc
                self.links[index] = Link(
                    ours,
                    f"flashrec-frontend-{index}",
                    functools.partial(self._notice, index),
                    functools.partial(self._ask, index),
                    functools.partial(self._closed, index),
                ).start()
            self.engine.close_frontend_conns()  # theirs now; EOF in the engine when one exits
            deadline = time.monotonic() + timeout
            for index, bound in self._bound.items():
                if not bound.wait(max(0.0, deadline - time.monotonic())):
                    raise FrontendError(f"front end {index} did not listen in {timeout:.0f} s")
                if self.links[index].closed:
                    self.procs[index].join(timeout=5.0)
                    raise FrontendError(
                        f"front end {index} exited during start-up (exit code "
                        f"{self.procs[index].exitcode}); its log is above"
                    )
        except BaseException:
            self._stopping = True
            self.engine.close_frontend_conns()
            self.kill()
            raise
        _log.info("%d front-end processes listening on port %d", self.count, self.port)

    def _notice(self, index: int, kind: str) -> None:
        if kind == "bound":
            self._bound[index].set()

    def _ask(self, index: int, kind: str, payload: Any) -> Any:
        if kind == "others":  # a front end's /metrics: every front end but the asking one
            return [self.local(), *self.snapshots(exclude=index)]
        raise ValueError(f"unknown ask {kind!r}")

    def _closed(self, index: int) -> None:
        self._bound[index].set()  # a start-up waiting for it ends now
        if self._stopping:
            return
        proc = self.procs.get(index)
        if proc is not None:
            proc.join(timeout=5.0)
        why = f"front end {index} exited (exit code {proc.exitcode if proc else None})"
        _log.error("%s", why)
        if self.on_death is not None:
            self.on_death(why)

    def others(self) -> list[Snapshot]:
        """Every other front end's snapshot (front end 0's ``/metrics``)."""
        return self.snapshots()

    def snapshots(self, exclude: int | None = None) -> list[Snapshot]:
        """The snapshots of the live front ends 1..N-1 (but ``exclude``), asked all at once."""
        asks = [link.ask_async("snapshot") for i, link in self.links.items() if i != exclude]
        out = []
        for fut in asks:
            try:
                out.append(fut.result(timeout=ASK_TIMEOUT_S))
            except Exception as exc:  # noqa: BLE001 - a front end going away: the rest count
                _log.warning("a front end did not report its metrics: %s", exc)
        return out

    def set_ready(self) -> None:
        for link in self.links.values():
            link.notice("ready")

    def request_stop(self) -> None:
        """Every other front end drains and exits (front end 0 then joins them)."""
        self._stopping = True
        for link in self.links.values():
            link.notice("stop")

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the front ends to exit; kill those still running."""
        deadline = time.monotonic() + timeout
        for index, proc in self.procs.items():
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                _log.warning("front end %d did not stop in %.0f s; killing it", index, timeout)
                proc.kill()
                proc.join(timeout=5.0)
            self.links[index].close()

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.exitcode is None:
                proc.kill()
            proc.join(timeout=5.0)
        for link in self.links.values():
            link.close()


class Member:
    """A spawned front end's side of its control pipe to front end 0."""

    def __init__(self, index: int, conn: Connection) -> None:
        self.index = index
        self.local: Callable[[], Snapshot] | None = None  # set by the Server
        self.ready = threading.Event()
        self.gone = False  # front end 0 closed the control pipe
        self.on_stop: Callable[[bool], None] | None = None  # (front end 0 is gone) -> None
        self.link = Link(
            conn, f"flashrec-frontend-{index}-ctl", self._notice, self._ask, self._gone
        )

    def start(self) -> Member:
        self.link.start()
        return self

    def bound(self) -> None:
        self.link.notice("bound")

    def others(self) -> list[Snapshot]:
        """Every other front end's snapshot, gathered by front end 0."""
        return self.link.ask("others", timeout=2 * ASK_TIMEOUT_S)

    def _notice(self, kind: str) -> None:
        if kind == "ready":
            self.ready.set()
        elif kind == "stop" and self.on_stop is not None:
            self.on_stop(False)

    def _ask(self, kind: str, payload: Any) -> Any:
        if kind == "snapshot" and self.local is not None:
            return self.local()
        raise ValueError(f"unknown ask {kind!r}")

    def _gone(self) -> None:
        self.gone = True
        self.ready.set()  # nobody will say it any more; the stop below wins
        if self.on_stop is not None:
            self.on_stop(True)
