"""A bound on CPU wake-up latency while requests are served (``--cpu-dma-latency-us``).

At low concurrency the server's threads sleep through each request's engine time, and a core
left idle drops into a deep idle state: waking it, and its cold caches, cost the first host
work after the engine answers. Linux takes a bound for every CPU's wake-up latency from
``/dev/cpu_dma_latency`` (PM QoS): while the file is open with a bound written to it, no CPU
enters an idle state slower to leave than that. :class:`CpuLatencyHold` writes the bound when
a generation request begins and lifts it ``linger_s`` after the last one ends, so a server
with no traffic leaves the cores free to sleep. The bound is the system's: any process's
request holds every CPU.
"""

from __future__ import annotations

import asyncio
import os
import struct

DEVICE = "/dev/cpu_dma_latency"
NO_BOUND_US = 2_000_000_000  # the kernel's default request: no bound
LINGER_S = 0.05  # a closed-loop client's next request arrives well within this


class CpuLatencyHold:
    """``us`` written to :data:`DEVICE` while requests are in flight (event-loop thread only).

    :meth:`open` raises ``OSError`` when the file cannot be written (not Linux, or not root):
    the server refuses to start rather than serve without the bound it was asked for."""

    def __init__(self, us: int, path: str | None = None, linger_s: float = LINGER_S) -> None:
        self.us = us
        self.path = path or DEVICE
        self.linger_s = linger_s
        self.active = 0  # requests in flight
        self.held = False  # the bound is written now
        self.engaged = 0  # times the bound was written (each after an idle spell)
        self._fd: int | None = None
        self._release: asyncio.TimerHandle | None = None

    def open(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_WRONLY)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"--cpu-dma-latency-us {self.us}: cannot open {self.path} for writing "
                f"({exc.strerror}); it needs Linux and root (or write access to that file). "
                "Leave the flag at -1 to serve without the bound",
            ) from None
        self._write(NO_BOUND_US)

    def _write(self, us: int) -> None:
        if self._fd is not None:
            os.write(self._fd, struct.pack("=i", us))

    @property
    def bound_us(self) -> int:
        """The bound held now, -1 when none."""
        return self.us if self.held else -1

    def enter(self) -> None:
        """A request began: the bound is written unless it is held already."""
        self.active += 1
        if self._release is not None:
            self._release.cancel()
            self._release = None
        if not self.held:
            self._write(self.us)
            self.held = True
            self.engaged += 1

    def leave(self) -> None:
        """A request ended: with none left, the bound is lifted after ``linger_s``."""
        self.active -= 1
        if self.active == 0 and self.held and self._release is None:
            loop = asyncio.get_running_loop()
            self._release = loop.call_later(self.linger_s, self._lift)

    def _lift(self) -> None:
        self._release = None
        if self.active == 0 and self.held:
            self._write(NO_BOUND_US)
            self.held = False

    def close(self) -> None:
        """Lift the bound and close the file (closing alone would lift it too)."""
        if self._release is not None:
            self._release.cancel()
            self._release = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.held = False
