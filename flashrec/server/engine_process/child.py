"""The engine process: builds the engine, then serves its pipes until told to stop.

One pipe per HTTP front-end process (``--api-server-count``); the first is the server
process's, which alone is sent ``Ready`` and sends ``Stop``. Three kinds of thread answer
them: a reader per pipe (the first is the main thread) takes messages and submits requests,
one sender pickles and writes every outgoing message to the pipe its request or call came
from (so the engine thread never does), and each blocking ``Call`` (warm-up, stats,
profiling) runs on a thread of its own. A front end whose pipe closes has its requests
withdrawn; the engine serves on for the others.
"""

from __future__ import annotations

import faulthandler
import functools
import logging
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NamedTuple

from flashrec.server.engine_process.messages import (
    Call,
    CallError,
    Cancel,
    Failed,
    Ready,
    Reply,
    RequestError,
    Stop,
    Submit,
    decode,
    encode,
    result_to_wire,
)

if TYPE_CHECKING:
    from flashrec.config import ServerConfig
    from flashrec.engine.loop import EngineLoop
    from flashrec.server.gcwatch import GcWatch

_log = logging.getLogger("flashrec.server")

STOP_TIMEOUT_S = 60.0  # the sender's last writes; the server process's wait for an exit


def child_main(conns: list[Connection], config: ServerConfig, log_level: int) -> None:
    """Entry point of the engine process (``multiprocessing`` spawn target): sends ``Ready``
    on the first pipe once the engine is built (or ``Failed`` and returns), then serves
    every pipe."""
    conn = conns[0]
    logging.basicConfig(
        level=log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s",
    )
    from flashrec.engine.engine import Engine
    from flashrec.engine.loop import EngineLoop
    from flashrec.server.gcwatch import GcWatch

    # the server process decides when the engine stops (it drains first); a Ctrl-C or a
    # SIGTERM sent to the whole process group must not kill the engine under a drain. A server
    # process that dies closes the pipe, and this process then stops by itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent()  # also while the engine loads, before the pipe is read
    # the reader thread must get the GIL soon after a request arrives (see the server's own)
    sys.setswitchinterval(config.gil_switch_interval_ms / 1000.0)
    try:
        engine = Engine(config)
        # a fatal signal (a segfault in a driver call) prints every thread's Python stack into
        # the server log, then passes the signal to the handler installed before. That one is
        # tvm-ffi's when FlashInfer is loaded: it prints native frames only and ends the process
        # without passing the signal on, and it installs itself when the library loads. Hence
        # here, after the engine (and FlashInfer) is up: this handler runs first, then that one
        faulthandler.enable(file=sys.stderr, all_threads=True)
        loop = EngineLoop(engine)
        gcw = GcWatch().install(config.gc_gen0_threshold)
        loop.add_step_hook(gcw.report_slow)
        ready = Ready(
            server_info=engine.server_info(),
            layout=engine.layout,
            vocab_size=engine.vocab_size,
            max_beam_rows=engine.max_beam_rows,
            pool_tokens=engine.runner.kv.pool_tokens,
            pid=os.getpid(),
        )
    except BaseException as exc:  # noqa: BLE001 - reported to the server process, which exits
        conn.send(encode(Failed(f"{type(exc).__name__}: {exc}", traceback.format_exc())))
        conn.close()
        return
    loop.start()
    conn.send(encode(ready))
    _Child(conns, loop, gcw).serve()


def _exit_with_parent(grace_s: float = 2.0) -> None:
    """End this process ``grace_s`` after the server process is gone, however it went (its
    multiprocessing sentinel reads end-of-file), so an engine never outlives its server."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        from multiprocessing.connection import wait

        wait([parent.sentinel])
        time.sleep(grace_s)  # a server that stopped this engine: it is ending already
        os._exit(1)

    threading.Thread(target=watch, name="flashrec-parent-watch", daemon=True).start()


class _Done(NamedTuple):
    """A request's future, queued by the engine thread for the sender to encode and send."""

    rid: str
    fut: Future


class _Child:
    """The engine process's side of the pipes: a reader per pipe (the first on this thread),
    a sender thread (so the engine thread never pickles or writes) and one thread per
    blocking call. Every outgoing item is queued as ``(pipe index, message)``."""

    def __init__(self, conns: list[Connection], loop: EngineLoop, gcw: GcWatch) -> None:
        self.conns, self.loop, self.gcw = list(conns), loop, gcw
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.sender = threading.Thread(target=self._send_all, name="flashrec-ipc-send")
        self._lock = threading.Lock()
        self._live: list[set[str]] = [set() for _ in self.conns]  # each pipe's open requests

    def serve(self) -> None:
        self.sender.start()
        for i in range(1, len(self.conns)):
            threading.Thread(
                target=self._read, args=(i,), name=f"flashrec-ipc-read-{i}", daemon=True
            ).start()
        try:
            self._read(0)
        finally:
            self.loop.stop()
            self.out.put(None)
            self.sender.join(timeout=STOP_TIMEOUT_S)

    def _read(self, i: int) -> None:
        """Serve pipe ``i`` until it closes (or, for the server process's, until ``Stop``)."""
        conn = self.conns[i]
        while True:
            try:
                msg = decode(conn.recv())
            except (EOFError, OSError):
                if i == 0:
                    _log.warning("the server process closed the pipe; the engine stops")
                    return
                break
            if type(msg) is Stop:
                if i == 0:
                    return
                break
            self._handle(i, msg)
        conn.close()  # a front end that left: its reader ends, its sends are dropped
        with self._lock:  # and its requests free their rows
            gone, self._live[i] = self._live[i], set()
        for rid in gone:
            self.loop.cancel(rid)
        if gone:
            _log.warning("front end %d closed its pipe; %d request(s) withdrawn", i, len(gone))

    def _handle(self, i: int, msg: Submit | Cancel | Call) -> None:
        kind = type(msg)
        if kind is Submit:
            req = msg.req
            with self._lock:
                self._live[i].add(req.rid)
            try:
                fut = self.loop.submit(req)
            except BaseException as exc:  # noqa: BLE001
                with self._lock:
                    self._live[i].discard(req.rid)
                self.out.put((i, RequestError.of(req.rid, exc)))
                return
            fut.add_done_callback(functools.partial(self._finished, i, req.rid))
        elif kind is Cancel:
            self.loop.cancel(msg.rid)
        elif kind is Call:  # a daemon: a call still running (a catalog read) holds no exit
            threading.Thread(
                target=self._call, args=(i, msg), name=f"flashrec-call-{msg.name}", daemon=True
            ).start()
        else:
            _log.error("unknown message %r from front end %d", kind.__name__, i)

    def _finished(self, i: int, rid: str, fut: Future) -> None:
        """On the engine thread: hand the future to the sender, nothing more."""
        self.out.put((i, _Done(rid, fut)))

    def _call(self, i: int, call: Call) -> None:
        try:
            value = self._calls()[call.name](*call.args)
            self.out.put((i, Reply(call.call_id, value)))
        except BaseException as exc:  # noqa: BLE001
            self.out.put((i, CallError.of(call.call_id, exc)))

    def _calls(self) -> dict[str, Callable[..., Any]]:
        lp, prof = self.loop, self.loop.profiler
        return {
            "stats": lp.stats,
            "flush_cache": lp.flush_cache,
            "reload_catalog": lp.reload_catalog,
            "catalog_info": lp.catalog_info,
            "catalogs_info": lp.catalogs_info,
            "rollback_catalog": lp.rollback_catalog,
            "update_weights": lp.update_weights,
            "weights_info": lp.weights_info,
            "warmup": lp.warmup,
            "gc_freeze": self._freeze_gc,
            "gc_metrics": self.gcw.metrics,
            "profile_start": prof.start,
            "profile_stop": prof.stop,
            "profile_shutdown": prof.shutdown,
            "profile_state": lambda: prof.state,
            # /metrics in one round trip: the loop's counters, the profiler's state, GC
            "metrics": lambda: (lp.stats(), prof.state, self.gcw.metrics()),
        }

    def _freeze_gc(self) -> int:
        """``--gc-freeze`` in this process (after the warm-up, as the server does in its own)."""
        from flashrec.server.gcwatch import freeze_startup_objects

        frozen = freeze_startup_objects(self.gcw)
        _log.info("gc: %d start-up objects frozen", frozen)
        return frozen

    def _send_all(self) -> None:
        while True:
            queued = self.out.get()
            if queued is None:
                return
            i, item = queued
            if type(item) is _Done:
                with self._lock:
                    self._live[i].discard(item.rid)
                exc = item.fut.exception()
                if exc is None:
                    item = result_to_wire(item.fut.result())
                else:
                    item = RequestError.of(item.rid, exc)
            try:
                self.conns[i].send(encode(item))
            except (OSError, ValueError, EOFError):  # that front end is gone
                if i == 0:
                    return
