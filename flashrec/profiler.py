"""Tracing spans and the torch-profiler controller behind ``/start_profile`` ``/stop_profile``.

``trace_range("flashrec.<area>")`` marks a region for torch.profiler (``record_function``) and,
on CUDA machines, for Nsight (an NVTX range). With no profiler active on the calling thread it
costs one C call (~0.1 us) plus the NVTX push/pop where CUDA is present.

:class:`ProfileController` owns at most one torch profiler at a time. NOTE: the torch profiler
records the thread it was started on, so every start and stop runs on the engine thread
(through ``loop.call_on_engine_thread`` or the ``loop.add_step_hook`` callback); the HTTP thread
only asks. State machine::

    idle --start(start_step=0)--> active --stop / num_steps reached--> idle (+ export)
    idle --start(start_step=k)--> pending --k engine steps--> active
    pending --stop--> idle (no files)

Traces are written by a background thread as ``{prefix}-{id}-{timestamp}.trace.json.gz``; each
file appears under its final name only once complete (written aside, then renamed).

NOTE: ``output_dir`` is opened at start, one component at a time from the profiler directory
without following symlinks, and the trace is written through that handle (``dir_fd``); before
writing, the path is walked again and must still reach the same directory, so swapping it for
a symlink (or moving it away) between start and stop refuses the trace instead of redirecting
it. torch writes its uncompressed JSON into a private temporary directory first.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

_log = logging.getLogger("flashrec.profiler")

PROFILER_DIR_ENV = "FLASHREC_TORCH_PROFILER_DIR"
DEFAULT_PROFILER_DIR = "./profiles"
ENGINE_CALL_TIMEOUT_S = 120.0
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_ACTIVITY_NAMES = {"CPU": "CPU", "GPU": "CUDA", "CUDA": "CUDA"}

_profiler_on_thread: Callable[[], bool] = getattr(
    torch._C._autograd, "_profiler_enabled", lambda: True
)
_NVTX = torch.cuda.is_available() and os.environ.get("FLASHREC_NVTX", "1") != "0"


def _profiling() -> bool:
    # The Python-level flag is process-wide and cheap; the C check is per thread.
    return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", True)) and bool(
        _profiler_on_thread()
    )


class trace_range:  # noqa: N801 - used like a function: ``with trace_range("flashrec.x"):``
    """A named span in torch.profiler traces (and an NVTX range on CUDA machines)."""

    __slots__ = ("name", "_rf")

    def __init__(self, name: str) -> None:
        self.name = name
        self._rf: Any = None

    def __enter__(self) -> trace_range:
        if _profiling():
            self._rf = torch.autograd.profiler.record_function(self.name)
            self._rf.__enter__()
        if _NVTX:
            torch.cuda.nvtx.range_push(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        if _NVTX:
            torch.cuda.nvtx.range_pop()
        if self._rf is not None:
            rf, self._rf = self._rf, None
            rf.__exit__(None, None, None)


class ProfileError(ValueError):
    """A profile request that cannot be honoured (the HTTP layer answers 400)."""


class EngineThread(Protocol):
    """The part of ``EngineLoop`` the controller uses."""

    def call_on_engine_thread(self, fn: Callable[[], Any]) -> Future: ...

    def add_step_hook(self, fn: Callable[[int], None]) -> None: ...


@dataclass(frozen=True)
class ProfileOptions:
    """A validated ``/start_profile`` body."""

    output_dir: Path
    num_steps: int | None = None
    start_step: int = 0
    activities: tuple[str, ...] = ("CPU", "CUDA")
    profile_prefix: str = "flashrec"
    profile_id: str = ""
    with_stack: bool = False
    record_shapes: bool = False


def profiler_dir() -> Path:
    """The directory every trace must land in (``$FLASHREC_TORCH_PROFILER_DIR``)."""
    return Path(os.environ.get(PROFILER_DIR_ENV) or DEFAULT_PROFILER_DIR).resolve()


def _typed(body: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise ProfileError(f"'{key}' has the wrong type ({type(v).__name__})")
    return v


def _inside(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


@dataclass(frozen=True)
class OutputDir:
    """An open handle on a profile's ``output_dir`` and the directory it was opened on."""

    fd: int
    dev: int
    ino: int


def open_output_dir(base: Path, out: Path, create: bool = True) -> OutputDir:
    """A handle on ``out`` (inside ``base``), opened component by component from ``base``
    without following a symlink, missing components created when ``create``."""
    fd = os.open(base, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for part in out.relative_to(base).parts:
            if create:
                try:
                    os.mkdir(part, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    return OutputDir(fd, st.st_dev, st.st_ino)


def _still_there(base: Path, out: Path, handle: OutputDir) -> bool:
    """Whether walking ``base`` -> ``out`` again (no symlinks) reaches ``handle``'s directory."""
    try:
        again = open_output_dir(base, out, create=False)
    except OSError:
        return False
    os.close(again.fd)
    return (again.dev, again.ino) == (handle.dev, handle.ino)


def parse_options(body: Mapping[str, Any], base_dir: Path) -> ProfileOptions:
    """Validate a ``/start_profile`` body; ``output_dir`` must resolve inside ``base_dir``.

    A relative ``output_dir`` that already names a place inside ``base_dir`` from the server's
    working directory (``./profiles/run1`` with ``FLASHREC_TORCH_PROFILER_DIR=./profiles``) is
    taken as it is; any other relative one is under ``base_dir`` (``run1``)."""
    if not isinstance(body, Mapping):
        raise ProfileError("the body must be a JSON object")
    base = base_dir.resolve()
    raw_dir = _typed(body, "output_dir", str)
    if raw_dir and "\x00" in raw_dir:
        raise ProfileError("'output_dir' must not contain a NUL character")
    out = base
    if raw_dir:
        from_cwd = Path(raw_dir).resolve()
        # an absolute raw_dir replaces base; a relative one naming a place inside base from
        # the working directory is not put under base a second time
        out = from_cwd if _inside(from_cwd, base) else (base / raw_dir).resolve()
    if not _inside(out, base):
        raise ProfileError(
            f"'output_dir' must be inside the profiler directory {base} ({PROFILER_DIR_ENV})"
        )
    num_steps = _typed(body, "num_steps", int)
    if num_steps is not None and num_steps < 1:
        raise ProfileError("'num_steps' must be >= 1")
    start_step = _typed(body, "start_step", int) or 0
    if start_step < 0:
        raise ProfileError("'start_step' must be >= 0")
    names = _typed(body, "activities", list)
    names = ["CPU", "GPU"] if names is None else names
    acts = []
    for name in names:
        if not isinstance(name, str) or name.upper() not in _ACTIVITY_NAMES:
            raise ProfileError(f"unknown activity {name!r}; known: CPU, GPU (alias CUDA)")
        act = _ACTIVITY_NAMES[name.upper()]
        if act == "CUDA" and not torch.cuda.is_available():
            continue
        if act not in acts:
            acts.append(act)
    if not acts:
        raise ProfileError("no requested activity is available on this machine (no CUDA)")
    names_ok = {}
    for key, default in (("profile_prefix", "flashrec"), ("profile_id", "")):
        v = _typed(body, key, str)
        if v is not None and not _SAFE_NAME.match(v):
            raise ProfileError(
                f"'{key}' must be 1-64 characters, only letters, digits, '.', '_' and '-'"
            )
        names_ok[key] = v or default
    return ProfileOptions(
        output_dir=out,
        num_steps=num_steps,
        start_step=start_step,
        activities=tuple(acts),
        profile_prefix=names_ok["profile_prefix"],
        profile_id=names_ok["profile_id"] or uuid.uuid4().hex[:8],
        with_stack=bool(_typed(body, "with_stack", bool)),
        record_shapes=bool(_typed(body, "record_shapes", bool)),
    )


_IDLE, _PENDING, _ACTIVE = "idle", "pending", "active"


class ProfileController:
    """One torch profiler at a time, started and stopped on the engine thread."""

    def __init__(self, loop: EngineThread, base_dir: Path | None = None) -> None:
        self.loop = loop
        self.base_dir = (base_dir or profiler_dir()).resolve()
        self._lock = threading.Lock()
        self._state = _IDLE
        self._opts: ProfileOptions | None = None
        self._out: OutputDir | None = None  # the handle on _opts.output_dir while not idle
        self._prof: torch.profiler.profile | None = None
        self._countdown = 0
        self._steps = 0
        self._exports: list[Future] = []
        self.last_files: list[str] = []
        # the trace export of a profile that stopped itself after num_steps, until a
        # /stop_profile collects it (it then answers with that trace, as if it had stopped it)
        self._auto_stopped: Future | None = None
        loop.add_step_hook(self._on_step)

    @property
    def state(self) -> str:
        """``idle``, ``pending`` (waiting for ``start_step``) or ``active``."""
        return self._state

    def start(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Begin a profile (blocks until the engine thread has started it). 400 on misuse."""
        opts = parse_options(body, self.base_dir)
        with self._lock:
            if self._state != _IDLE:
                raise ProfileError(f"a profile is already {self._state}; stop it first")
            try:
                self.base_dir.mkdir(parents=True, exist_ok=True)
                out = open_output_dir(self.base_dir, opts.output_dir)
            except OSError as exc:
                raise ProfileError(f"cannot create 'output_dir' {opts.output_dir}: {exc}") from None
            self._opts, self._out = opts, out
            self._state = _PENDING
            self._countdown = opts.start_step
            self._auto_stopped = None
        if opts.start_step == 0:
            try:
                self._on_engine(self._begin)
            except BaseException:
                with self._lock:
                    if self._state == _PENDING:
                        self._state = _IDLE
                        self._close_out()
                raise
        return {
            "profile_id": opts.profile_id,
            "output_dir": str(opts.output_dir),
            "state": self._state,
        }

    def stop(self) -> dict[str, Any]:
        """End the running profile and wait for its trace file. A profile that already stopped
        itself after ``num_steps`` answers with its trace once (``auto_stopped``: true), so a
        script's start / load / stop works either way; 400 when there is nothing to stop."""
        with self._lock:
            state, auto = self._state, self._auto_stopped
            if state == _IDLE:
                self._auto_stopped = None
        if state == _IDLE:
            if auto is not None:
                return {"files": auto.result(timeout=ENGINE_CALL_TIMEOUT_S), "auto_stopped": True}
            hint = f" (the last one wrote {self.last_files})" if self.last_files else ""
            raise ProfileError(f"no profile is running{hint}")
        export = self._on_engine(self._end)
        files = export.result(timeout=ENGINE_CALL_TIMEOUT_S) if export is not None else []
        return {"files": files}

    def shutdown(self) -> None:
        """Stop a running profile (its trace is written) and wait for pending exports."""
        if self._state != _IDLE:
            try:
                self.stop()
            except Exception:  # pragma: no cover - best effort at exit
                _log.exception("stopping the profiler at shutdown failed")
        for fut in list(self._exports):
            try:
                fut.result(timeout=ENGINE_CALL_TIMEOUT_S)
            except Exception:  # pragma: no cover
                _log.exception("writing a trace at shutdown failed")

    # -- engine thread ------------------------------------------------------------------------

    def _on_engine(self, fn: Callable[[], Any]) -> Any:
        return self.loop.call_on_engine_thread(fn).result(timeout=ENGINE_CALL_TIMEOUT_S)

    def _on_step(self, step_index: int) -> None:
        if self._state == _IDLE:
            return
        with self._lock:
            if self._state == _PENDING:
                self._countdown -= 1
                start = self._countdown <= 0
                stop = False
            else:
                self._steps += 1
                start = False
                n = self._opts.num_steps if self._opts else None
                stop = n is not None and self._steps >= n
        if start:
            self._begin()
        elif stop:
            self._end(auto=True)

    def _begin(self) -> None:
        with self._lock:
            if self._state != _PENDING or self._opts is None:
                return
            acts = [getattr(torch.profiler.ProfilerActivity, a) for a in self._opts.activities]
            prof = torch.profiler.profile(
                activities=acts,
                record_shapes=self._opts.record_shapes,
                with_stack=self._opts.with_stack,
            )
            prof.start()
            self._prof, self._state, self._steps = prof, _ACTIVE, 0
        _log.info("profiler started: %s", self._opts)

    def _end(self, auto: bool = False) -> Future | None:
        """Stop the profiler; its trace is written on a thread (the returned future). ``auto``:
        stopped after ``num_steps``, kept for the next ``/stop_profile`` to answer with."""
        with self._lock:
            prof, opts, out, self._prof = self._prof, self._opts, self._out, None
            self._state = _IDLE
            if prof is None or opts is None or out is None:
                self._close_out()
                return None
            self._out = None  # the export owns the handle now
            fut: Future = Future()
            self._exports.append(fut)
            if auto:
                self._auto_stopped = fut
        prof.stop()
        threading.Thread(
            target=self._export,
            args=(prof, opts, out, fut),
            name="flashrec-trace-export",
            daemon=True,
        ).start()
        return fut

    def _close_out(self) -> None:
        if self._out is not None:
            os.close(self._out.fd)
            self._out = None

    def _export(
        self, prof: torch.profiler.profile, opts: ProfileOptions, out: OutputDir, fut: Future
    ) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"{opts.profile_prefix}-{opts.profile_id}-{stamp}.trace.json.gz"
        final = opts.output_dir / name
        packed = f".{name}.partial"
        wrote = False
        try:
            with tempfile.TemporaryDirectory(prefix="flashrec-trace-") as tmp:
                raw = os.path.join(tmp, "trace.json")
                prof.export_chrome_trace(raw)
                if not _still_there(self.base_dir, opts.output_dir, out):
                    raise ProfileError(
                        f"'output_dir' {opts.output_dir} was replaced or moved after "
                        "/start_profile; the trace was not written"
                    )
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                fd = os.open(packed, flags, 0o644, dir_fd=out.fd)
                wrote = True
                with open(raw, "rb") as src, os.fdopen(fd, "wb") as dst:
                    with gzip.GzipFile(filename="", mode="wb", fileobj=dst) as gz:
                        shutil.copyfileobj(src, gz)
            os.replace(packed, name, src_dir_fd=out.fd, dst_dir_fd=out.fd)
            wrote = False
            self.last_files = [str(final)]
            _log.info("profiler trace written: %s", final)
            fut.set_result([str(final)])
        except Exception as exc:
            _log.exception("writing the profiler trace %s failed", final)
            fut.set_exception(exc)
        finally:
            if wrote:
                try:
                    os.unlink(packed, dir_fd=out.fd)
                except OSError:
                    pass
            os.close(out.fd)
            self._exports.remove(fut)
