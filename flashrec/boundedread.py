"""Bounded reads of files named by a flag or a request (catalogs, checkpoints).

A path a client or an operator names may be a FIFO (an open blocks until a writer comes, a
read until it writes), a device (``/dev/zero`` never ends) or a huge file. Every such path is
opened without blocking, must be a regular file (or, for a checkpoint, a directory of them),
at most ``max_bytes`` long, and read whole within ``timeout_s``; otherwise ``FileLimitError``
(a ``ValueError``: HTTP 400, or a start-up error) says which rule it broke.

Readers not handed limits use the calling thread's (``using``: an engine reads its catalogs
under ``--max-catalog-bytes`` and ``--catalog-read-timeout-s``), else the defaults.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BYTES = 2 << 30  # 2 GiB: a RecIF sid2pid.json of ~40 M items
DEFAULT_TIMEOUT_S = 60.0
CHUNK = 1 << 22  # 4 MiB between deadline checks

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
_OPEN_FLAGS |= getattr(os, "O_CLOEXEC", 0)


class FileLimitError(ValueError):
    """A path that is not a regular file, is over the size cap, or took too long to read."""


@dataclass
class Limits:
    """The cap on a file's size (bytes) and on the time to read it whole (seconds; 0 = none)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S


_DEFAULT = Limits()
_local = threading.local()


def current() -> Limits:
    """The limits of the calling thread (``using``), else the defaults."""
    return getattr(_local, "limits", _DEFAULT)


@contextlib.contextmanager
def using(max_bytes: int, timeout_s: float) -> Iterator[Limits]:
    """Reads on this thread, inside the block, use these limits (``--max-catalog-bytes``,
    ``--catalog-read-timeout-s``)."""
    old = getattr(_local, "limits", None)
    _local.limits = Limits(int(max_bytes), float(timeout_s))
    try:
        yield _local.limits
    finally:
        if old is None:
            del _local.limits
        else:
            _local.limits = old


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words (for the error)."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open(path: str | Path, what: str) -> tuple[int, int]:
    """``(fd, size)`` of a regular file, opened without blocking; FileLimitError otherwise."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise FileLimitError(f"{path}: cannot open the {what}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileLimitError(
                f"{path}: the {what} must be a regular file; this is {kind_of(st.st_mode)}"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, int(st.st_size)


def _over(path: str | Path, what: str, size: str, max_bytes: int) -> FileLimitError:
    return FileLimitError(
        f"{path}: the {what} is {size} bytes, over the {max_bytes}-byte cap (--max-catalog-bytes)"
    )


def check_file(path: str | Path, what: str = "file", max_bytes: int | None = None) -> int:
    """The size of ``path``, a regular file of at most ``max_bytes`` (default: ``current()``);
    FileLimitError otherwise. Nothing is read, and nothing blocks on a FIFO."""
    cap = current().max_bytes if max_bytes is None else int(max_bytes)
    fd, size = _open(path, what)
    os.close(fd)
    if cap > 0 and size > cap:
        raise _over(path, what, str(size), cap)
    return size


def read_bytes(
    path: str | Path,
    what: str = "file",
    max_bytes: int | None = None,
    timeout_s: float | None = None,
) -> bytes:
    """The whole of ``path`` (a regular file), refused once more than ``max_bytes`` (it may
    grow while read) or when not read within ``timeout_s`` (default: ``current()``)."""
    lim = current()
    cap = lim.max_bytes if max_bytes is None else int(max_bytes)
    timeout = lim.timeout_s if timeout_s is None else float(timeout_s)
    fd, size = _open(path, what)
    try:
        if cap > 0 and size > cap:
            raise _over(path, what, str(size), cap)
        deadline = time.monotonic() + timeout if timeout > 0 else None
        parts: list[bytes] = []
        got = 0
        while True:
            try:
                chunk = os.read(fd, CHUNK)
            except OSError as exc:
                raise FileLimitError(f"{path}: cannot read the {what}: {exc}") from None
            if not chunk:
                break
            got += len(chunk)
            if cap > 0 and got > cap:
                raise _over(path, what, f"more than {cap}", cap)
            parts.append(chunk)
            if deadline is not None and time.monotonic() > deadline:
                raise FileLimitError(
                    f"{path}: the {what} was not read within {timeout:g} s "
                    f"({got} bytes so far; --catalog-read-timeout-s)"
                )
        return b"".join(parts)
    finally:
        os.close(fd)


def read_text(
    path: str | Path,
    what: str = "file",
    max_bytes: int | None = None,
    timeout_s: float | None = None,
) -> str:
    """``read_bytes`` decoded as UTF-8 (``UnicodeDecodeError`` for other bytes), newlines
    translated as ``open()`` in text mode does (``\\r\\n`` and ``\\r`` become ``\\n``)."""
    text = read_bytes(path, what, max_bytes, timeout_s).decode("utf-8")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def check_checkpoint(path: str | Path) -> None:
    """``path`` is a checkpoint directory whose entries are regular files or directories (a
    FIFO or a device among them would hang or flood the model load); FileLimitError
    otherwise. Entries are stat'ed, not opened."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise FileLimitError(f"{p}: cannot read the checkpoint: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise FileLimitError(
            f"{p}: the checkpoint must be a directory (config.json, tokenizer, safetensors); "
            f"this is {kind_of(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}"
        )
    for entry in os.scandir(p):
        try:
            mode = entry.stat().st_mode  # follows links: what a load would open
        except OSError:
            continue  # a dangling link: the load names it if it needs it
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise FileLimitError(
                f"{p}: checkpoint entry {entry.name!r} must be a regular file; this is "
                f"{kind_of(mode)}"
            )
