"""Trace capture: ``/start_profile`` + ``/stop_profile``, then wait until the files are done.

Writing a trace takes 10-30 s on a GPU server and inflates latencies meanwhile, so after
``/stop_profile`` the harness waits until every trace file in the output directory is complete
(a gzip stream read to its end-of-stream marker and CRC; JSON ending in ``}`` / ``]``) and no
file has changed size or mtime for ``settle_s``. The window from ``/start_profile`` to that
moment is returned so that any request overlapping it can be excluded.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from harness.load.client import now, post_json

TRACE_SUFFIXES = (".json.gz", ".json")


def _in_progress(p: Path) -> bool:
    """Hidden or ``.partial`` / ``.tmp`` names: a file still being written aside."""
    return p.name.startswith(".") or any(t in p.name for t in (".partial", ".tmp"))


def all_files(directory: Path) -> list[Path]:
    """Every file under ``directory`` (finished or not), sorted."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.rglob("*") if p.is_file())


def trace_files(directory: Path) -> list[Path]:
    """Finished-looking trace files under ``directory`` (``*.json.gz`` / ``*.json``), sorted."""
    return _finished(all_files(directory))


def _finished(files: list[Path]) -> list[Path]:
    return [p for p in files if p.name.endswith(TRACE_SUFFIXES) and not _in_progress(p)]


def is_complete(path: Path) -> bool:
    """Whether a trace file is fully written (gzip: every member ends with a valid trailer)."""
    try:
        if path.stat().st_size == 0:
            return False
        if path.name.endswith(".gz"):
            total = 0
            with gzip.open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    total += len(chunk)
            return total > 0
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 64))
            tail = f.read().rstrip()
        return tail.endswith((b"}", b"]"))
    except (EOFError, OSError, zlib.error):
        return False


def _all_complete(files: list[Path]) -> bool:
    return all(is_complete(p) for p in files)


@dataclass
class TraceWait:
    """The outcome of waiting for trace files: status, files, and the time it took."""

    status: str  # complete | timeout | missing
    files: list[dict] = field(default_factory=list)
    waited_s: float = 0.0


MTIME_SLACK_S = 1.0  # file times come from the kernel's coarse clock, a tick behind time.time()


def _written_since(files: list[Path], since: float | None) -> list[Path]:
    if since is None:
        return files
    out = []
    for p in files:
        try:
            if p.stat().st_mtime >= since - MTIME_SLACK_S:
                out.append(p)
        except FileNotFoundError:
            continue
    return out


def _info(files: list[Path]) -> list[dict]:
    out = []
    for p in files:
        try:
            out.append({"path": str(p), "size_bytes": p.stat().st_size})
        except FileNotFoundError:
            continue
    return out


def _signature(files: list[Path]) -> tuple:
    sig = []
    for p in files:
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        sig.append((str(p), st.st_size, st.st_mtime_ns))
    return tuple(sig)


async def wait_until_stable(
    directory: Path,
    settle_s: float,
    timeout_s: float,
    poll_s: float = 0.2,
    min_files: int = 1,
    since: float | None = None,
) -> TraceWait:
    """Wait until ``directory`` holds >= ``min_files`` complete trace files, no file is being
    written aside (hidden / ``.partial`` / ``.tmp``) and nothing changed for ``settle_s``.
    ``since`` (``time.time()`` when the profile was asked for): only files written from then
    count, so an earlier run's traces in the same folder never stand in for this one's.

    Status ``missing`` when no trace appeared, ``timeout`` when they never settled.
    """
    start = time.monotonic()
    last: tuple = ()
    stable_since = start
    checked: tuple | None = None

    def listing() -> list[Path]:
        return _written_since(all_files(directory), since)

    while True:
        everything = listing()
        files = _finished(everything)
        sig = _signature(everything)
        busy = any(_in_progress(p) for p in everything)
        t = time.monotonic()
        if sig != last:
            last, stable_since = sig, t
        elif len(files) >= min_files and not busy and t - stable_since >= settle_s:
            if checked != sig:
                done = await asyncio.to_thread(_all_complete, files)
                checked = sig if done else None
            if checked == sig and _signature(listing()) == sig:
                return TraceWait("complete", _info(files), t - start)
        if t - start > timeout_s:
            return TraceWait("timeout" if files or busy else "missing", _info(files), t - start)
        await asyncio.sleep(poll_s)


def trace_prefix(cell_id: str, limit: int = 64) -> str:
    """A trace-file prefix for a cell that FlashRec's ``/start_profile`` accepts: letters,
    digits, '.', '_' and '-', at most ``limit`` characters. A longer id is cut and ends with a
    hash of the whole id, so two long cell ids that share their start stay apart."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", cell_id) or "cell"
    if len(safe) <= limit:
        return safe
    tag = hashlib.sha1(cell_id.encode()).hexdigest()[:8]
    return f"{safe[: limit - len(tag) - 1]}-{tag}"


async def start_profile(
    session: aiohttp.ClientSession,
    base_url: str,
    output_dir: Path,
    num_steps: int,
    prefix: str,
    extra: dict | None = None,
) -> tuple[bool, str]:
    """``POST /start_profile``; (ok, detail)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "output_dir": str(output_dir.resolve()),
        "num_steps": num_steps,
        "profile_prefix": prefix,
        **(extra or {}),
    }
    status, resp = await post_json(session, f"{base_url}/start_profile", body)
    return status == 200, f"HTTP {status}: {str(resp)[:200]}"


async def stop_profile(session: aiohttp.ClientSession, base_url: str) -> tuple[bool, str]:
    """``POST /stop_profile``; (ok, detail). A server that stopped after ``num_steps`` may
    answer with an error here; the files are what count."""
    status, resp = await post_json(session, f"{base_url}/stop_profile", timeout_s=300)
    return status == 200, f"HTTP {status}: {str(resp)[:200]}"


@dataclass
class TraceWindow:
    """[start, end] on the :func:`harness.load.client.now` clock during which a trace was live or
    being written; requests overlapping it are excluded from the statistics."""

    start: float
    end: float = float("inf")

    def overlaps(self, t0: float, t1: float) -> bool:
        return t0 < self.end and t1 > self.start

    def close(self) -> None:
        self.end = now()
