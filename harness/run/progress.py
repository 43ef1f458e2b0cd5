"""Progress display: cells done / total, the current cell and phase, live QPS, ETA.

On a terminal one status line is redrawn in place; otherwise (CI logs) plain lines are printed
on every phase change and at most every ``interval_s`` in between.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import TextIO


def _fmt_s(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    """Tracks and prints the campaign's progress to ``stream`` (stderr by default)."""

    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        interval_s: float = 10.0,
        window_s: float = 5.0,
    ) -> None:
        self.total = total
        self.done = 0
        self.failed = 0
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = 0.25 if self.tty else interval_s
        self.window_s = window_s
        self.started = time.monotonic()
        self.cell = ""
        self.phase = ""
        self.cell_times: list[float] = []
        self.cell_started = self.started
        self._ends: deque[float] = deque()
        self._last_print = 0.0

    def qps(self) -> float:
        """Completed requests per second over the last ``window_s``."""
        now = time.monotonic()
        while self._ends and self._ends[0] < now - self.window_s:
            self._ends.popleft()
        span = min(self.window_s, now - self.started) or 1e-9
        return len(self._ends) / span

    def eta(self) -> float | None:
        """Seconds left, from the mean time of finished cells (None before the first)."""
        if not self.cell_times:
            return None
        return sum(self.cell_times) / len(self.cell_times) * (self.total - self.done)

    def line(self) -> str:
        eta = self.eta()
        parts = [
            f"[{self.done}/{self.total} cells"
            + (f", {self.failed} failed]" if self.failed else "]"),
            self.cell,
            self.phase,
            f"{self.qps():.1f} req/s",
            f"ETA {_fmt_s(eta)}" if eta is not None else "ETA ?",
            f"elapsed {_fmt_s(time.monotonic() - self.started)}",
        ]
        return "  ".join(p for p in parts if p)

    def _emit(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_print < self.interval_s:
            return
        self._last_print = now
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line()[:200])
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line of its own (server start, failures, ...)."""
        if self.tty:
            self.stream.write("\r\x1b[2K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def start_cell(self, cell_id: str) -> None:
        self.cell, self.phase = cell_id, "starting"
        self.cell_started = time.monotonic()
        self._emit(force=True)

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self._emit(force=not self.tty)

    def request_done(self, record: object = None) -> None:
        self._ends.append(time.monotonic())
        self._emit()

    def end_cell(self, status: str, skipped: bool = False, one_time_s: float = 0.0) -> None:
        """``one_time_s``: run-wide work this cell did for all (a generated dataset), kept out
        of the ETA's time per cell."""
        self.done += 1
        self.failed += status == "failed"
        if not skipped:
            self.cell_times.append(max(0.0, time.monotonic() - self.cell_started - one_time_s))
        self.phase = status
        self._emit(force=True)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
