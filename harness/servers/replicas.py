"""N replicas of an engine behind one router, started and stopped as one server.

An engine with ``router:`` (``replicas: N``, :mod:`harness.spec.router`) is served by N
launched servers of that engine, each on a free port and, where the host has at least N GPUs,
on a GPU of its own (``CUDA_VISIBLE_DEVICES``; fewer GPUs are shared round-robin), and by
``python -m sglang_router.launch_router --worker-urls URL.. --policy P`` in front of them::

    harness --/readiness, requests--> router (guarded command)  --> replica 0 (own group)
                                                               \\-> replica 1 (own group) ..

Every process is a :class:`LaunchedServer`: its own process group, registered for the atexit
kill, and the watchdog pipe (a FlashRec replica watches it itself; the router, which knows
nothing of it, runs under :mod:`harness.servers.guard`). The router starts once every replica
answers ``/health`` and counts as ready once ``/readiness`` reports all N healthy. Stopping
stops the router first, then the replicas. The harness measures at the router's URL and reads
each replica's ``/metrics`` (:meth:`RoutedServer.metrics_urls`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import aiohttp

from harness.servers.launch import (
    LaunchedServer,
    Server,
    ServerError,
    fetch_info,
    free_port,
)
from harness.servers.launch import (
    make_server as make_single,
)
from harness.spec.matrix import EngineSpec, Scalar
from harness.spec.model import ResolvedModel
from harness.spec.router import router_flags


def gpu_ids() -> list[str]:
    """The GPUs replicas may use: ``$CUDA_VISIBLE_DEVICES`` when set, else those
    ``nvidia-smi -L`` lists (none on a host without it)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, ln in enumerate(out.stdout.splitlines()) if ln.startswith("GPU ")]


def replica_devices(replicas: int, gpus: list[str]) -> list[str | None]:
    """Each replica's ``CUDA_VISIBLE_DEVICES``: GPU i where there are >= N, else shared
    round-robin; None (left as it is) without GPUs."""
    return [gpus[i % len(gpus)] if gpus else None for i in range(replicas)]


class RoutedServer(Server):
    """N launched replicas of ``engine`` behind a launched router; one server to the run."""

    def __init__(
        self,
        engine: EngineSpec,
        server_args: dict[str, Scalar],
        model: ResolvedModel | None,
        log_path: Path,
        extra_env: dict[str, str] | None = None,
        gpus: list[str] | None = None,
    ) -> None:
        assert engine.router is not None
        self.router_spec = engine.router
        self.devices = replica_devices(engine.replicas, gpu_ids() if gpus is None else gpus)
        self.replicas: list[LaunchedServer] = []
        for i, dev in enumerate(self.devices):
            env = dict(engine.env) | ({"CUDA_VISIBLE_DEVICES": dev} if dev is not None else {})
            one = engine.model_copy(update={"router": None, "replicas": 1, "env": env})
            log = log_path.with_name(f"{log_path.stem}-replica{i}{log_path.suffix}")
            self.replicas.append(LaunchedServer(one, server_args, model, log, extra_env))
        urls = [r.base_url for r in self.replicas]
        argv = [*self.router_spec.command, "--worker-urls", *urls]
        argv += ["--policy", self.router_spec.policy, "--host", engine.host, "--port", "{port}"]
        argv += ["--prometheus-host", engine.host, "--prometheus-port", str(free_port())]
        router_engine = EngineSpec(
            name=f"{engine.name}-router",
            kind="command",
            command=argv + router_flags(self.router_spec.args),
            protocol=engine.protocol,
            standard_args=False,
            health_path="/readiness",
            host=engine.host,
            startup_timeout_s=self.router_spec.startup_timeout_s,
            stop_timeout_s=engine.stop_timeout_s,
        )
        self.router = LaunchedServer(router_engine, {}, None, log_path.with_name(
            f"{log_path.stem}-router{log_path.suffix}"))  # fmt: skip
        super().__init__(engine, self.router.base_url)
        self.log_path = self.router.log_path
        self.startup_s: float | None = None

    def _all(self) -> list[LaunchedServer]:
        return [self.router, *self.replicas]

    def commands(self) -> list[list[str]]:
        """Each replica's argv, then the router's."""
        return [r.command() for r in self.replicas] + [self.router.command()]

    def metrics_urls(self) -> list[str]:
        return [r.base_url for r in self.replicas]

    def process_groups(self) -> list[int]:
        return [g for g in (s.process_group() for s in self._all()) if g is not None]

    def exit_code(self) -> int | None:
        """The first exit code of the router or a replica (None while all run)."""
        return next((c for c in (s.exit_code() for s in self._all()) if c is not None), None)

    def log_tail(self, lines: int = 40) -> str:
        parts = []
        for s in self._all():
            tail = s.log_tail(lines // 2)
            if tail:
                parts.append(f"== {s.log_path.name}\n{tail}")
        return "\n".join(parts)

    async def start(self, session: aiohttp.ClientSession) -> None:
        started = time.monotonic()
        try:
            for r in self.replicas:  # launched together: their start-ups overlap
                r.launch()
            await asyncio.gather(*(self._ready(session, r) for r in self.replicas))
            self.router.launch()
            await self.router.wait_healthy(session)
            await self._all_healthy(session)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        self.info = await fetch_info(session, self.replicas[0].base_url)
        self.info["router"] = await fetch_info(session, self.base_url)

    async def _ready(self, session: aiohttp.ClientSession, r: LaunchedServer) -> None:
        await r.wait_healthy(session)
        r.startup_s = time.monotonic() - r.started_at

    async def _all_healthy(self, session: aiohttp.ClientSession) -> None:
        """Wait until the router's ``/readiness`` counts every replica healthy."""
        want, deadline = len(self.replicas), time.monotonic() + self.router_spec.startup_timeout_s
        seen: object = None
        while time.monotonic() < deadline:
            try:
                timeout = aiohttp.ClientTimeout(total=2.0)
                async with session.get(f"{self.base_url}/readiness", timeout=timeout) as resp:
                    seen = await resp.json(content_type=None)
                if isinstance(seen, dict) and int(seen.get("healthy_workers", want)) >= want:
                    return
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
                pass
            if self.router.exit_code() is not None:
                break
            await asyncio.sleep(0.2)
        raise ServerError(f"router not ready with {want} healthy replicas (last: {seen})",
                          self.log_tail())  # fmt: skip

    def stop(self) -> None:
        """The router first (no request reaches a stopping replica), then every replica."""
        for s in self._all():
            s.stop()

    def meta(self) -> dict:
        """What the report keeps of the router and the replicas' launches."""
        return {
            "router": {
                "policy": self.router_spec.policy,
                "args": dict(self.router_spec.args),
                "command": self.router.command(),
                "log": str(self.router.log_path),
            },
            "replica_servers": [
                {
                    "url": r.base_url,
                    "log": str(r.log_path),
                    "command": r.command(),
                    "cuda_visible_devices": dev,
                    **({"startup_s": round(r.startup_s, 2)} if r.startup_s is not None else {}),
                }
                for r, dev in zip(self.replicas, self.devices)
            ],
        }


def make_server(
    engine: EngineSpec,
    server_args: dict[str, Scalar],
    model: ResolvedModel | None,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
) -> Server:
    """A routed server for an engine with ``router:``, else
    :func:`harness.servers.launch.make_server`'s launched or external one."""
    if engine.router is not None:
        return RoutedServer(engine, server_args, model, log_path, extra_env)
    return make_single(engine, server_args, model, log_path, extra_env)
