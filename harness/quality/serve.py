"""One launched server for eval and the dataset generator: FlashRec or the HF reference, on
127.0.0.1 and an ephemeral port, its process group always stopped on exit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from harness.servers.launch import LaunchedServer, fetch_info
from harness.spec.matrix import EngineSpec, Scalar
from harness.spec.model import ResolvedModel


def parse_args(pairs: list[str] | None) -> dict[str, Scalar]:
    """``["dtype=float32", "batch_slots=64"]`` -> flag dict; a pair without ``=`` is an error."""
    out: dict[str, Scalar] = {}
    for pair in pairs or []:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"server argument {pair!r}: expected key=value")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


async def _ready(srv: LaunchedServer) -> None:
    async with aiohttp.ClientSession() as session:
        await srv.wait_healthy(session)
        srv.info = await fetch_info(session, srv.base_url)


@contextlib.contextmanager
def launched(
    kind: str,
    model_path: str,
    catalog: str | None,
    log_path: Path,
    device: str | None = None,
    args: dict[str, Scalar] | None = None,
    startup_timeout_s: float = 600.0,
    catalogs: dict[str, str] | None = None,
) -> Iterator[LaunchedServer]:
    """``kind`` "flashrec" or "reference" (``python -m harness reference-server``);
    ``catalogs``: named catalogs (NAME -> PATH, the default first) a FlashRec serves, each
    as ``--sid-vocab-file NAME=PATH``."""
    if kind == "reference":
        engine = EngineSpec(
            name="hf-reference",
            kind="command",
            command=["python", "-m", "harness", "reference-server"],
            device=device,
            startup_timeout_s=startup_timeout_s,
        )
    else:
        engine = EngineSpec(
            name="flashrec", kind="flashrec", device=device, startup_timeout_s=startup_timeout_s
        )
    named = tuple((n, p, None) for n, p in (catalogs or {}).items())
    model = ResolvedModel(model_path, catalog, "-", "path", 0, catalogs=named)
    srv = LaunchedServer(engine, dict(args or {}), model, log_path)
    try:
        srv.launch()
        asyncio.run(_ready(srv))
        yield srv
    finally:
        srv.stop()
