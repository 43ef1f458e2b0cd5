"""Answer bodies built in worker processes (``--respond-workers N``).

At wide beams the text and JSON of an answer cost the server process milliseconds, on the
event loop. Under continuous batching the requests of one step retire together, so their
answers are built one after another and the last waits for all the others. Workers build
the bodies of wide answers in parallel, each in its own process (its own GIL), from the
result's wire form (the columns that cross the engine-process pipe); the event loop only
awaits the text.

- Only non-streamed bodies of at least ``MIN_BEAMS`` beams go to a worker: a narrow answer
  costs less to build than to ship.
- A result crosses to a worker in the engine-process pipe's wire form; the worker makes the
  beams' text with a ``SidText`` over the table the server already holds (handed over once,
  at start), which loads the tokenizer only for a beam with tokens outside it.
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

from flashrec.engine.request import BeamColumns, BeamResult, GenResult, SidText
from flashrec.server import responses
from flashrec.server.engine_process import result_from_wire, result_to_wire

_log = logging.getLogger("flashrec.server")

MIN_BEAMS = 64  # answers narrower than this are built on the event loop

# ---- in a worker process -----------------------------------------------------------------
_worker: dict[str, SidText] = {}


def _init_worker(table: dict[int, str], model_path: str | None) -> None:
    _worker["text"] = SidText.from_table(table, model_path)


def _ready() -> bool:
    """A no-op task: ``RespondPool.start`` runs one per worker to start them all."""
    return "text" in _worker


def _result(wire: tuple, texts: list[str | None]) -> GenResult:
    """The result the engine-process pipe would deliver, with the beams' text made here from
    the SID table, except where the server process sent it made."""
    res = result_from_wire(wire, _worker["text"])
    if any(t is not None for t in texts):
        res.beams = [
            b
            if t is None
            else BeamResult(b.token_ids, b.cum_logprob, b.sequence_score, b.finish_reason, t)
            for b, t in zip(res.beams, texts)
        ]
    return res


def _chat(wire: tuple, texts: list[str | None], model: str, created: int) -> str:
    return responses.chat_completion_json(_result(wire, texts), model, created)


def _generate(wire: tuple, texts: list[str | None], latency: float) -> str:
    return responses.generate_result_json(_result(wire, texts), latency)


# ---- in the server process ---------------------------------------------------------------
def _wire(result: GenResult) -> tuple[tuple, list[str | None]]:
    """What a worker needs of ``result``: the engine-process wire form (values, never a text
    function) and each beam's text where it must be made here: already made, or from a
    source other than a SID table (a test's, a future engine's); None where the worker makes
    it from its table."""
    beams = result.beams
    if isinstance(beams, BeamColumns) and isinstance(beams.text_source, SidText):
        return result_to_wire(result), [None] * len(beams)  # no beam object made here
    texts = [
        None if b._text is None and isinstance(b.text_source, SidText) else b.text for b in beams
    ]
    return result_to_wire(result), texts


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
            for f in [pool.submit(_ready) for _ in range(self.workers)]:
                f.result()

    def takes(self, result: GenResult) -> bool:
        return self._pool is not None and len(result.beams) >= MIN_BEAMS

    async def chat_json(self, result: GenResult, model: str, created: int) -> str:
        """``responses.chat_completion_json(result, model, created)``, built by a worker when
        ``takes(result)``, else here."""
        if self.takes(result):
            text = await self._run(_chat, *_wire(result), model, created)
            if text is not None:
                return text
        return responses.chat_completion_json(result, model, created)

    async def generate_json(self, result: GenResult, latency: float) -> str:
        """``responses.generate_result_json(result, latency)``, as ``chat_json``."""
        if self.takes(result):
            text = await self._run(_generate, *_wire(result), latency)
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
