"""A launched server dies with its launcher: a watchdog pipe.

The launcher opens a pipe, hands the read end to the server (``pass_fds``) and names it in
``$FLASHREC_PARENT_WATCH_FD``; it keeps the write end open, never writing, and closes it to let
go. The server reads the fd on a thread: end-of-file means the launcher's end closed, on
purpose or because the launcher died (``kill -9`` included), and the server stops: SIGTERM to
itself (a serving server drains; one still loading exits at once), then an exit after
``GRACE_S`` whatever it was doing. A pipe needs no launcher thread to stay alive (unlike
Linux's parent-death signal, which follows the launching thread) and works on any POSIX.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

PARENT_WATCH_ENV = "FLASHREC_PARENT_WATCH_FD"
GRACE_S = 3.0

_log = logging.getLogger("flashrec.server")


def _stop_self() -> None:
    """SIGTERM this process, and end it after ``GRACE_S`` if that did not."""
    timer = threading.Timer(GRACE_S, os._exit, args=(1,))
    timer.daemon = True
    timer.start()
    os.kill(os.getpid(), signal.SIGTERM)


def watch_fd(fd: int, on_gone: Callable[[], None] = _stop_self) -> threading.Thread:
    """Call ``on_gone`` (on a daemon thread) once ``fd`` reads end-of-file or fails."""

    def run() -> None:
        try:
            while os.read(fd, 4096):
                pass  # the launcher never writes; anything read is ignored
        except OSError:
            pass
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
        _log.error("the launching process is gone (watch fd %d closed): stopping", fd)
        on_gone()

    thread = threading.Thread(target=run, name="flashrec-parent-watch", daemon=True)
    thread.start()
    return thread


def watch_from_env(on_gone: Callable[[], None] = _stop_self) -> threading.Thread | None:
    """Watch the fd ``$FLASHREC_PARENT_WATCH_FD`` names, if any. The variable is removed so
    that this process's own children do not take the number for theirs; the fd is not
    inherited by them either."""
    raw = os.environ.pop(PARENT_WATCH_ENV, "")
    if not raw:
        return None
    try:
        fd = int(raw)
        os.set_inheritable(fd, False)
    except (ValueError, OSError) as exc:
        _log.warning("ignoring %s=%r: %s", PARENT_WATCH_ENV, raw, exc)
        return None
    return watch_fd(fd, on_gone)


class ParentLink:
    """The launcher's side: ``env`` and ``pass_fds`` for ``Popen``, then ``launched()``;
    ``close()`` lets the server go (it stops itself), as the launcher's death does."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()  # neither inheritable (PEP 446) but by pass_fds

    @property
    def env(self) -> dict[str, str]:
        return {PARENT_WATCH_ENV: str(self._read)}

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._read,) if self._read >= 0 else ()

    def launched(self) -> None:
        """The child holds the read end now: close ours."""
        if self._read >= 0:
            os.close(self._read)
            self._read = -1

    def close(self) -> None:
        self.launched()
        if self._write >= 0:
            os.close(self._write)
            self._write = -1
