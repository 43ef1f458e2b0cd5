"""The request path of both generation endpoints: a parsed request in, its answer out (prompts
built, engine requests submitted and awaited, token counts, the body), over a ``ServedEngine``.

Engine work happens on other threads: prompt building (chat template + tokenization) on
``--tokenizer-workers`` threads, beam search on the ``EngineLoop`` thread. The one exception:
a prompt of at most ``INLINE_PROMPT_CHARS`` whose handler is the only one in the server is
built on the event loop (``FLASHREC_PROMPT_INLINE=idle``, the default), where the hand-off
would cost more than the wait it spares anyone. A HF fast tokenizer must not be used by two
threads at once, so each prompt-building thread (or the loop) borrows one of as many builders,
each over its own tokenizer copy (``engine.prompt_builders``: the first thread gets the
engine's own); the Rust encoder releases the GIL, so they run in parallel.

Work per prompt is bounded before it is spent: a text that provably cannot fit
``--max-seq-len`` (``prompt.LengthGuard``: its bytes over the most bytes one token stands
for) is refused before it is encoded, and a prompt of more than ``LARGE_PROMPT_CHARS``
characters is built on a lane of its own (one thread, at most ``LARGE_LANE_DEPTH`` prompts
in it, more are a 503), so large inputs never hold the threads that ordinary prompts wait for.
``/health`` turns 503 (degraded) while an ordinary prompt has waited ``stall_limit_s`` for a
thread.

NOTE: a ``concurrent.futures.Future`` from ``engine.submit`` is never cancelled from here (the
engine thread owns it and will resolve it); an abandoned request is withdrawn with
``engine.cancel(rid)`` instead, which frees its rows within one engine step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flashrec.config.flags import env_choice
from flashrec.config.server import INLINE_PROMPT_CHARS
from flashrec.engine.request import EngineError, GenRequest, GenResult, QueueFullError
from flashrec.prompt import LengthGuard, PromptTooLong, bound_word_cache, length_guard
from flashrec.server import responses
from flashrec.server.engine_api import PromptBuilder, ServedEngine
from flashrec.server.errors import bad_request, busy, internal
from flashrec.server.metrics import ServerMetrics
from flashrec.server.protocol import ChatRequest, GenerateRequest, Limits, check_prompt

if TYPE_CHECKING:
    from flashrec.server.respond_pool import RespondPool

_log = logging.getLogger("flashrec.server")

try:  # jinja2 raises TemplateError from chat templates on bad messages (e.g. bad roles)
    from jinja2 import TemplateError as _TemplateError
except ImportError:  # pragma: no cover
    _TemplateError = ValueError  # type: ignore[assignment,misc]

PROMPT_ERRORS = (ValueError, TypeError, LookupError, _TemplateError)

LARGE_PROMPT_CHARS = 1 << 18  # prompts longer than this (text characters) take the large lane
LARGE_LANE_DEPTH = 2  # large prompts being built or waiting at once; another one is a 503
# FLASHREC_PROMPT_INLINE=idle (the default): a prompt of at most INLINE_PROMPT_CHARS whose
# handler is alone is built on the event loop: no hand-off to a thread and back, its encoding
# on the thread that just read the request; off: always a thread
PROMPT_INLINE = env_choice("FLASHREC_PROMPT_INLINE", "idle", ("idle", "off"))
# FLASHREC_ANSWER_ON_ENGINE=idle: a one-prompt, unstreamed answer's body is built by the engine
# thread (GenRequest.finisher) when that thread has nothing else to do, right after it built
# the results, so the event loop only sends it; off (the default): the handler builds it
ANSWER_ON_ENGINE = env_choice("FLASHREC_ANSWER_ON_ENGINE", "off", ("idle", "off"))
STALL_LIMIT_S = 10.0  # an ordinary prompt waiting this long for a thread: /health degraded


def prompt_chars(kwargs: dict[str, Any]) -> int:
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


async def await_engine(fut: Future[GenResult]) -> GenResult:
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


@dataclass(frozen=True)
class Answer:
    """A generation request's answer: its engine results (for ``/generate``, the returned
    beams), the seconds its prompts took to build, when the results reached the event loop,
    and the body: JSON text, or the events of a stream."""

    results: list[GenResult]
    tokenize_s: float
    back: float
    body: str | list[bytes]
    back_cpu: float | None = None  # the event loop thread's CPU clock (thread_time) at ``back``


@dataclass
class Backend:
    """The engine, the request limits and the served-token counters, with the request path
    of every generation handler (``answer``)."""

    engine: ServedEngine
    limits: Limits
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    model_path: str | None = None  # the checkpoint (respond workers load its tokenizer)
    ready: bool = False
    draining: bool = False
    inflight: set[str] = field(default_factory=set)
    active_handlers: int = 0
    tokenizer_workers: int = 1
    respond_workers: int = 0
    stall_limit_s: float = STALL_LIMIT_S
    _tok: ThreadPoolExecutor = field(init=False)
    _builders: queue.SimpleQueue[PromptBuilder] = field(init=False)
    _large: ThreadPoolExecutor = field(init=False)
    _large_builder: PromptBuilder = field(init=False)
    _large_depth: int = field(init=False, default=0)
    _guard: LengthGuard | None = field(init=False, default=None)  # of a real tokenizer
    _waiting: dict[int, float] = field(init=False, default_factory=dict)  # id -> queued at
    _waiting_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _ids: itertools.count[int] = field(init=False, default_factory=itertools.count)
    respond: RespondPool | None = field(init=False, default=None)  # --respond-workers
    word_cache_words: int | None = field(init=False, default=None)  # per thread (prompt.py)

    def __post_init__(self) -> None:
        n = max(1, int(self.tokenizer_workers))
        self._tok = ThreadPoolExecutor(n, thread_name_prefix="flashrec-tokenize")
        self._large = ThreadPoolExecutor(1, thread_name_prefix="flashrec-tokenize-large")
        self._builders = queue.SimpleQueue()
        # the engine's own tokenizer serves the first thread; every other one, and the large
        # lane, gets a copy sharing its model (whose word cache every thread keeps for itself,
        # tokenizers >= 0.23: n threads + the large lane, one bound in all)
        engine = self.engine
        tokenizer = engine.tokenizer
        if tokenizer is not None:
            self._guard = length_guard(tokenizer, self.limits.max_seq_len)
        *ordinary, self._large_builder = engine.prompt_builders(n + 1)
        for build in ordinary:
            self._builders.put(build)
        if tokenizer is not None:
            self.word_cache_words = bound_word_cache(tokenizer, n + 1)
        if self.respond_workers > 0:
            from flashrec.server.respond_pool import RespondPool

            table = engine.sid_text_table()
            # an engine without a tokenizer has no table, and its beams' text is ""
            self.respond = RespondPool(
                int(self.respond_workers), table, self.model_path if table else None
            )
            try:
                self.respond.start()
            except BaseException:
                self.respond.close()
                raise

    async def answer(self, req: ChatRequest | GenerateRequest, model: str, t0: float) -> Answer:
        """Build the prompts of a parsed request, run their engine requests and build the
        body (``model``: the served model, a chat answer's unless the request names one;
        ``t0``: when a ``/generate`` request arrived, for its ``e2e_latency``). Errors are
        ``APIError``s; a cancelled wait withdraws every request."""
        t_tok = time.perf_counter()
        p = req.params
        prompts = list(req.prompt_inputs())  # one engine request per prompt, either protocol
        finisher = self._finisher(req, model, t0) if len(prompts) == 1 else None
        gens = []
        for prompt in prompts:
            ids = await self.build_prompt(prompt.param, **prompt.kwargs)
            rid = f"{req.rid_prefix}{uuid.uuid4().hex}"
            args = (rid, ids, p.n, p.max_tokens, p.temperature, p.seed)
            gens.append(GenRequest(*args, catalog=p.catalog, finisher=finisher))
        t_tok = time.perf_counter() - t_tok  # prompt building (the requests made at once)
        results = await self.generate(gens)
        back = time.monotonic()  # the results are the handler's, on the event loop
        back_cpu = time.thread_time()
        built = results[0].finished if finisher is not None else None  # by the engine thread
        if isinstance(req, ChatRequest):
            self._count(results)
            (result,) = results
            model = req.model or model
            if req.stream:
                return Answer(
                    results, t_tok, back, list(responses.chat_stream(result, model)), back_cpu
                )
            body = built if built is not None else await self.chat_json(result, model)
            return Answer(results, t_tok, back, body, back_cpu)
        results = [responses.returned(r, req.params.num_return) for r in results]  # best n of k
        latency = time.perf_counter() - t0
        self._count(results)
        if req.stream:
            outs = [responses.generate_result(r, latency) for r in results]
            events = [responses.sse(outs if req.batched else outs[0]), b"data: [DONE]\n\n"]
            return Answer(results, t_tok, back, events, back_cpu)
        if built is not None:
            return Answer(results, t_tok, back, f"[{built}]" if req.batched else built, back_cpu)
        texts = await asyncio.gather(*(self.generate_json(r, latency) for r in results))
        body = f"[{','.join(texts)}]" if req.batched else texts[0]
        return Answer(results, t_tok, back, body, back_cpu)

    def _finisher(
        self, req: ChatRequest | GenerateRequest, model: str, t0: float
    ) -> Callable[[GenResult], str] | None:
        """The body of a one-prompt, unstreamed answer, for the engine thread to build when
        it is idle (``FLASHREC_ANSWER_ON_ENGINE=idle``; None: the handler builds it). Built
        with the same functions and arguments as the handler's own build."""
        if ANSWER_ON_ENGINE != "idle" or req.stream or self.respond is not None:
            return None
        if isinstance(req, ChatRequest):
            name = req.model or model
            return lambda res: responses.chat_completion_json(res, name, int(time.time()))
        num_return = req.params.num_return
        return lambda res: responses.generate_result_json(
            responses.returned(res, num_return), time.perf_counter() - t0
        )

    def _count(self, results: list[GenResult]) -> None:
        for r in results:
            self.metrics.completion_tokens += r.completion_tokens
            self.metrics.cached_tokens += r.cached_tokens

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

    def _build(self, kwargs: dict[str, Any], ticket: int) -> list[int]:
        """On a prompt-building thread: borrow a builder (never shared by two threads; there
        are as many builders as threads, and one may be out on the event loop for the moment
        of an inline build), build, give it back."""
        with self._waiting_lock:
            self._waiting.pop(ticket, None)
        build = self._builders.get()
        try:
            return build(**kwargs)
        finally:
            self._builders.put(build)

    def _build_large(self, kwargs: dict[str, Any]) -> list[int]:
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
        """The prompt ``kwargs`` describe, built off the event loop on a builder of its own (on
        the loop itself for a small prompt on an otherwise idle server, under
        ``FLASHREC_PROMPT_INLINE``); bad input is a 400 on ``param``; the result is checked
        against ``--max-seq-len`` and the vocabulary."""
        aloop = asyncio.get_running_loop()
        if self._guard is not None:
            kwargs = {**kwargs, "guard": self._guard}
        try:
            chars = prompt_chars(kwargs)
            if chars > LARGE_PROMPT_CHARS:
                ids = await self._run_large(kwargs)
            elif (inline := self._inline_builder(chars)) is not None:
                try:
                    ids = inline(**kwargs)
                finally:
                    self._builders.put(inline)
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

    def _inline_builder(self, chars: int) -> PromptBuilder | None:
        """A free builder for building on the event loop (``FLASHREC_PROMPT_INLINE=idle``),
        when the prompt is small and its handler is the only one; None otherwise (a thread
        builds it, as for a call from outside a handler)."""
        if PROMPT_INLINE != "idle" or chars > INLINE_PROMPT_CHARS or self.active_handlers != 1:
            return None
        try:
            return self._builders.get_nowait()
        except queue.Empty:  # a withdrawn request's prompt still being built on a thread
            return None

    async def _run_large(self, kwargs: dict[str, Any]) -> list[int]:
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

    def submit(self, req: GenRequest) -> Future[GenResult]:
        """``engine.submit`` with the errors mapped: queue full -> 503, a request the engine
        can never serve (its checks: n, prompt vs. KV pool) -> 400."""
        try:
            fut = self.engine.submit(req)
        except QueueFullError as exc:
            raise busy(f"the request queue is full ({exc})") from None
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        self.inflight.add(req.rid)
        return fut

    async def result(self, rid: str, fut: Future[GenResult]) -> GenResult:
        """Wait for ``fut``; a cancelled wait (client gone) cancels ``rid`` in the engine."""
        try:
            res = await await_engine(fut)
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
            self.engine.cancel(rid)

    async def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        """Submit every request, then wait for all; any failure cancels the others.

        One request (every chat completion) is awaited directly: no task and no gather, so
        its result reaches the handler in the same event-loop turn as the engine's wake-up.
        ``result`` already withdraws it when the wait is cancelled."""
        if len(reqs) == 1:
            (req,) = reqs
            return [await self.result(req.rid, self.submit(req))]
        waits: list[asyncio.Task[GenResult]] = []
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
