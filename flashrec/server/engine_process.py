"""The engine in a process of its own (``--engine-process``, on by default on GPU).

In one process the engine thread and the HTTP side (event loop, request parsing, chat
templates, response text) take turns holding one GIL: every response built or request parsed
is time in which the engine thread cannot launch the next kernel, and the engine's launches in
turn delay the answers. Here the engine, its scheduler, the profiler and the engine's GC watch
live in a child process; the server process keeps HTTP, tokenization and response text::

    server process                          engine process (spawned)
      handlers -> Backend -> RemoteLoop  --("submit", GenRequest)-->  reader -> EngineLoop
                             (futures)   <--("result", rid, beams)--  sender <- engine thread
                 RemoteProfiler / stats  --("call", id, name, args)-> call thread -> reply

Start-up is unchanged from the outside: ``EngineProcess.start`` returns once the child has
built the engine (or raises with the child's error, e.g. a failed CUDA graph capture), then
the server binds, prints its URL line, runs the warm-up (in the child) and reports ready.

The facades keep the in-process interfaces, so ``create_app`` and the handlers do not know
which mode runs: ``RemoteEngine`` (prompt building over the server's own tokenizer, the
request checks, ``server_info``), ``RemoteLoop`` (submit / cancel / stats / flush / warm-up /
drain / stop) and ``RemoteProfiler`` (``/start_profile`` / ``/stop_profile``; the trace is
taken in the child, on the engine thread, as in one process).

Results cross as plain columns (token ids, scores, finish reasons of the beams); the server process
makes the SID text from its own tokenizer, as the engine would. If the child dies, every
waiting request fails with an engine error, ``/health`` turns 503 and the cause is logged.
"""

from __future__ import annotations

import faulthandler
import functools
import itertools
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
from concurrent.futures import CancelledError, Future
from typing import Any

from flashrec.engine.request import (
    BeamColumns,
    EngineError,
    GenRequest,
    GenResult,
    QueueFullError,
)

_log = logging.getLogger("flashrec.server")

CALL_TIMEOUT_S = 120.0  # a stats / flush / profile call; warm-up and drain pass their own
STOP_TIMEOUT_S = 60.0


class EngineProcessError(RuntimeError):
    """The engine process failed to start, or exited."""


# ---- wire format ------------------------------------------------------------------------
def result_to_wire(res: GenResult) -> tuple:
    """A ``GenResult`` as plain values (no callables: the text is made on the other side): the
    beams as four columns (token ids, cumulative logprobs, sequence scores, finish reasons),
    taken as they are from the engine's ``BeamColumns``."""
    b = BeamColumns.from_beams(res.beams)
    beams = (b.token_ids, b.cum_logprobs, b.sequence_scores, b.finish_reasons)
    return (
        res.rid,
        beams,
        res.prompt_tokens,
        res.cached_tokens,
        res.error,
        res.queue_s,
        res.engine_s,
        res.done_at,
    )


def result_from_wire(wire: tuple, text: Callable[[list[int]], str] | str = "") -> GenResult:
    """The inverse of ``result_to_wire``; ``text`` makes each beam's text from its tokens."""
    rid, beams, prompt_tokens, cached, error, queue_s, engine_s, done_at = wire
    return GenResult(
        rid,
        BeamColumns(*beams, text),
        prompt_tokens,
        cached,
        error=error,
        queue_s=queue_s,
        engine_s=engine_s,
        done_at=done_at,
    )


# error kinds sent for a failed request or call, and the exception each becomes here
_ERRORS: dict[str, type[BaseException]] = {
    "cancelled": CancelledError,
    "queue_full": QueueFullError,
    "value": ValueError,
    "engine": EngineError,
    "other": RuntimeError,
}  # and "profile": ProfileError (imported late: the profiler imports torch)


def _error_kind(exc: BaseException) -> str:
    from flashrec.profiler import ProfileError

    if isinstance(exc, CancelledError):
        return "cancelled"
    if isinstance(exc, QueueFullError):
        return "queue_full"
    if isinstance(exc, ProfileError):
        return "profile"
    if isinstance(exc, EngineError):
        return "engine"
    if isinstance(exc, ValueError):
        return "value"
    return "other"


def _make_error(kind: str, message: str) -> BaseException:
    if kind == "profile":
        from flashrec.profiler import ProfileError

        return ProfileError(message)
    return _ERRORS.get(kind, RuntimeError)(message)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CancelledError | QueueFullError | ValueError | EngineError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


# ---- the child ----------------------------------------------------------------------------
def child_main(conn: Any, config: Any, log_level: int) -> None:
    """Entry point of the engine process (``multiprocessing`` spawn target)."""
    logging.basicConfig(
        level=log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s",
    )
    from flashrec.engine.engine import Engine
    from flashrec.engine.loop import EngineLoop
    from flashrec.profiler import ProfileController
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
        profiler = ProfileController(loop)
        gcw = GcWatch().install()
        loop.add_step_hook(gcw.report_slow)
        info = {
            "server_info": engine.server_info(),
            "layout": engine.layout,
            "vocab_size": engine.vocab_size,
            "max_beam_rows": engine.max_beam_rows,
            "pool_tokens": engine.runner.kv.pool_tokens,
            "pid": os.getpid(),
        }
    except BaseException as exc:  # noqa: BLE001 - reported to the server process, which exits
        conn.send(("failed", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        conn.close()
        return
    loop.start()
    conn.send(("ready", info))
    _Child(conn, loop, profiler, gcw).serve()


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


class _Child:
    """The engine process's side of the pipe: a reader (this thread), a sender thread (so the
    engine thread never pickles or writes) and one thread per blocking call."""

    def __init__(self, conn, loop, profiler, gcw) -> None:
        self.conn, self.loop, self.profiler, self.gcw = conn, loop, profiler, gcw
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.sender = threading.Thread(target=self._send_all, name="flashrec-ipc-send")

    def serve(self) -> None:
        self.sender.start()
        try:
            while True:
                try:
                    msg = self.conn.recv()
                except (EOFError, OSError):  # the server process is gone
                    _log.warning("the server process closed the pipe; the engine stops")
                    break
                if msg[0] == "stop":
                    break
                self._handle(msg)
        finally:
            self.loop.stop()
            self.out.put(None)
            self.sender.join(timeout=STOP_TIMEOUT_S)

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "submit":
            req: GenRequest = msg[1]
            try:
                fut = self.loop.submit(req)
            except BaseException as exc:  # noqa: BLE001
                self.out.put(("error", req.rid, _error_kind(exc), _describe(exc)))
                return
            fut.add_done_callback(functools.partial(self._finished, req.rid))
        elif kind == "cancel":
            self.loop.cancel(msg[1])
        elif kind == "call":
            _, call_id, name, args = msg
            threading.Thread(
                target=self._call, args=(call_id, name, args), name=f"flashrec-call-{name}"
            ).start()
        else:
            _log.error("unknown message %r from the server process", kind)

    def _finished(self, rid: str, fut: Future) -> None:
        """On the engine thread: hand the future to the sender, nothing more."""
        self.out.put(("done", rid, fut))

    def _call(self, call_id: int, name: str, args: tuple) -> None:
        try:
            value = self._calls()[name](*args)
            self.out.put(("reply", call_id, True, value))
        except BaseException as exc:  # noqa: BLE001
            self.out.put(("reply", call_id, False, (_error_kind(exc), _describe(exc))))

    def _calls(self) -> dict[str, Callable[..., Any]]:
        lp, prof = self.loop, self.profiler
        return {
            "stats": lp.stats,
            "flush_cache": lp.flush_cache,
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
            item = self.out.get()
            if item is None:
                return
            if item[0] == "done":
                _, rid, fut = item
                exc = fut.exception()
                if exc is None:
                    item = ("result", rid, result_to_wire(fut.result()))
                else:
                    item = ("error", rid, _error_kind(exc), _describe(exc))
            try:
                self.conn.send(item)
            except (OSError, ValueError, EOFError):  # the server process is gone
                return


# ---- the server process's side ---------------------------------------------------------------
class EngineProcess:
    """Owns the engine process and the pipe; resolves request futures and call replies."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.info: dict[str, Any] = {}
        self._ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
        self._conn, child_conn = self._ctx.Pipe(duplex=True)
        self._child_conn = child_conn
        self.proc = self._ctx.Process(
            target=child_main,
            args=(child_conn, config, logging.getLogger().getEffectiveLevel()),
            name="flashrec-engine",
            daemon=True,
        )
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        # one thread at a time waits for the process (the reader when the pipe closes, stop()):
        # of two concurrent waitpid calls the loser gets no exit status and, for a moment, sees
        # a dead process as alive (stop() then warned and killed an already reaped pid)
        self._reap_lock = threading.Lock()
        self._futures: dict[str, Future] = {}
        self._calls: dict[int, Future] = {}
        self._ids = itertools.count()
        self._reader: threading.Thread | None = None
        self.dead: str | None = None  # why the engine process is gone (None while alive)
        self._stopping = False
        self.on_death: Callable[[str], None] | None = None

    def start(self) -> EngineProcess:
        """Spawn the child and wait until it built the engine; EngineProcessError otherwise."""
        self.proc.start()
        self._child_conn.close()  # the child holds its end; EOF here once it exits
        try:
            msg = self._conn.recv()
        except (EOFError, OSError):
            self.proc.join(timeout=STOP_TIMEOUT_S)
            raise EngineProcessError(
                f"the engine process exited while building the engine "
                f"(exit code {self.proc.exitcode}); its log is above"
            ) from None
        except BaseException:  # Ctrl-C while it builds: it has served nothing, kill it now
            self.proc.kill()
            self.proc.join(timeout=STOP_TIMEOUT_S)
            raise
        if msg[0] == "failed":
            _, message, tb = msg
            _log.error("engine process: %s", tb.rstrip())
            self.proc.join(timeout=STOP_TIMEOUT_S)
            raise EngineProcessError(f"the engine failed to start: {message}")
        self.info = msg[1]
        from flashrec.engine.request import SidText
        from flashrec.prompt import load_tokenizer

        # the SID text of the beams, over a tokenizer of this process (loaded here, before
        # the reader thread exists: two threads importing transformers at once can fail)
        self.text: Callable[[list[int]], str] = SidText(
            load_tokenizer(self.config.model_path), self.info["layout"]
        )
        self._reader = threading.Thread(target=self._read, name="flashrec-ipc-read", daemon=True)
        self._reader.start()
        _log.info("engine process %d ready", self.info.get("pid", -1))
        return self

    # ---- requests and calls (any thread) --------------------------------------------------
    def _send(self, msg: tuple) -> None:
        if self.dead is not None:
            raise EngineProcessError(self.dead)
        try:
            with self._send_lock:
                self._conn.send(msg)
        except (OSError, ValueError) as exc:
            raise EngineProcessError(f"the engine process is gone ({exc})") from None

    def submit(self, req: GenRequest) -> Future:
        fut: Future = Future()
        with self._lock:
            if req.rid in self._futures:
                raise ValueError(f"duplicate request id {req.rid!r}")
            self._futures[req.rid] = fut
        try:
            self._send(("submit", req))
        except EngineProcessError as exc:
            with self._lock:
                self._futures.pop(req.rid, None)
            raise EngineError(str(exc)) from None
        return fut

    def cancel(self, rid: str) -> None:
        try:
            self._send(("cancel", rid))
        except EngineProcessError:
            pass  # nothing left to cancel

    def call(self, name: str, *args: Any, timeout: float | None = CALL_TIMEOUT_S) -> Any:
        """Run ``name`` in the engine process and return its value (its error raised here)."""
        fut: Future = Future()
        call_id = next(self._ids)
        with self._lock:
            self._calls[call_id] = fut
        try:
            self._send(("call", call_id, name, args))
        except EngineProcessError:
            with self._lock:
                self._calls.pop(call_id, None)
            raise
        return fut.result(timeout=timeout)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._futures)

    # ---- the reader thread ------------------------------------------------------------------
    def _read(self) -> None:
        text = self.text
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = msg[0]
            if kind == "result":
                fut = self._pop(msg[1])
                if fut is not None and not fut.done():
                    res = result_from_wire(msg[2], text)
                    res.received_at = time.monotonic()
                    fut.set_result(res)
            elif kind == "error":
                fut = self._pop(msg[1])
                if fut is not None and not fut.done():
                    fut.set_exception(_make_error(msg[2], msg[3]))
            elif kind == "reply":
                _, call_id, ok, value = msg
                with self._lock:
                    cfut = self._calls.pop(call_id, None)
                if cfut is not None and not cfut.done():
                    if ok:
                        cfut.set_result(value)
                    else:
                        cfut.set_exception(_make_error(*value))
        self._wait(5.0)
        why = f"the engine process exited (exit code {self.proc.exitcode})"
        self.dead = why
        if not self._stopping:
            _log.error("%s; every waiting request fails", why)
        with self._lock:
            futs = list(self._futures.values()) + list(self._calls.values())
            self._futures.clear()
            self._calls.clear()
        for fut in futs:
            if not fut.done():
                fut.set_exception(CancelledError(why) if self._stopping else EngineError(why))
        if not self._stopping and self.on_death is not None:
            self.on_death(why)

    def _pop(self, rid: str) -> Future | None:
        with self._lock:
            return self._futures.pop(rid, None)

    def _wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the process to exit (one waiting thread at a time, see
        ``_reap_lock``); whether it has exited."""
        with self._reap_lock:
            self.proc.join(timeout=timeout)
            return self.proc.exitcode is not None

    def stop(self) -> None:
        """Stop the engine process (its loop first) and wait for it."""
        self._stopping = True
        exited = self._wait(0.0)
        if not exited:
            try:
                self._send(("stop",))
            except EngineProcessError:
                pass
            exited = self._wait(STOP_TIMEOUT_S)
        if not exited:
            _log.warning("the engine process did not stop in %.0f s; killing it", STOP_TIMEOUT_S)
            self.proc.kill()
            self._wait(5.0)
        if self._reader is not None:
            self._reader.join(timeout=5.0)
        self._conn.close()


class RemoteEngine:
    """What the HTTP layer reads of the engine, over an ``EngineProcess``: prompts are built
    here (the server process's tokenizers), the request checks use the engine's limits."""

    def __init__(self, proc: EngineProcess) -> None:
        from flashrec.prompt import load_tokenizer

        self.proc = proc
        self.config = proc.config
        info = proc.info
        self.layout = info["layout"]
        self.vocab_size: int = info["vocab_size"]
        self.max_beam_rows: int = info["max_beam_rows"]
        self.pool_tokens: int = info["pool_tokens"]
        self.tokenizer = load_tokenizer(self.config.model_path)

    def sid_text_table(self) -> dict[int, str]:
        """Token id -> text of every SID token (the server process's own table)."""
        return self.proc.text.table

    def build_prompt(self, **kwargs: Any) -> list[int]:
        from flashrec.prompt import build_prompt_ids

        return build_prompt_ids(self.tokenizer, self.layout, self.vocab_size, **kwargs)

    def prompt_builder(self) -> Callable[..., list[int]]:
        """``build_prompt`` over a private tokenizer copy (see ``Engine.prompt_builder``)."""
        from flashrec.engine.engine import private_prompt_builder

        return private_prompt_builder(
            self.tokenizer, self.config.model_path, self.layout, self.vocab_size
        )

    def check_request(self, r: GenRequest) -> None:
        """The engine's own checks (``Engine.check_request``), on the values it reported."""
        from flashrec.engine.engine import check_request_limits

        check_request_limits(r, self.max_beam_rows, self.config.max_seq_len, self.pool_tokens)

    def server_info(self) -> dict[str, Any]:
        info = dict(self.proc.info["server_info"])
        info["engine_process_pid"] = self.proc.info.get("pid")
        return info


class RemoteLoop:
    """``EngineLoop``'s front-end API over an ``EngineProcess``."""

    def __init__(self, proc: EngineProcess, config: Any) -> None:
        self.proc = proc
        self.config = config
        self.profiler = RemoteProfiler(proc)
        self._admitting = True

    def start(self) -> None:
        """The child's loop runs from ``EngineProcess.start``."""

    def submit(self, req: GenRequest) -> Future:
        if not self._admitting:
            raise QueueFullError("server is shutting down")
        return self.proc.submit(req)

    def cancel(self, rid: str) -> None:
        self.proc.cancel(rid)

    def stats(self) -> dict[str, int]:
        return self.proc.call("stats")

    def metrics_snapshot(self) -> tuple[dict[str, int], str, dict[str, Any]]:
        """What ``/metrics`` reads of the engine process, in ONE call over the pipe (each call
        starts a thread there): ``(stats, profiler state, GC metrics)``."""
        return self.proc.call("metrics")

    def gc_metrics(self) -> dict[str, Any]:
        """The engine process's garbage-collector counters (``GcWatch.metrics``)."""
        return self.proc.call("gc_metrics")

    def flush_cache(self) -> int:
        return self.proc.call("flush_cache")

    def warmup(self) -> None:
        self.proc.call("warmup", timeout=None)

    def freeze_gc(self) -> int:
        """``--gc-freeze`` in the engine process; returns the objects frozen there."""
        return self.proc.call("gc_freeze", timeout=None)

    def in_flight(self) -> int:
        return self.proc.in_flight()

    def drain(self, timeout_s: float) -> bool:
        """Stop admitting; wait until in-flight requests finish (True) or the time is up."""
        from flashrec.engine.loop import wait_idle

        self._admitting = False
        return wait_idle(self.in_flight, timeout_s)

    def stop(self) -> None:
        self.proc.stop()


class RemoteProfiler:
    """``ProfileController``'s HTTP-facing API; the profiler itself runs in the engine
    process, on its engine thread."""

    def __init__(self, proc: EngineProcess) -> None:
        self.proc = proc

    @property
    def state(self) -> str:
        if self.proc.dead is not None:
            return "idle"
        return self.proc.call("profile_state")

    def start(self, body: Any) -> dict[str, Any]:
        return self.proc.call("profile_start", dict(body))

    def stop(self) -> dict[str, Any]:
        return self.proc.call("profile_stop", timeout=None)

    def shutdown(self) -> None:
        """Write a running profile's trace; nothing to do when the engine process is gone."""
        try:
            self.proc.call("profile_shutdown", timeout=None)
        except (EngineError, EngineProcessError, CancelledError):
            pass


def start_engine_process(config: Any) -> tuple[RemoteEngine, RemoteLoop]:
    """Spawn the engine process, wait until its engine is built, return the facades."""
    proc = EngineProcess(config)
    try:
        proc.start()
        engine = RemoteEngine(proc)
    except EngineProcessError:
        raise
    except BaseException:
        proc.stop()
        raise
    return engine, RemoteLoop(proc, config)
