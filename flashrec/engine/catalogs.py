"""Catalog hot reload: load, validate and build a new catalog off the engine thread, then swap
it in on the engine thread between steps. Requests in flight finish on the catalog they were
admitted with; requests admitted after the swap take the new one. One reload at a time: a
second one while the first runs is refused (``ReloadBusyError``, HTTP 409), not queued.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from flashrec.engine.swaps import SwapGuard

if TYPE_CHECKING:
    from flashrec.engine.engine import Engine

log = logging.getLogger("flashrec")


class CatalogReloader:
    """``reload(path)`` on any thread but the engine thread: builds the catalog where it is
    called (``engine.build_catalog``), swaps it through ``call`` (runs a function on the
    engine thread between steps) and answers with the new catalog's identity and timings.
    Counts reloads by outcome (ok / rejected / busy) and keeps the last swap's time."""

    def __init__(self, engine: Engine, call: Callable[[Callable[[], Any]], Future]) -> None:
        self.engine = engine
        self.call = call
        self.guard = SwapGuard(
            "catalog reload", "a catalog reload is already running; retry once it answers"
        )

    def reload(self, path: str, packed_base: int | None = None) -> dict[str, Any]:
        """ValueError for a file that cannot serve (nothing changes), ``ReloadBusyError``
        while another reload runs. ``packed_base``: the base of the file's packed-integer keys
        (None: the server's ``--packed-base``, else RecIF's 8192)."""

        def stage() -> Any:
            build = getattr(self.engine, "build_catalog", None)
            if build is None:
                raise ValueError("this engine cannot reload its catalog")
            return build(path) if packed_base is None else build(path, packed_base)

        def swap(version: Any) -> float:
            return self.call(lambda: self.engine.swap_catalog(version)).result()

        version, swap_ms, wait_ms = self.guard.run(stage, swap)
        log.info(
            "catalog %s swapped in: %d SIDs, hash %s (load %.1f ms, build %.1f ms, "
            "swap %.3f ms after %.1f ms waiting for the step)",
            path, version.size, version.hash, version.load_ms, version.build_ms,
            swap_ms, wait_ms,
        )  # fmt: skip
        return {
            "success": True,
            "path": version.path,
            "catalog_hash": version.hash,
            "sids": version.size,
            "depth": version.depth,
            "load_ms": round(version.load_ms, 3),
            "build_ms": round(version.build_ms, 3),
            # the engine thread's own work, and how long the reload waited for it (the
            # step running when it was asked, then the swap)
            "swap_ms": round(swap_ms, 3),
            "swap_wait_ms": round(wait_ms, 3),
        }

    def stats(self) -> dict[str, float]:
        return self.guard.stats("catalog_reloads", "catalog_last_swap_ms")
