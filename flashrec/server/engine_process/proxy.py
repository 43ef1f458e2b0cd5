"""A front end's handle on the engine process: ``EngineClient`` sends requests and calls over
one pipe and resolves their futures from a reader thread; ``EngineProcess`` (the server
process's) also spawns the engine process and holds the other front ends' pipes. If the
engine process dies, every waiting future fails and ``on_death`` is told why."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from flashrec.engine.request import EngineError, GenRequest
from flashrec.server.engine_process.child import STOP_TIMEOUT_S, child_main
from flashrec.server.engine_process.messages import (
    Call,
    CallError,
    Cancel,
    Failed,
    Ready,
    Reply,
    RequestError,
    Result,
    Stop,
    Submit,
    decode,
    encode,
    result_from_wire,
)

if TYPE_CHECKING:
    from flashrec.config import ServerConfig

_log = logging.getLogger("flashrec.server")

CALL_TIMEOUT_S = 120.0  # a stats / flush / profile call; warm-up and drain pass their own


class EngineProcessError(RuntimeError):
    """The engine process failed to start, or exited."""


class EngineClient:
    """One front end's end of a pipe to the engine process: sends requests and calls, and
    resolves their futures and replies from a reader thread (``connect``). If the pipe
    closes, every waiting future fails and ``on_death`` is told why."""

    def __init__(self, config: ServerConfig, conn: Connection) -> None:
        self.config = config
        self.info: Ready | None = None  # what the engine process reported at start-up
        self._conn = conn
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._futures: dict[str, Future] = {}
        self._calls: dict[int, Future] = {}
        self._ids = itertools.count()
        self._reader: threading.Thread | None = None
        self.dead: str | None = None  # why the engine process is gone (None while alive)
        self._stopping = False
        self.tokenizers: list[Any] = []  # [this process's, then copies] (load_tokenizers)
        self.on_death: Callable[[str], None] | None = None
        # the other front ends' pipes, each handed to its process when that is spawned (the
        # server process's ``EngineProcess`` with --api-server-count N; none here)
        self.frontend_conns: list[Connection] = []

    def load_tokenizers(self) -> None:
        """This process's tokenizer (the beams' SID text), then the copies ``take_tokenizer``
        hands out: the front end's own, one per prompt-building thread beyond the first and
        one for the large-prompt lane (``--tokenizer-workers``; see the server's backend).
        The copies share ``tok``'s model, so one word-cache capacity (``share_word_cache``; the
        server's backend splits it over its threads: ``bound_word_cache``)."""
        import copy

        from flashrec.prompt import load_tokenizer, share_word_cache

        tok = load_tokenizer(self.config.model_path)
        out = [tok]
        for _ in range(1 + max(1, int(getattr(self.config, "tokenizer_workers", 1)))):
            try:
                out.append(copy.deepcopy(tok))
            except Exception:  # noqa: BLE001 - one that cannot be copied: loaded per builder
                break
            share_word_cache(out[-1], tok)
        self.tokenizers = out

    def take_tokenizer(self) -> Any | None:
        """A preloaded private tokenizer copy (None once they are all taken)."""
        return self.tokenizers.pop() if len(self.tokenizers) > 1 else None

    def connect(self, info: Ready) -> EngineClient:
        """Serve the pipe to an engine that reported ``info`` (after ``load_tokenizers``)."""
        from flashrec.engine.request import SidText

        self.info = info
        # the SID text of the beams, over this process's tokenizer (loaded before the reader
        # thread exists: two threads importing transformers at once can fail)
        self.text: Callable[[list[int]], str] = SidText(self.tokenizers[0], info.layout)
        self._reader = threading.Thread(target=self._read, name="flashrec-ipc-read", daemon=True)
        self._reader.start()
        return self

    # ---- requests and calls (any thread) --------------------------------------------------
    def _send(self, msg: Submit | Cancel | Call | Stop) -> None:
        if self.dead is not None:
            raise EngineProcessError(self.dead)
        try:
            with self._send_lock:
                self._conn.send(encode(msg))
        except (OSError, ValueError) as exc:
            raise EngineProcessError(f"the engine process is gone ({exc})") from None

    def submit(self, req: GenRequest) -> Future:
        fut: Future = Future()
        with self._lock:
            if req.rid in self._futures:
                raise ValueError(f"duplicate request id {req.rid!r}")
            self._futures[req.rid] = fut
        if req.finisher is not None:  # a closure of this process: it never crosses the pipe
            req = dataclasses.replace(req, finisher=None)
        try:
            self._send(Submit(req))
        except EngineProcessError as exc:
            with self._lock:
                self._futures.pop(req.rid, None)
            raise EngineError(str(exc)) from None
        return fut

    def cancel(self, rid: str) -> None:
        try:
            self._send(Cancel(rid))
        except EngineProcessError:
            pass  # nothing left to cancel

    def call(self, name: str, *args: Any, timeout: float | None = CALL_TIMEOUT_S) -> Any:
        """Run ``name`` in the engine process and return its value (its error raised here)."""
        fut: Future = Future()
        call_id = next(self._ids)
        with self._lock:
            self._calls[call_id] = fut
        try:
            self._send(Call(call_id, name, args))
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
                msg = decode(self._conn.recv())
            except (EOFError, OSError):
                break
            kind = type(msg)
            if kind is Result:
                fut = self._pop(msg.rid)
                if fut is not None and not fut.done():
                    res = result_from_wire(msg, text)
                    res.received_at = time.monotonic()
                    fut.set_result(res)
            elif kind is RequestError:
                fut = self._pop(msg.rid)
                if fut is not None and not fut.done():
                    fut.set_exception(msg.exception())
            elif kind is Reply or kind is CallError:
                with self._lock:
                    cfut = self._calls.pop(msg.call_id, None)
                if cfut is not None and not cfut.done():
                    if kind is Reply:
                        cfut.set_result(msg.value)
                    else:
                        cfut.set_exception(msg.exception())
        why = self._why_gone()
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

    def _why_gone(self) -> str:
        return "the engine process closed this front end's pipe (it exited)"

    def stop(self) -> None:
        """Leave the engine process (``Stop`` on this pipe; it closes its end, which ends the
        reader): it withdraws what it still runs for this front end and serves the others."""
        self._stopping = True
        try:
            self._send(Stop())
        except EngineProcessError:
            pass
        if self._reader is not None:
            self._reader.join(timeout=5.0)
        self._conn.close()


class EngineProcess(EngineClient):
    """Owns the engine process and the server process's pipe to it; with
    ``--api-server-count`` N also the other N - 1 front ends' pipes (``frontend_conns``),
    each handed to its front-end process when that is spawned."""

    def __init__(self, config: ServerConfig) -> None:
        self._ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
        pipes = [self._ctx.Pipe(duplex=True) for _ in range(int(config.api_server_count))]
        super().__init__(config, pipes[0][0])
        self.frontend_conns = [ours for ours, _ in pipes[1:]]
        self._child_conns = [theirs for _, theirs in pipes]
        self.proc = self._ctx.Process(
            target=child_main,
            args=(self._child_conns, config, logging.getLogger().getEffectiveLevel()),
            name="flashrec-engine",
            daemon=True,
        )
        # one thread at a time waits for the process (the reader when the pipe closes, stop()):
        # of two concurrent waitpid calls the loser gets no exit status and, for a moment, sees
        # a dead process as alive (stop() then warned and killed an already reaped pid)
        self._reap_lock = threading.Lock()

    def start(self) -> EngineProcess:
        """Spawn the child and wait until it built the engine; EngineProcessError otherwise.
        While the child builds it, this process loads its own tokenizer and the prompt
        builders' copies (``tokenizers``): seconds that would otherwise follow the build."""
        self.proc.start()
        for c in self._child_conns:  # the child holds its ends; EOF here once it exits
            c.close()
        tok_error: Exception | None = None
        try:
            self.load_tokenizers()
        except Exception as exc:  # noqa: BLE001 - the engine's own failure, if any, says more
            tok_error = exc
        except BaseException:  # Ctrl-C: the engine has served nothing, kill it now
            self._kill()
            raise
        try:
            msg = decode(self._conn.recv())
        except (EOFError, OSError):
            self.proc.join(timeout=STOP_TIMEOUT_S)
            self.close_frontend_conns()
            raise EngineProcessError(
                f"the engine process exited while building the engine "
                f"(exit code {self.proc.exitcode}); its log is above"
            ) from None
        except BaseException:  # Ctrl-C while it builds: it has served nothing, kill it now
            self._kill()
            raise
        if type(msg) is Failed:
            _log.error("engine process: %s", msg.traceback.rstrip())
            self.proc.join(timeout=STOP_TIMEOUT_S)
            self.close_frontend_conns()
            raise EngineProcessError(f"the engine failed to start: {msg.message}")
        if tok_error is not None:  # the engine came up, but this process cannot build prompts
            self._kill()
            raise EngineProcessError(
                f"the server process could not load the tokenizer: {tok_error}"
            ) from tok_error
        self.connect(msg)
        _log.info("engine process %d ready", msg.pid)
        return self

    def _kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=STOP_TIMEOUT_S)
        self.close_frontend_conns()

    def close_frontend_conns(self) -> None:
        """Close this process's ends of the other front ends' pipes: once handed to their
        processes, or when those will not run (the engine's readers of them then end)."""
        for c in self.frontend_conns:
            c.close()
        self.frontend_conns = []

    def _why_gone(self) -> str:
        self._wait(5.0)
        return f"the engine process exited (exit code {self.proc.exitcode})"

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
                self._send(Stop())
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
        self.close_frontend_conns()
