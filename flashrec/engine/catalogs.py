"""Catalog hot reload: load, validate and build a new catalog off the engine thread, then swap
it in on the engine thread between steps. Requests in flight finish on the catalog they were
admitted with; requests admitted after the swap take the new one. One reload (or rollback) at
a time: a second one while the first runs is refused (``ReloadBusyError``, HTTP 409), not
queued. A named catalog keeps the version a reload replaced; a rollback returns to it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from flashrec.engine.swaps import SwapGuard, release_host_memory

if TYPE_CHECKING:
    from flashrec.engine.engine import Engine
    from flashrec.sid.catalog_set import CatalogSet

log = logging.getLogger("flashrec")


class CatalogReloader:
    """``reload(path)`` on any thread but the engine thread: builds the catalog where it is
    called (``engine.build_catalog``), swaps it through ``call`` (runs a function on the
    engine thread between steps) and answers with the new catalog's identity and timings.
    Counts reloads by outcome (ok / rejected / busy) and keeps the last swap's time."""

    def __init__(self, engine: Engine, call: Callable[[Callable[[], Any]], Future]) -> None:
        self.engine = engine
        self.call = call
        busy = "a catalog reload or rollback is already running; retry once it answers"
        self.guard = SwapGuard("catalog reload", busy)
        self.rollbacks = SwapGuard("catalog rollback", busy, lock=self.guard._lock)

    def reload(
        self, path: str, packed_base: int | None = None, name: str | None = None
    ) -> dict[str, Any]:
        """ValueError for a file that cannot serve or an unknown ``name`` (nothing changes),
        ``ReloadBusyError`` while another reload or rollback runs. ``packed_base``: the base
        of the file's packed-integer keys (None: the server's ``--packed-base``, else RecIF's
        8192). ``name``: the catalog it replaces (None: the default)."""

        def stage() -> Any:
            build = getattr(self.engine, "build_catalog", None)
            if build is None:
                raise ValueError("this engine cannot reload its catalog")
            if name is not None:
                self._catalogs().entry(name)  # UnknownCatalogError naming the held ones
            return build(path) if packed_base is None else build(path, packed_base)

        def swap(version: Any) -> float:
            return self.call(lambda: self.engine.swap_catalog(version, name)).result()

        version, swap_ms, wait_ms = self.guard.run(stage, swap)
        t0 = time.perf_counter()
        release_host_memory()  # the parse's and the CPU trie's freed pages
        release_ms = (time.perf_counter() - t0) * 1e3
        log.info(
            "catalog %s swapped in: %d SIDs, hash %s (load %.1f ms, build %.1f ms, "
            "swap %.3f ms after %.1f ms waiting for the step; released in %.1f ms)",
            path, version.size, version.hash, version.load_ms, version.build_ms,
            swap_ms, wait_ms, release_ms,
        )  # fmt: skip
        out: dict[str, Any] = {"success": True}
        catalogs = getattr(self.engine, "catalogs", None)
        if catalogs is not None:  # which name and version it became
            entry = catalogs.entry(name)
            out.update(name=entry.name, version=entry.version)
            out["previous_version"] = entry.previous_version
        return {
            **out,
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
            "release_ms": round(release_ms, 3),  # after the swap: the freed heap to the OS
        }

    def rollback(self, name: str | None = None) -> dict[str, Any]:
        """Catalog ``name`` (None: the default) serves its previous version again, swapped
        in on the engine thread between steps. ValueError for an unknown name or a catalog
        with no previous version (nothing changes), ``ReloadBusyError`` while a reload or
        another rollback runs."""

        def stage() -> None:
            self._catalogs().rollback_target(name)  # NoPreviousCatalogError: none to return to

        def swap(_: None) -> float:
            return self.call(lambda: self.engine.rollback_catalog(name)).result()

        _, swap_ms, wait_ms = self.rollbacks.run(stage, swap)
        entry = self.engine.catalogs.entry(name)
        version = entry.current
        log.info(
            "catalog %s rolled back to version %d (%s, hash %s)",
            entry.name, entry.version, version.path, version.hash,
        )  # fmt: skip
        return {
            "success": True,
            "name": entry.name,
            "version": entry.version,
            "path": version.path,
            "catalog_hash": version.hash,
            "sids": version.size,
            "swap_ms": round(swap_ms, 3),
            "swap_wait_ms": round(wait_ms, 3),
        }

    def _catalogs(self) -> CatalogSet:
        """The engine's named catalogs; ValueError for an engine without (a test's fake)."""
        catalogs = getattr(self.engine, "catalogs", None)
        if catalogs is None:
            raise ValueError("this engine holds no named catalogs")
        return catalogs

    def stats(self) -> dict[str, float]:
        out = self.guard.stats("catalog_reloads", "catalog_last_swap_ms")
        out.update(self.rollbacks.stats("catalog_rollbacks", "catalog_last_rollback_ms"))
        return out
