"""The engine as the HTTP layer sees it: build a prompt, run a request, cancel, drain.

All engine work happens on other threads: prompt building (chat template + tokenization) on
``--tokenizer-workers`` threads, beam search on the ``EngineLoop`` thread. The event loop only
awaits. A HF fast tokenizer must not be used by two threads at once, so each prompt-building
thread borrows one of as many builders, each over its own tokenizer copy
(``engine.prompt_builder()``); the Rust encoder releases the GIL, so they run in parallel.

NOTE: a ``concurrent.futures.Future`` from ``loop.submit`` is never cancelled from here (the
engine thread owns it and will resolve it); an abandoned request is withdrawn with
``loop.cancel(rid)`` instead, which frees its rows within one engine step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from flashrec.engine.request import EngineError, GenRequest, GenResult, QueueFullError
from flashrec.server import responses
from flashrec.server.errors import bad_request, busy, internal
from flashrec.server.protocol import Limits, check_prompt

_log = logging.getLogger("flashrec.server")

try:  # jinja2 raises TemplateError from chat templates on bad messages (e.g. bad roles)
    from jinja2 import TemplateError as _TemplateError
except ImportError:  # pragma: no cover
    _TemplateError = ValueError  # type: ignore[assignment,misc]

PROMPT_ERRORS = (ValueError, TypeError, LookupError, _TemplateError)


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
    _tok: ThreadPoolExecutor = field(init=False)
    _builders: queue.SimpleQueue = field(init=False)
    respond: Any = field(init=False, default=None)  # RespondPool with --respond-workers

    def __post_init__(self) -> None:
        n = max(1, int(self.tokenizer_workers))
        self._tok = ThreadPoolExecutor(n, thread_name_prefix="flashrec-tokenize")
        self._builders = queue.SimpleQueue()
        # the engine's own tokenizer serves the first thread; every other one gets a copy
        # (an engine without ``prompt_builder``, e.g. a test fake, shares its build_prompt)
        own: Callable[..., list[int]] = lambda **kw: self.engine.build_prompt(**kw)  # noqa: E731
        make = getattr(self.engine, "prompt_builder", None)
        for i in range(n):
            self._builders.put(own if i == 0 or make is None else make())
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

    def _build(self, kwargs: dict) -> list[int]:
        """On a prompt-building thread: borrow a builder (never shared by two threads; there
        are as many builders as threads), build, give it back."""
        build = self._builders.get_nowait()
        try:
            return build(**kwargs)
        finally:
            self._builders.put(build)

    @property
    def healthy(self) -> bool:
        """Warm-up done and not shutting down."""
        return self.ready and not self.draining

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
        try:
            ids = await aloop.run_in_executor(self._tok, self._build, kwargs)
        except PROMPT_ERRORS as exc:
            raise bad_request(f"cannot build the prompt: {exc}", param) from None
        ids = list(map(int, ids))
        check_prompt(ids, self.limits, param)
        return ids

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
        if self.respond is not None:
            self.respond.close()
