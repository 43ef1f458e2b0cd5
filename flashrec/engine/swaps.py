"""One live swap at a time (a catalog reload, a weight update): what it stages is built where
the swap is asked, off the engine thread; the swap itself runs on the engine thread; a second
swap of the same kind while one runs is refused (``ReloadBusyError``, HTTP 409), not queued.
Swaps are counted by outcome (ok / rejected / busy) and the last one's engine-thread time kept.
After each swap, what staging freed is given back to the OS (``release_host_memory``): a
server that reloads for weeks must not keep every staging's high-water mark resident.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from flashrec.engine.request import ReloadBusyError

log = logging.getLogger("flashrec")

T = TypeVar("T")


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim`` (None elsewhere: musl, macOS)."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_host_memory() -> None:
    """Give back to the OS the host memory a swap's staging freed: the C heap's free pages,
    which glibc keeps in each thread's arena (``malloc_trim``)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class SwapGuard:
    """``run(stage, swap)``: ``stage()`` (a ValueError refuses the swap, nothing changes), then
    ``swap(staged)`` (returns its engine-thread milliseconds); answers ``(staged, swap_ms,
    wait_ms)``, ``wait_ms`` from asking for the swap to its end."""

    def __init__(self, what: str, busy_message: str, lock: threading.Lock | None = None) -> None:
        self.what = what  # "catalog reload", "weight update": for the log
        self.busy_message = busy_message
        # held by the one swap running; guards given one lock exclude each other (a catalog
        # rollback and a reload), each counting its own outcomes
        self._lock = lock if lock is not None else threading.Lock()
        self._counts = threading.Lock()
        self.outcomes = {"ok": 0, "rejected": 0, "busy": 0}
        self.last_swap_ms = 0.0

    def run(self, stage: Callable[[], T], swap: Callable[[T], float]) -> tuple[T, float, float]:
        if not self._lock.acquire(blocking=False):
            self._count("busy")
            raise ReloadBusyError(self.busy_message)
        try:
            try:
                staged = stage()
            except ValueError as exc:
                self._count("rejected")
                log.warning("%s refused: %s", self.what, exc)
                raise
            t0 = time.perf_counter()
            swap_ms = swap(staged)
            wait_ms = (time.perf_counter() - t0) * 1e3
            self._count("ok")
            self.last_swap_ms = swap_ms
            return staged, swap_ms, wait_ms
        finally:
            self._lock.release()

    def _count(self, outcome: str) -> None:
        with self._counts:
            self.outcomes[outcome] += 1

    def stats(self, prefix: str, last: str) -> dict[str, float]:
        """``{prefix}_ok_total`` / ``_rejected_total`` / ``_busy_total`` and ``last``."""
        out: dict[str, float] = {f"{prefix}_{k}_total": n for k, n in self.outcomes.items()}
        out[last] = self.last_swap_ms
        return out
