"""Server lifecycle: launch in its own process group, wait for /health, stop the whole group.

No server outlives the run: every launched group is registered until it is stopped, and an
``atexit`` hook (also reached on Ctrl-C and SIGTERM, see :func:`install_signal_handlers`) kills
what is left. Stopping sends SIGTERM to the group, waits, then SIGKILLs the group. Where the
harness cannot clean up (``kill -9``), a watchdog pipe does: each server gets the read end
(``$FLASHREC_PARENT_WATCH_FD``, ``flashrec.parentwatch``) and a FlashRec or reference
server stops itself once the harness's end closes.

External servers (``kind: external``) have no lifecycle: the harness only talks to their URL.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import signal
import socket
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import aiohttp

from harness.spec.matrix import EngineSpec, Scalar
from harness.spec.model import ResolvedModel
from harness.spec.serve_args import flags

_LIVE: set[int] = set()
# a ``kind: command`` server's own environment, JSON, read by harness.servers.guard for CMD
GUARD_ENV = "FLASHREC_GUARD_CHILD_ENV"


class ServerError(RuntimeError):
    """A server failed to start, died or hung; carries the tail of its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail

    def log_end(self, lines: int = 5) -> str:
        """The last ``lines`` non-blank lines of the server's log, indented under a heading,
        for a one-glance cause where the error is printed; "" with no log."""
        last = [ln.rstrip()[:300] for ln in self.log_tail.splitlines() if ln.strip()][-lines:]
        if not last:
            return ""
        return "; its log ends:" + "".join(f"\n    {ln}" for ln in last)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid`` (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group, ignoring one that is already gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_all_live() -> None:
    for pgid in list(_LIVE):
        kill_group(pgid, signal.SIGKILL)
        _LIVE.discard(pgid)


atexit.register(_kill_all_live)


def install_signal_handlers() -> None:
    """Turn SIGTERM / SIGHUP into SystemExit and SIGINT into KeyboardInterrupt, raised where
    the main thread is, so that ``finally`` blocks and atexit run. SIGINT gets a handler of its
    own because ``asyncio.run`` otherwise answers it by cancelling the main task once, and a
    cancellation lost inside the run (e.g. by ``wait_for`` racing a finished request) would let
    the run go on."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    signal.signal(signal.SIGINT, interrupt)


def _python(item: str) -> str:
    return sys.executable if item in ("python", "python3") else item


class Server:
    """A server the harness talks to; launched or external."""

    def __init__(self, engine: EngineSpec, base_url: str) -> None:
        self.engine = engine
        self.base_url = base_url.rstrip("/")
        self.info: dict = {}

    @property
    def protocol(self) -> str:
        return self.engine.protocol

    def exit_code(self) -> int | None:
        """The exit code once a launched server has exited (None while it runs)."""
        return None

    def process_group(self) -> int | None:
        """The process group of a launched, running server (None: external, or not running)."""
        return None

    def process_groups(self) -> list[int]:
        """Every running process group the server is made of (one for a launched server; the
        router's and each replica's for replicas behind a router; none for an external one)."""
        pgid = self.process_group()
        return [] if pgid is None else [pgid]

    def log_tail(self, lines: int = 40) -> str:
        return ""

    def metrics_urls(self) -> list[str]:
        """Where the server's ``/metrics`` are read: its own URL (replicas behind a router:
        each replica's, :mod:`harness.servers.replicas`)."""
        return [self.base_url]

    async def start(self, session: aiohttp.ClientSession) -> None:
        """Make the server ready (launched: start and wait for /health)."""
        self.info = await fetch_info(session, self.base_url)

    def stop(self) -> None:
        """Stop a launched server's process group (external: nothing)."""


class ExternalServer(Server):
    """A server reached by URL; the harness never starts or stops it."""

    def __init__(self, engine: EngineSpec) -> None:
        super().__init__(engine, str(engine.url))


class LaunchedServer(Server):
    """A server process group started by the harness, with its log in ``log_path``."""

    def __init__(
        self,
        engine: EngineSpec,
        server_args: dict[str, Scalar],
        model: ResolvedModel | None,
        log_path: Path,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.port = engine.port or free_port(engine.host)
        self.extra_env = extra_env or {}
        super().__init__(engine, f"http://{engine.host}:{self.port}")
        self.server_args = server_args
        self.model = model
        self.log_path = log_path
        self.proc: Any = None
        self.started_at = 0.0
        self.startup_s: float | None = None  # launch -> first 200 on /health
        self._link: Any = None  # the watchdog pipe's launcher end while the server runs

    def command(self) -> list[str]:
        """The argv that launches this server."""
        e, m = self.engine, self.model
        values = {
            "port": str(self.port),
            "host": e.host,
            "model_path": (m.path if m else "") or "",
            "catalog": (m.catalog if m else "") or "",
            "python": sys.executable,
        }
        if e.kind == "flashrec":
            argv = [sys.executable, "-m", "flashrec", "serve"]
        else:  # a command that does not watch the pipe: the guard stops it for the launcher
            argv = [sys.executable, "-m", "harness.servers.guard", "--"]
            argv += [_python(a).format(**values) for a in e.command or []]
        if e.kind == "flashrec" or e.standard_args:
            if m and m.path:
                argv += ["--model-path", m.path]
            if m and m.catalogs and e.kind == "flashrec":  # named catalogs, the default first
                for name, path, *_ in m.catalogs:
                    argv += ["--sid-vocab-file", f"{name}={path}"]
            elif m and m.catalog:  # a peer takes the default catalog's file alone
                argv += ["--sid-vocab-file", m.catalog]
            argv += ["--host", e.host, "--port", str(self.port)]
            if e.device:
                argv += ["--device", e.device]
        return argv + flags(self.server_args)

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def process_group(self) -> int | None:
        # launched with start_new_session: the server's pid is its group's id
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError:
            return ""

    def launch(self) -> None:
        """Start the process group (does not wait for readiness)."""
        import subprocess

        from flashrec.parentwatch import ParentLink

        argv = self.command()
        link = ParentLink()
        own = {**self.extra_env, **self.engine.env, "PYTHONUNBUFFERED": "1"}
        if self.engine.pythonpath:
            rest = own.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
            own["PYTHONPATH"] = os.pathsep.join(
                [*self.engine.pythonpath, *([rest] if rest else [])]
            )
        if self.engine.kind == "command":
            # the guard imports the harness's own modules: the server's environment (its own
            # PYTHONPATH, which may hold another package named flashrec) is for CMD alone
            env = {**os.environ, "PYTHONUNBUFFERED": "1", GUARD_ENV: json.dumps(own)}
        else:
            env = {**os.environ, **own}
        env.update(link.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"# harness: {' '.join(argv)}\n".encode())
        log.flush()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.engine.cwd or None,
                start_new_session=True,
                pass_fds=link.pass_fds,
            )
        except OSError as exc:
            link.close()
            raise ServerError(f"cannot launch {argv[0]}: {exc}") from None
        finally:
            log.close()
        link.launched()
        self._link = link
        _LIVE.add(self.proc.pid)
        self.started_at = time.monotonic()

    async def start(self, session: aiohttp.ClientSession) -> None:
        self.launch()
        try:
            await self.wait_healthy(session)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - self.started_at
        self.info = await fetch_info(session, self.base_url)

    async def wait_healthy(self, session: aiohttp.ClientSession) -> None:
        """Poll ``/health`` until 200; raise :class:`ServerError` on exit or timeout."""
        deadline = self.started_at + self.engine.startup_timeout_s
        while True:
            code = self.exit_code()
            if code is not None:
                raise ServerError(f"server exited with code {code} during start", self.log_tail())
            try:
                timeout = aiohttp.ClientTimeout(total=2.0)
                url = f"{self.base_url}{self.engine.health_path}"
                async with session.get(url, timeout=timeout) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServerError(
                    f"server not healthy after {self.engine.startup_timeout_s:g} s",
                    self.log_tail(),
                )
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM the group, wait up to ``stop_timeout_s``, then SIGKILL the group."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        kill_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.engine.stop_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and not group_members(pgid):
                break
            time.sleep(0.05)
        kill_group(pgid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - SIGKILLed: it will go
            pass
        for _ in range(100):
            if not group_members(pgid):
                break
            time.sleep(0.05)
        _LIVE.discard(pgid)
        if self._link is not None:
            self._link.close()
            self._link = None


async def fetch_info(session: aiohttp.ClientSession, base_url: str) -> dict:
    """``GET /get_server_info`` as a dict ({} when the server does not have it)."""
    try:
        timeout = aiohttp.ClientTimeout(total=10)
        async with session.get(f"{base_url}/get_server_info", timeout=timeout) as r:
            if r.status == 200:
                data = await r.json(content_type=None)
                return data if isinstance(data, dict) else {"info": data}
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        pass
    return {}


async def healthy(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float = 5.0, path: str = "/health"
) -> bool:
    """Whether the health URL (``path``, default ``/health``) answers 200 within ``timeout_s``."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(f"{base_url}{path}", timeout=timeout) as r:
            return r.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


def make_server(
    engine: EngineSpec,
    server_args: dict[str, Scalar],
    model: ResolvedModel | None,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
) -> Server:
    """A launched or an external server for an engine (``extra_env``: launched only)."""
    if engine.launched:
        return LaunchedServer(engine, server_args, model, log_path, extra_env)
    return ExternalServer(engine)
