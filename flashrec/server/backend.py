"""The engine as the HTTP layer sees it: build a prompt, run a request, cancel, drain.

All engine work happens on other threads: prompt building (chat template + tokenization) on
``--tokenizer-workers`` threads, beam search on the ``EngineLoop`` thread. The event loop only
awaits. A HF fast tokenizer must not be used by two threads at once, so each prompt-building
thread borrows one of as many builders, each over its own tokenizer copy
(``engine.prompt_builder()``); the Rust encoder releases the GIL, so they run in parallel.

Work per prompt is bounded before it is spent: a text that provably cannot fit
``--max-seq-len`` (``prompt.LengthGuard``: its bytes over the most bytes one token stands
for) is refused before it is encoded, and a prompt of more than ``LARGE_PROMPT_CHARS``
characters is built on a lane of its own (one thread, at most ``LARGE_LANE_DEPTH`` prompts
in it, more are a 503), so large inputs never hold the threads that ordinary prompts wait for.
``/health`` turns 503 (degraded) while an ordinary prompt has waited ``stall_limit_s`` for a
thread.

NOTE: a ``concurrent.futures.Future`` from ``loop.submit`` is never cancelled from here (the
engine thread owns it and will resolve it); an abandoned request is withdrawn with
``loop.cancel(rid)`` instead, which frees its rows within one engine step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from flashrec.engine.request import EngineError, GenRequest, GenResult, QueueFullError
from flashrec.prompt import PromptTooLong, bound_word_cache, build_prompt_ids, length_guard
from flashrec.server import responses
from flashrec.server.errors import bad_request, busy, internal
from flashrec.server.protocol import Limits, check_prompt

_log = logging.getLogger("flashrec.server")

try:  # jinja2 raises TemplateError from chat templates on bad messages (e.g. bad roles)
    from jinja2 import TemplateError as _TemplateError
except ImportError:  # pragma: no cover
    _TemplateError = ValueError  # type: ignore[assignment,misc]

PROMPT_ERRORS = (ValueError, TypeError, LookupError, _TemplateError)

LARGE_PROMPT_CHARS = 1 << 18  # prompts longer than this (text characters) take the large lane
LARGE_LANE_DEPTH = 2  # large prompts being built or waiting at once; another one is a 503
STALL_LIMIT_S = 10.0  # an ordinary prompt waiting this long for a thread: /health degraded


def prompt_chars(kwargs: dict) -> int:
    """The characters of text a ``build_prompt`` call will encode (its messages' contents or
    its text; raw ids are none), read without validating them."""
    text = kwargs.get("text")
    if isinstance(text, str):
        return len(text)
    total = 0
    messages = kwargs.get("messages")
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                piece = part.get("text") if isinstance(part, dict) else None
                total += len(piece) if isinstance(piece, str) else 0
    return total


async def await_engine(fut: Future) -> Any:
    """Await a ``concurrent.futures.Future`` without ever cancelling it.

    Cancelling the awaiting task leaves ``fut`` to the engine thread (unlike
    ``asyncio.wrap_future``, which would cancel it under the engine's feet).
    """
    aloop = asyncio.get_running_loop()
    waiter = aloop.create_future()

    def transfer(done: Future) -> None:
        if waiter.done():
            return
        if done.cancelled():
            waiter.cancel()
        elif done.exception() is not None:
            waiter.set_exception(done.exception())
        else:
            waiter.set_result(done.result())

    def on_done(done: Future) -> None:
        try:
            aloop.call_soon_threadsafe(transfer, done)
        except RuntimeError:  # the event loop is closed: nobody is waiting any more
            pass

    fut.add_done_callback(on_done)
    return await waiter


@dataclass
class Backend:
    """Engine + loop + limits, with the request path used by every generation handler."""

    engine: Any
    loop: Any
    limits: Limits
    ready: bool = False
    draining: bool = False
    inflight: set[str] = field(default_factory=set)
    active_handlers: int = 0
    tokenizer_workers: int = 1
    respond_workers: int = 0
    stall_limit_s: float = STALL_LIMIT_S
    _tok: ThreadPoolExecutor = field(init=False)
    _builders: queue.SimpleQueue = field(init=False)
    _large: ThreadPoolExecutor = field(init=False)
    _large_builder: Callable[..., list[int]] = field(init=False)
    _large_depth: int = field(init=False, default=0)
    _guard: Any = field(init=False, default=None)  # prompt.LengthGuard of a real tokenizer
    _waiting: dict[int, float] = field(init=False, default_factory=dict)  # id -> queued at
    _waiting_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _ids: Any = field(init=False, default_factory=itertools.count)
    respond: Any = field(init=False, default=None)  # RespondPool with --respond-workers
    word_cache_words: int | None = field(init=False, default=None)  # per thread (prompt.py)

    def __post_init__(self) -> None:
        n = max(1, int(self.tokenizer_workers))
        self._tok = ThreadPoolExecutor(n, thread_name_prefix="flashrec-tokenize")
        self._large = ThreadPoolExecutor(1, thread_name_prefix="flashrec-tokenize-large")
        self._builders = queue.SimpleQueue()
        # the engine's own tokenizer serves the first thread; every other one, and the large
        # lane, gets a copy (an engine without ``prompt_builder``, e.g. a test fake, shares
        # its build_prompt and has no length guard)
        own: Callable[..., list[int]] = lambda **kw: self.engine.build_prompt(**kw)  # noqa: E731
        make = getattr(self.engine, "prompt_builder", None)
        tokenizer = getattr(self.engine, "tokenizer", None)
        if make is not None and tokenizer is not None:
            own = functools.partial(
                build_prompt_ids, tokenizer, self.engine.layout, self.engine.vocab_size
            )
            self._guard = length_guard(tokenizer, self.limits.max_seq_len)
        for i in range(n):
            self._builders.put(own if i == 0 or make is None else make())
        self._large_builder = own if make is None else make()
        if make is not None and tokenizer is not None:
            # the copies share the tokenizer's model, whose word cache every thread keeps
            # for itself (tokenizers >= 0.23): n threads + the large lane, one bound in all
            self.word_cache_words = bound_word_cache(tokenizer, n + 1)
        if self.respond_workers > 0:
            from flashrec.server.respond_pool import RespondPool

            table = getattr(self.engine, "sid_text_table", dict)()
            model_path = getattr(getattr(self.engine, "config", None), "model_path", None)
            # an engine without a tokenizer has no table, and its beams' text is ""
            self.respond = RespondPool(
                int(self.respond_workers), table, model_path if table else None
            )
            try:
                self.respond.start()
            except BaseException:
                self.respond.close()
                raise

    async def chat_json(self, result: GenResult, model: str) -> str:
        """A chat completion's JSON body (``--respond-workers``: a worker builds a wide one)."""
        created = int(time.time())
        if self.respond is not None:
            return await self.respond.chat_json(result, model, created)
        return responses.chat_completion_json(result, model, created)

    async def generate_json(self, result: GenResult, latency: float) -> str:
        """A ``/generate`` answer's JSON body, as ``chat_json``."""
        if self.respond is not None:
            return await self.respond.generate_json(result, latency)
        return responses.generate_result_json(result, latency)

    def _build(self, kwargs: dict, ticket: int) -> list[int]:
        """On a prompt-building thread: borrow a builder (never shared by two threads; there
        are as many builders as threads), build, give it back."""
        with self._waiting_lock:
            self._waiting.pop(ticket, None)
        build = self._builders.get_nowait()
        try:
            return build(**kwargs)
        finally:
            self._builders.put(build)

    def _build_large(self, kwargs: dict) -> list[int]:
        return self._large_builder(**kwargs)  # one thread: the builder is never shared

    @property
    def healthy(self) -> bool:
        """Warm-up done and not shutting down."""
        return self.ready and not self.draining

    def stalled_s(self) -> float:
        """How long the oldest ordinary prompt has waited for a prompt-building thread."""
        with self._waiting_lock:
            oldest = min(self._waiting.values(), default=None)
        return 0.0 if oldest is None else time.monotonic() - oldest

    def degraded(self) -> str | None:
        """Why the server cannot take work within ``stall_limit_s`` now, or None."""
        waited = self.stalled_s()
        if waited >= self.stall_limit_s:
            return (
                f"a prompt has waited {waited:.1f} s for a prompt-building thread "
                f"(limit {self.stall_limit_s:g} s)"
            )
        return None

    def check_admitting(self) -> None:
        """503 while shutting down."""
        if self.draining:
            raise busy("the server is shutting down")
        if not self.ready:
            raise busy("the server is still warming up")

    async def build_prompt(self, param: str, **kwargs: Any) -> list[int]:
        """``engine.build_prompt(**kwargs)`` off the event loop; bad input is a 400 on
        ``param``; the result is checked against ``--max-seq-len`` and the vocabulary."""
        aloop = asyncio.get_running_loop()
        if self._guard is not None:
            kwargs = {**kwargs, "guard": self._guard}
        try:
            if prompt_chars(kwargs) > LARGE_PROMPT_CHARS:
                ids = await self._run_large(kwargs)
            else:
                ticket = next(self._ids)
                with self._waiting_lock:
                    self._waiting[ticket] = time.monotonic()
                try:
                    ids = await aloop.run_in_executor(self._tok, self._build, kwargs, ticket)
                finally:
                    with self._waiting_lock:
                        self._waiting.pop(ticket, None)
        except PromptTooLong as exc:
            raise bad_request(str(exc), param) from None
        except PROMPT_ERRORS as exc:
            raise bad_request(f"cannot build the prompt: {exc}", param) from None
        ids = list(map(int, ids))
        check_prompt(ids, self.limits, param)
        return ids

    async def _run_large(self, kwargs: dict) -> list[int]:
        """A large prompt on the large lane; 503 while ``LARGE_LANE_DEPTH`` already are (a
        prompt counts until its thread is done with it, even once its client has gone)."""
        with self._waiting_lock:
            if self._large_depth >= LARGE_LANE_DEPTH:
                raise busy(
                    f"{self._large_depth} large prompts (over {LARGE_PROMPT_CHARS} characters) "
                    "are being built; retry later"
                )
            self._large_depth += 1
        fut = self._large.submit(self._build_large, kwargs)
        fut.add_done_callback(self._large_done)
        return await asyncio.wrap_future(fut)

    def _large_done(self, _fut: Future) -> None:
        with self._waiting_lock:
            self._large_depth -= 1

    def submit(self, req: GenRequest) -> Future:
        """``loop.submit`` with the errors mapped: queue full -> 503, bad request -> 400.

        ``engine.check_request`` (n, prompt vs. KV pool) runs first where the engine has it.
        """
        try:
            check = getattr(self.engine, "check_request", None)
            if check is not None:
                check(req)
            fut = self.loop.submit(req)
        except QueueFullError as exc:
            raise busy(f"the request queue is full ({exc})") from None
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        self.inflight.add(req.rid)
        return fut

    async def result(self, rid: str, fut: Future) -> GenResult:
        """Wait for ``fut``; a cancelled wait (client gone) cancels ``rid`` in the engine."""
        try:
            res: GenResult = await await_engine(fut)
        except asyncio.CancelledError:
            self.withdraw(rid)
            raise
        except QueueFullError as exc:  # an engine in its own process answers this way
            raise busy(f"the request queue is full ({exc})") from None
        except ValueError as exc:  # likewise: a request that engine refused
            raise bad_request(str(exc)) from None
        except concurrent.futures.CancelledError:  # the engine dropped it (shutdown)
            if self.draining:
                raise busy("the server shut down before this request finished") from None
            raise internal("the engine cancelled this request") from None
        except EngineError as exc:
            raise internal(f"the engine failed this request's batch: {exc}") from None
        except Exception as exc:  # an engine bug must not take the server down
            _log.exception("request %s failed in the engine", rid)
            raise internal(f"the engine failed: {type(exc).__name__}: {exc}") from None
        finally:
            self.inflight.discard(rid)
        if res.error:
            raise internal(f"the engine failed this request: {res.error}")
        return res

    def withdraw(self, rid: str) -> None:
        """Cancel ``rid`` in the engine if it is still in flight (idempotent)."""
        if rid in self.inflight:
            self.inflight.discard(rid)
            self.loop.cancel(rid)

    async def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        """Submit every request, then wait for all; any failure cancels the others.

        One request (every chat completion) is awaited directly: no task and no gather, so
        its result reaches the handler in the same event-loop turn as the engine's wake-up.
        ``result`` already withdraws it when the wait is cancelled."""
        if len(reqs) == 1:
            (req,) = reqs
            return [await self.result(req.rid, self.submit(req))]
        waits: list[asyncio.Task] = []
        try:
            for req in reqs:
                fut = self.submit(req)
                waits.append(asyncio.ensure_future(self.result(req.rid, fut)))
            return list(await asyncio.gather(*waits))
        except BaseException:
            for req in reqs:
                self.withdraw(req.rid)
            for task in waits:
                task.cancel()
            raise

    def close(self) -> None:
        """Release the prompt-building threads and the respond workers."""
        self._tok.shutdown(wait=False, cancel_futures=True)
        self._large.shutdown(wait=False, cancel_futures=True)
        if self.respond is not None:
            self.respond.close()
