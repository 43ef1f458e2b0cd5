"""Answer bodies built in worker processes (``--respond-workers N``).

At wide beams the server process spends ~1.5 ms per 512-beam answer on its text and JSON
(CPU machine), on the event loop. Under continuous batching the requests of one step retire
together, so their answers are built one after another: the H200 n=512, c=8 cell measured a
13 ms mean ``respond`` phase (docs/baselines.md, session 8). Workers build the bodies of
wide answers in parallel, each in its own process (its own GIL), from the result's wire form
(the tuples that cross the engine-process pipe); the event loop only awaits the text.

- Only non-streamed bodies of at least ``MIN_BEAMS`` beams go to a worker: a narrow answer
  costs less to build than to ship.
- A worker makes the beams' text from the SID table the server already holds (handed over
  once, at start), and loads the tokenizer only for a beam with tokens outside it.
- The bodies are the same text as the in-loop builders' (``responses.*_json``).
- A pool that breaks (a worker killed) is dropped with one warning; every later answer is
  built on the event loop, as with ``--respond-workers 0``. No request fails for it.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from flashrec.engine.request import BeamResult, GenResult
from flashrec.server import responses

_log = logging.getLogger("flashrec.server")

MIN_BEAMS = 64  # answers narrower than this are built on the event loop

# ---- in a worker process -----------------------------------------------------------------
_worker: dict[str, Any] = {}


def _init_worker(table: dict[int, str], model_path: str | None) -> None:
    _worker["table"] = table
    _worker["model_path"] = model_path
    _worker["tokenizer"] = None


def _text(tokens: list[int]) -> str:
    """A beam's text: the SID table, else the tokenizer (loaded on first need)."""
    try:
        return "".join(map(_worker["table"].__getitem__, tokens))
    except KeyError:
        if _worker["model_path"] is None:
            return ""
        if _worker["tokenizer"] is None:
            from flashrec.engine.engine import load_tokenizer

            _worker["tokenizer"] = load_tokenizer(_worker["model_path"])
        return _worker["tokenizer"].decode(tokens, skip_special_tokens=False)


def _result(wire: tuple) -> GenResult:
    rid, beams, prompt_tokens, cached = wire
    return GenResult(
        rid,
        [BeamResult(t, c, s, r, _text if x is None else x) for t, c, s, r, x in beams],
        prompt_tokens,
        cached,
    )


def _chat(wire: tuple, model: str, created: int) -> str:
    return responses.chat_completion_json(_result(wire), model, created)


def _generate(wire: tuple, latency: float) -> str:
    return responses.generate_result_json(_result(wire), latency)


# ---- in the server process ---------------------------------------------------------------
def _wire(result: GenResult) -> tuple:
    """What a worker needs of ``result``: its beams' values and their text where it is made
    already (a string source, or read before), never a text function: the worker makes the
    rest from its SID table."""
    from flashrec.engine.scheduler import SidText  # the server process has it imported

    beams = [
        (
            b.token_ids,
            b.cum_logprob,
            b.sequence_score,
            b.finish_reason,
            # a text source other than a SID table (a test's, a future engine's) runs here
            b._text if b._text is not None or isinstance(b.text_source, SidText) else b.text,
        )
        for b in result.beams
    ]
    return (result.rid, beams, result.prompt_tokens, result.cached_tokens)


class RespondPool:
    """``workers`` processes building answer bodies; ``table``: token id -> text of every SID
    token (the server's ``SidText`` table); ``model_path``: where a worker loads the tokenizer
    for other tokens (None: such beams get "" as text, as without a tokenizer)."""

    def __init__(self, workers: int, table: dict[int, str], model_path: str | None) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = ProcessPoolExecutor(
            workers,
            mp_context=mp.get_context("spawn"),  # never fork a process that holds threads
            initializer=_init_worker,
            initargs=(dict(table), model_path),
        )
        self.built = 0  # bodies built by the workers (tests, logs)

    def start(self) -> None:
        """Start every worker now (spawn and import), not on the first wide answer."""
        pool = self._pool
        if pool is not None:
            for f in [pool.submit(_text, []) for _ in range(self.workers)]:
                f.result()

    def takes(self, result: GenResult) -> bool:
        return self._pool is not None and len(result.beams) >= MIN_BEAMS

    async def chat_json(self, result: GenResult, model: str, created: int) -> str:
        """``responses.chat_completion_json(result, model, created)``, built by a worker when
        ``takes(result)``, else here."""
        if self.takes(result):
            text = await self._run(_chat, _wire(result), model, created)
            if text is not None:
                return text
        return responses.chat_completion_json(result, model, created)

    async def generate_json(self, result: GenResult, latency: float) -> str:
        """``responses.generate_result_json(result, latency)``, as ``chat_json``."""
        if self.takes(result):
            text = await self._run(_generate, _wire(result), latency)
            if text is not None:
                return text
        return responses.generate_result_json(result, latency)

    async def _run(self, fn, *args) -> str | None:
        pool = self._pool
        if pool is None:
            return None
        try:
            text = await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except BrokenProcessPool:
            if self._pool is pool:
                _log.warning(
                    "--respond-workers: a worker process died; answers are built in the "
                    "server process from now on"
                )
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            return None
        self.built += 1
        return text

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
