"""Helpers for the server tests: servers on 127.0.0.1 with ephemeral ports, always torn down.

``ServerThread`` runs the production ``Server`` (same runner, same handlers, the real
``EngineLoop`` or engine-process facade) on a background thread. ``fake_server`` serves ``server_fakes.FakeEngine``;
``real_server`` serves the real engine on the tiny synthetic checkpoint, ``process_server`` the
same with the engine in a process of its own.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from flashrec.config import ServerConfig
from flashrec.engine.loop import EngineLoop
from flashrec.server.app import Server
from flashrec.server.engine_api import ServedEngine

sys.path.insert(0, str(Path(__file__).parent))

from server_fakes import FakeEngine  # noqa: E402


class ServerThread:
    """A ``Server`` running on its own thread; use as a context manager."""

    def __init__(self, served: ServedEngine, config: ServerConfig, process: Any = None) -> None:
        self.served, self.config = served, config
        # the engine behind it: an in-process loop's ``Engine`` (or fake), else the facade
        self.engine = served.engine if isinstance(served, EngineLoop) else served
        self.server = Server(served, config, process=process)
        self.exit_code: int | None = None
        self.error: BaseException | None = None  # what ``run`` raised, if it raised
        self._thread = threading.Thread(target=self._main, name="test-server", daemon=True)

    def _main(self) -> None:
        try:
            self.exit_code = asyncio.run(self.server.run(install_signals=False))
        except Exception as exc:  # noqa: BLE001 - kept for the test to assert on
            self.error = exc

    @property
    def url(self) -> str:
        return self.server.url

    def start(self, timeout: float = 120.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.bound.is_set() and self.server.state.backend.healthy:
                return self
            if not self._thread.is_alive():
                raise RuntimeError(f"server exited during start-up ({self.exit_code})")
            time.sleep(0.01)
        self.stop()
        raise TimeoutError("server did not become healthy")

    def stop(self) -> int | None:
        self.server.request_stop()
        self._thread.join(timeout=60)
        if self._thread.is_alive():  # pragma: no cover - a hung shutdown is a test failure
            raise RuntimeError("server thread did not stop")
        return self.exit_code

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- client helpers -----------------------------------------------------------------------

    def get(self, path: str, **kw: Any) -> requests.Response:
        return requests.get(self.url + path, timeout=60, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> requests.Response:
        if body is not None:
            kw["json"] = body
        return requests.post(self.url + path, timeout=60, **kw)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.get("/metrics").text)

    def abandon(
        self,
        bodies: list[dict],
        until: Callable[[], bool],
        path: str = "/v1/chat/completions",
        timeout: float = 60.0,
    ) -> None:
        """POST each body from its own raw socket, wait until ``until`` holds (a timeout
        fails), then close every socket without reading: clients that vanish mid-request."""
        port = self.server.port
        socks = []
        try:
            for body in bodies:
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                s.sendall(raw_post(port, path, body))
                socks.append(s)
            wait_for(until, timeout, "the abandoned requests to arrive")
        finally:
            for s in socks:
                s.close()

    def wait_metric(self, name: str, value: float, timeout: float = 60.0) -> None:
        """Poll ``/metrics`` until ``name`` reads ``value``; a timeout fails."""
        wait_for(lambda: self.metrics()[name] == value, timeout, f"{name} == {value}")

    def wait_engine_idle(self, timeout: float = 60.0) -> dict[str, float]:
        """Poll ``/metrics`` until nothing runs or waits in the engine; the last sample."""
        deadline = time.monotonic() + timeout
        m = self.metrics()
        while time.monotonic() < deadline:
            if m["flashrec_running_requests"] == 0 and m["flashrec_queue_length"] == 0:
                break
            time.sleep(0.05)
            m = self.metrics()
        return m


def polled(cond: Callable[[], bool], timeout: float, every_s: float = 0.05) -> bool:
    """Poll ``cond`` until it holds or ``timeout`` passes; whether it held."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """``polled``, failing with ``what`` on a timeout."""
    if not polled(cond, timeout):
        raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def raw_post(port: int, path: str, body: dict) -> bytes:
    """A whole HTTP/1.1 POST of ``body`` as JSON, for a raw socket (clients that vanish)."""
    data = json.dumps(body)
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n{data}"
    ).encode()


def parse_metrics(text: str) -> dict[str, float]:
    """``{"name{labels}": value}`` for every sample line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def server_config(model_path: str = "", **overrides: Any) -> ServerConfig:
    """A test configuration: loopback, ephemeral port, CPU, no warm-up, small budgets."""
    values: dict[str, Any] = dict(
        model_path=model_path,
        host="127.0.0.1",
        port=0,
        device="cpu",
        warmup=False,
        batch_slots=256,
        beam_width=4,
        kv_pool_tokens=1 << 16,
        max_seq_len=4096,
        shutdown_timeout_s=10.0,
        gc_freeze=False,  # in-process servers: gc.collect() per start would slow the suite
    )
    values.update(overrides)
    return ServerConfig(**values)


def fake_server(step_delay_s: float = 0.0, **overrides: Any) -> ServerThread:
    config = server_config("/models/fake-model", **overrides)
    return ServerThread(EngineLoop(FakeEngine(config, step_delay_s=step_delay_s)), config)


def real_config(ckpt: Path, **overrides: Any) -> ServerConfig:
    return server_config(str(ckpt), sid_vocab_file=str(ckpt / "catalog.json"), **overrides)


def real_engine(ckpt: Path, **overrides: Any) -> tuple[Any, ServerConfig]:
    from flashrec.engine.engine import Engine

    config = real_config(ckpt, **overrides)
    return Engine(config), config


def real_server(ckpt: Path, **overrides: Any) -> ServerThread:
    engine, config = real_engine(ckpt, **overrides)
    return ServerThread(EngineLoop(engine), config)


def process_server(ckpt: Path, **overrides: Any) -> ServerThread:
    """``real_server`` with the engine in a spawned process of its own (``--engine-process``)."""
    from flashrec.server.engine_process import start_engine_process

    config = real_config(ckpt, engine_process="on", **overrides)
    remote = start_engine_process(config)
    return ServerThread(remote, config, process=remote.proc)
