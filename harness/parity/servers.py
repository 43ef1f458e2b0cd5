"""Parity servers: the given URLs or launched ones, an HF reference + FlashRec pair side by side
(:func:`serving`) or one server at a time (:func:`one_server`); process groups are stopped on
exit, servers listen on 127.0.0.1 ephemeral ports, logs go where the caller says."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from harness.servers.launch import fetch_info


def _engines(device: str | None, startup_timeout_s: float = 600) -> dict[str, Any]:
    from harness.spec.matrix import EngineSpec

    return {
        "reference": EngineSpec(
            name="hf-reference",
            kind="command",
            command=["python", "-m", "harness", "reference-server"],
            device=device,
            startup_timeout_s=startup_timeout_s,
        ),
        "candidate": EngineSpec(
            name="flashrec", kind="flashrec", device=device, startup_timeout_s=startup_timeout_s
        ),
    }


@contextlib.contextmanager
def one_server(
    role: str,
    args: dict,
    model_path: str | None,
    catalog: str | None,
    log_path: Path,
    device: str | None = None,
    url: str | None = None,
    startup_timeout_s: float = 600,
    engine: Any = None,
) -> Iterator[tuple[str, dict]]:
    """``(URL, /get_server_info)`` of one server: ``url`` when given, else a launched HF
    reference (``role`` "reference") or FlashRec ("candidate") server, or ``engine`` (a
    matrix's EngineSpec, e.g. a peer engine's own command), stopped on exit."""
    from harness.servers.launch import LaunchedServer
    from harness.spec.model import ResolvedModel

    if url:

        async def info() -> dict:
            async with aiohttp.ClientSession() as session:
                return await fetch_info(session, url)

        yield url, asyncio.run(info())
        return
    if not model_path:
        raise ValueError(f"parity: no {role} URL and no model path to launch one on")
    model = ResolvedModel(model_path, catalog, "-", "path", 0)
    engine = engine or _engines(device, startup_timeout_s)[role]
    srv = LaunchedServer(engine, dict(args), model, log_path)
    try:
        srv.launch()
        asyncio.run(_wait_all([srv]))
        yield srv.base_url, srv.info
    finally:
        srv.stop()


async def _wait_all(servers: list) -> None:
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(s.wait_healthy(session) for s in servers))
        for s in servers:
            s.info = await fetch_info(session, s.base_url)


@contextlib.contextmanager
def serving(
    model_path: str | None,
    catalog: str | None,
    log_dir: str | Path,
    reference_url: str | None = None,
    candidate_url: str | None = None,
    device: str | None = None,
    server_args: dict | None = None,
    reference_args: dict | None = None,
) -> Iterator[dict[str, str]]:
    """``{"reference": URL, "candidate": URL}``: the given URLs, else an HF reference server
    and a FlashRec server launched side by side on ``model_path`` (ephemeral ports on
    127.0.0.1, process groups stopped on exit, logs in ``log_dir``)."""
    from harness.servers.launch import LaunchedServer
    from harness.spec.model import ResolvedModel

    urls = {"reference": reference_url, "candidate": candidate_url}
    model = ResolvedModel(model_path, catalog, "-", "path", 0) if model_path else None
    args = {"reference": dict(reference_args or {}), "candidate": dict(server_args or {})}
    engines = _engines(device)
    launched: list[LaunchedServer] = []
    try:
        for role in ("reference", "candidate"):
            if urls[role]:
                continue
            if model is None:
                raise ValueError(f"parity: no {role} URL and no model path to launch one on")
            srv = LaunchedServer(engines[role], args[role], model, Path(log_dir) / f"{role}.log")
            launched.append(srv)
            srv.launch()
            urls[role] = srv.base_url
        if launched:
            asyncio.run(_wait_all(launched))
        yield {k: str(v) for k, v in urls.items()}
    finally:
        for srv in launched:
            srv.stop()
