"""Load generation: closed-loop concurrency, bursts, open-loop Poisson / constant rate, radix
control.

``burst`` sends ``concurrency`` requests at once, waits for every answer, then sends the next
``concurrency``: "N requests at once", the way a batch of recommendations for N users arrives.
Its round metrics add the bursts' makespans (first send -> last answer of a burst).

Radix state is set the same way before every round: ``cold`` flushes the prefix cache;
``warm`` flushes it and then primes it with the cell's warm-up requests (never counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import numpy as np

from harness.load.client import Pending, Record, Request, post_json, send
from harness.load.sids import SidChecker
from harness.load.workload import Prompt, PromptRenderer
from harness.spec.cells import ClientSettings


@dataclass(frozen=True)
class Target:
    """Where and how to send a cell's requests."""

    base_url: str
    protocol: str
    checker: SidChecker
    timeout_s: float
    ks: list[int]


OnDone = Callable[[Record], None]


def make_requests(
    prompts: list[Prompt],
    client: ClientSettings,
    max_tokens: int,
    renderer: PromptRenderer | None,
    model: str,
) -> list[Request]:
    """Requests for prompts under a cell's sampling settings (text rendered for /generate)."""
    out = []
    for p in prompts:
        text = renderer.render(p.messages) if renderer is not None else None
        out.append(
            Request(
                prompt=p,
                n=client.beam_width,
                max_tokens=max_tokens,
                temperature=client.temperature,
                text=text,
                seed=client.seed,
                model=model,
                catalog=client.catalog,
            )
        )
    return out


async def closed_loop(
    session: aiohttp.ClientSession,
    target: Target,
    requests: list[Request],
    concurrency: int,
    label: tuple[str, int, str],
    on_done: OnDone | None = None,
    first_index: int = 0,
    pending: Pending | None = None,
) -> list[Record]:
    """Send every request once with ``concurrency`` in flight; records in send order, indexed
    from ``first_index``. Answers are parsed after the load (``Pending``), by the caller when
    it passes its own ``pending``."""
    cell, rnd, phase = label
    records: list[Record | None] = [None] * len(requests)
    next_index = 0
    own = pending is None
    pending = pending or Pending(target.protocol, target.checker, target.ks)

    async def worker() -> None:
        nonlocal next_index
        while next_index < len(requests):
            i = next_index
            next_index += 1
            rec = Record(cell, rnd, phase, first_index + i, requests[i].prompt.index, 0.0)
            await send(
                session,
                target.base_url,
                target.protocol,
                requests[i],
                rec,
                target.checker,
                target.timeout_s,
                target.ks,
                pending,
            )
            records[i] = rec
            if on_done:
                on_done(rec)

    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)) or 1)))
    finally:
        if own:
            pending.finish()
    return [r for r in records if r is not None]


async def burst_loop(
    session: aiohttp.ClientSession,
    target: Target,
    requests: list[Request],
    size: int,
    label: tuple[str, int, str],
    on_done: OnDone | None = None,
) -> list[Record]:
    """Send the requests ``size`` at a time, each burst once the previous one is answered;
    record ``i`` belongs to burst ``i // size``. Records in send order."""
    records: list[Record] = []
    size = max(1, size)
    pending = Pending(target.protocol, target.checker, target.ks)  # parsed after every burst
    try:
        for start in range(0, len(requests), size):
            chunk = requests[start : start + size]
            # a closed loop as wide as the burst sends all of it at once and returns when the
            # last answer is in; indices continue across bursts
            records += await closed_loop(
                session, target, chunk, len(chunk), label, on_done, start, pending
            )
    finally:
        pending.finish()
    return records


def arrival_times(mode: str, rate: float, duration_s: float, seed: int) -> list[float]:
    """Send offsets (s) of an open-loop load: Poisson (exponential gaps) or constant rate."""
    rng = np.random.default_rng(seed)
    times, t = [], 0.0
    while True:
        t += float(rng.exponential(1.0 / rate)) if mode == "poisson" else 1.0 / rate
        if t > duration_s:
            return times
        times.append(t)


async def open_loop(
    session: aiohttp.ClientSession,
    target: Target,
    requests: list[Request],
    offsets: list[float],
    label: tuple[str, int, str],
    on_done: OnDone | None = None,
) -> list[Record]:
    """Send request ``i % len(requests)`` at ``offsets[i]`` regardless of responses."""
    cell, rnd, phase = label
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    pending = Pending(target.protocol, target.checker, target.ks)

    async def one(i: int) -> Record:
        req = requests[i % len(requests)]
        rec = Record(cell, rnd, phase, i, req.prompt.index, 0.0)
        await send(
            session,
            target.base_url,
            target.protocol,
            req,
            rec,
            target.checker,
            target.timeout_s,
            target.ks,
            pending,
        )
        if on_done:
            on_done(rec)
        return rec

    for i, offset in enumerate(offsets):
        delay = start + offset - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        pending.finish()


async def run_load(
    session: aiohttp.ClientSession,
    target: Target,
    requests: list[Request],
    client: ClientSettings,
    label: tuple[str, int, str],
    seed: int,
    on_done: OnDone | None = None,
) -> list[Record]:
    """One round of a cell's load (closed loop, bursts, or open loop for ``poisson`` /
    ``constant``).

    The client's own garbage collector is off while the round runs: a full collection of the
    harness process stops its event loop and would delay reads and sends, i.e. be measured
    as server latency. Reference counting still frees almost everything; the allocations
    the round made still count, so the collector runs at its next chance, between rounds."""
    if client.mode in ("poisson", "constant") and client.rate is None:
        raise ValueError(f"load mode '{client.mode}' needs a 'rate'")
    with gc_paused():
        if client.mode == "closed":
            return await closed_loop(session, target, requests, client.concurrency, label, on_done)
        if client.mode == "burst":
            return await burst_loop(session, target, requests, client.concurrency, label, on_done)
        duration = client.duration_s or len(requests) / client.rate
        offsets = arrival_times(client.mode, client.rate, duration, seed)
        return await open_loop(session, target, requests, offsets, label, on_done)


@contextlib.contextmanager
def gc_paused():
    """Python's garbage collector off inside, back to its previous state after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


async def flush_cache(session: aiohttp.ClientSession, base_url: str) -> tuple[bool, str]:
    """``POST /flush_cache``; (ok, detail)."""
    status, body = await post_json(session, f"{base_url}/flush_cache")
    return status == 200, f"HTTP {status}: {str(body)[:200]}"


async def prepare_radix(
    session: aiohttp.ClientSession,
    target: Target,
    mode: str,
    prime: list[Request],
    concurrency: int,
    label: tuple[str, int, str],
) -> tuple[list[Record], str]:
    """Bring the prefix cache to the cell's temperature; returns priming records and a note."""
    ok, detail = await flush_cache(session, target.base_url)
    note = "" if ok else f"flush_cache failed ({detail}): radix temperature not controlled"
    if mode != "warm" or not prime:
        return [], note
    cell, rnd, _ = label
    records = await closed_loop(session, target, prime, concurrency, (cell, rnd, "prime"))
    return records, note
