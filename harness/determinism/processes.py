"""Fresh server processes, one after another, each answering the whole workload: the
:class:`Plan` (how to launch and send) and :func:`run_processes`."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from harness.determinism.bitwise import Answer, Item, parse_answer
from harness.parity import FETCH_ERRORS, body_for, post, request_for


def _model(model_path: str, catalog: str | None) -> Any:
    from harness.spec.model import ResolvedModel

    return ResolvedModel(model_path, catalog, "-", "path", 0)


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    protocol: str,
    item: Item,
    max_tokens: int,
    timeout_s: float,
) -> Answer:
    path, body = body_for(
        protocol, request_for(item.messages, item.text, item.n, max_tokens, item.index)
    )
    try:
        return parse_answer(protocol, await post(session, url + path, body, timeout_s))
    except FETCH_ERRORS as exc:
        return Answer(error=f"{type(exc).__name__}: {exc}"[:300])


async def _drive(
    url: str, protocol: str, items: list[Item], concurrency: int, max_tokens: int, timeout_s: float
) -> list[Answer]:
    answers: list[Answer] = [Answer() for _ in items]
    queue = list(range(len(items)))[::-1]
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            while queue:
                i = queue.pop()
                answers[i] = await _send(session, url, protocol, items[i], max_tokens, timeout_s)

        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return answers


@dataclass(frozen=True)
class Plan:
    """How to launch the servers and send the workload."""

    model_path: str
    sid_vocab_file: str | None = None
    protocol: str = "chat"
    concurrency: int = 8
    max_tokens: int | None = None
    server_args: dict = field(default_factory=dict)
    server_env: dict = field(default_factory=dict)
    device: str | None = None
    timeout_s: float = 300.0


def run_processes(
    plan: Plan,
    items: list[Item],
    processes: int,
    mode: str,
    log_dir: Path,
    env: dict | None = None,
    label: str = "",
    log: Any = print,
) -> tuple[list[list[Answer]], list[Path]]:
    """``processes`` fresh servers one after another; each answers every item (in order: one
    at a time in ``sequential`` mode, ``plan.concurrency`` in flight in ``concurrent``)."""
    from harness.servers.launch import LaunchedServer
    from harness.spec.matrix import EngineSpec

    engine = EngineSpec(
        name="flashrec",
        kind="flashrec",
        device=plan.device,
        env={**plan.server_env, **(env or {})},
        startup_timeout_s=600,
    )
    max_tokens = plan.max_tokens or _default_max_tokens(plan.sid_vocab_file)
    runs, logs = [], []
    label = label or mode
    conc = 1 if mode == "sequential" else plan.concurrency
    for p in range(processes):
        path = log_dir / f"{label}-{p}.log"
        path.unlink(missing_ok=True)
        srv = LaunchedServer(
            engine, plan.server_args, _model(plan.model_path, plan.sid_vocab_file), path
        )
        t0 = time.monotonic()
        try:
            asyncio.run(_start(srv))
            runs.append(
                asyncio.run(
                    _drive(srv.base_url, plan.protocol, items, conc, max_tokens, plan.timeout_s)
                )
            )
        finally:
            srv.stop()
        logs.append(path)
        log(
            f"determinism: {label} process {p + 1}/{processes}: {len(items)} requests in "
            f"{time.monotonic() - t0:.1f} s"
        )
    return runs, logs


async def _start(srv: Any) -> None:
    async with aiohttp.ClientSession() as session:
        await srv.start(session)


def _default_max_tokens(catalog: str | None) -> int:
    """SID depth + 1 from the catalog (4 without one: 3 levels + the end token)."""
    if not catalog:
        return 4
    try:
        from flashrec.sid.catalog import load_catalog

        return int(load_catalog(catalog).depth) + 1
    except Exception:  # noqa: BLE001 - the server will say what is wrong with it
        return 4
