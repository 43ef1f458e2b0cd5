"""Python garbage-collector pauses of the serving process: measured, exported, made rare.

A full (generation-2) collection walks every object the collector tracks and holds the GIL
all the while, so the engine thread stops with it: for that time the GPU gets no launches.
After start-up a serving process tracks a few hundred thousand objects or more (torch,
transformers, the tokenizer, aiohttp), so a full collection is a long pause, and the collector
triggers one by itself, now and then, as requests allocate. ``--gc-freeze`` (on by default)
moves everything alive after warm-up to the permanent generation (``gc.freeze``), so
collections walk only what requests allocated.

:class:`GcWatch` times every collection through ``gc.callbacks`` and feeds ``/metrics``. The
callback only counts (a collection can start in any thread at any allocation, so it must not
take locks such as the logging module's); :meth:`GcWatch.report_slow` logs the slow pauses
later, from the engine thread's step hook.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

_log = logging.getLogger("flashrec.server")

SLOW_PAUSE_S = 0.05  # a pause at least this long is logged (once per pause)


def freeze_startup_objects(watch: GcWatch | None = None) -> int:
    """Collect once, then move every surviving object to the permanent generation; returns
    how many objects are frozen, which ``watch`` keeps for ``/metrics`` (counting them walks
    them all: tens of milliseconds holding the GIL, not something to do per scrape).
    ``watch`` does not count this deliberate collection."""
    if watch is not None:
        watch.ignoring = True
    try:
        gc.collect()
    finally:
        if watch is not None:
            watch.ignoring = False
    gc.freeze()
    frozen = gc.get_freeze_count()
    if watch is not None:
        watch.frozen = frozen
    return frozen


class GcWatch:
    """Collections and their pauses per generation, since :meth:`install`."""

    def __init__(self, slow_s: float = SLOW_PAUSE_S) -> None:
        self.slow_s = slow_s
        self.collections = [0, 0, 0]
        self.pause_s = [0.0, 0.0, 0.0]
        self.max_pause_s = 0.0
        self.slow = 0  # pauses >= slow_s
        self._last_slow: tuple[int, float] = (0, 0.0)  # generation and pause of the latest
        self._reported = 0
        self._t0 = 0.0
        self._installed = False
        self.ignoring = False  # set around a deliberate collection (the freeze's own)
        self.frozen = 0  # objects frozen at start-up (freeze_startup_objects)
        self._saved_threshold: tuple[int, ...] | None = None  # before install's threshold

    def install(self, gen0_threshold: int = 0) -> GcWatch:
        """Start timing collections; ``gen0_threshold`` > 0 also sets the collector's
        generation-0 threshold (``--gc-gen0-threshold``) until :meth:`uninstall`."""
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True
        if gen0_threshold > 0:
            if self._saved_threshold is None:
                self._saved_threshold = gc.get_threshold()
            gc.set_threshold(gen0_threshold, *self._saved_threshold[1:])
        return self

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False
        if self._saved_threshold is not None:  # an in-process server leaves it as found
            gc.set_threshold(*self._saved_threshold)
            self._saved_threshold = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if self.ignoring:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        dt = time.perf_counter() - self._t0
        gen = min(int(info.get("generation", 2)), 2)
        self.collections[gen] += 1
        self.pause_s[gen] += dt
        self.max_pause_s = max(self.max_pause_s, dt)
        if dt >= self.slow_s:
            self.slow += 1
            self._last_slow = (gen, dt)

    def report_slow(self, step: int | None = None) -> None:
        """Log the slow pauses seen since the last call (outside any collection)."""
        if self.slow == self._reported:
            return
        new, self._reported = self.slow - self._reported, self.slow
        gen, dt = self._last_slow
        _log.warning(
            "%d garbage-collector pause(s) >= %.0f ms%s; the latest: generation %d, %.0f ms "
            "(every thread, the engine's included, stops for it; --gc-freeze keeps them rare)",
            new,
            self.slow_s * 1000,
            "" if step is None else f" by engine step {step}",
            gen,
            dt * 1000,
        )

    def metrics(self) -> dict[str, Any]:
        """Samples for ``/metrics``."""
        return {
            "collections": list(self.collections),
            "pause_s": list(self.pause_s),
            "max_pause_s": self.max_pause_s,
            "slow": self.slow,
            "frozen": self.frozen,
            "gen0_threshold": gc.get_threshold()[0],
        }
