"""Real server processes: URL line on port 0, SIGTERM drain, exit codes, the CLI entry points."""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import urllib3
from server_helpers import fake_server, polled

import flashrec.server.app as app_mod
from flashrec.parentwatch import ParentLink

ROOT = Path(__file__).resolve().parents[2]
FAKE_MAIN = str(Path(__file__).with_name("server_fake_main.py"))
URL_RE = re.compile(r"^FlashRec serving on (http://\S+:(\d+))$")


class Proc:
    """A server subprocess in its own process group; killed on exit whatever happens (and,
    through the watchdog pipe, when pytest itself is killed)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.link = ParentLink()
        # ROOT first; the inherited PYTHONPATH keeps tests/plants (tests/conftest.py) for env plants
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        full_env = {**os.environ, "PYTHONPATH": path, **(env or {}), **self.link.env}
        self.p = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            pass_fds=self.link.pass_fds,
        )
        self.link.launched()
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = ""

    def _pump(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.log.append(line)
            self.lines.put(line.rstrip("\n"))

    def wait_url(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.p.poll() is not None:
                    raise RuntimeError("server exited:\n" + "".join(self.log)) from None
                continue
            m = URL_RE.match(line)
            if m:
                self.url = m.group(1)
                return self.url
        raise TimeoutError("no URL line:\n" + "".join(self.log))

    def wait_healthy(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/health", timeout=10).status_code == 200:
                    return
            except requests.RequestException:  # not listening yet, or slow to answer
                pass
            if self.p.poll() is not None:
                raise RuntimeError("server exited:\n" + "".join(self.log))
            time.sleep(0.05)
        raise TimeoutError("never healthy:\n" + "".join(self.log))

    def close(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait(timeout=30)
        self.link.close()


def start(procs: list[Proc], argv: list[str], env: dict[str, str] | None = None) -> Proc:
    p = Proc(argv, env)
    procs.append(p)
    p.wait_url()
    p.wait_healthy()
    return p


def wait_inflight(url: str, n: int, timeout: float = 60.0) -> bool:
    """Poll ``/metrics`` until ``n`` generation requests are in flight; whether they were."""
    pattern = re.compile(rf"^flashrec_http_inflight_requests {n}$", re.M)
    return polled(lambda: bool(pattern.search(requests.get(url + "/metrics", timeout=30).text)),
                  timeout, every_s=0.02)  # fmt: skip


def wait_health(url: str, status: str, timeout: float = 60.0) -> bool:
    """Poll ``/health`` until its body says ``status``; whether it did."""
    return polled(
        lambda: requests.get(url + "/health", timeout=30).json().get("status") == status,
        timeout,
        every_s=0.02,
    )


FAKE_ARGS = ["--model-path", "/models/fake", "--host", "127.0.0.1", "--port", "0"]
FAKE_ARGS += ["--device", "cpu", "--batch-slots", "64", "--no-warmup"]


def cli_argv(ckpt: Path, *extra: str, entry: str = "serve") -> list[str]:
    """``python -m flashrec serve`` on the tiny checkpoint, loopback, ephemeral port, CPU."""
    return [
        sys.executable,
        "-m",
        "flashrec",
        entry,
        "--model-path",
        str(ckpt),
        "--sid-vocab-file",
        str(ckpt / "catalog.json"),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--device",
        "cpu",
        "--batch-slots",
        "64",
        "--beam-width",
        "4",
        "--kv-pool-tokens",
        "16384",
        *extra,
    ]


def test_sigterm_drains_in_flight_and_exits_0(
    procs: list[Proc], tiny_checkpoint: Path, tmp_path: Path
) -> None:
    # A planted gate holds the engine after every step (it waits for the file): four requests
    # stay in flight through SIGTERM and the probes of the drain, on any machine
    gate = tmp_path / "open"
    gate.touch()  # open while the server starts
    argv = cli_argv(tiny_checkpoint, "--shutdown-timeout-s", "60")
    p = start(procs, argv, env={"FLASHREC_TEST_STEP_GATE": str(gate)})
    gate.unlink()
    assert int(p.url.rsplit(":", 1)[1]) > 0
    body = {"messages": [{"role": "user", "content": "drain me"}], "n": 8}
    results: list[int] = []

    def call() -> None:
        results.append(
            requests.post(p.url + "/v1/chat/completions", json=body, timeout=60).status_code
        )

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        assert wait_inflight(p.url, 4)
        p.p.send_signal(signal.SIGTERM)
        assert wait_health(p.url, "draining")
        late = requests.post(p.url + "/v1/chat/completions", json=body, timeout=30)
        assert late.status_code == 503 and "Retry-After" in late.headers
    finally:
        gate.touch()
    for t in threads:
        t.join(timeout=60)
    assert results == [200, 200, 200, 200]
    assert p.p.wait(timeout=30) == 0
    assert any("shutting down" in line for line in p.log)


def test_sigterm_timeout_still_exits_0(procs: list[Proc]) -> None:
    p = start(
        procs,
        [
            sys.executable,
            FAKE_MAIN,
            *FAKE_ARGS,
            "--step-delay-s",
            "1.0",
            "--shutdown-timeout-s",
            "0.5",
        ],
    )
    body = {"messages": [{"role": "user", "content": "too slow"}], "n": 2}
    statuses: list[int] = []
    t = threading.Thread(
        target=lambda: statuses.append(
            requests.post(p.url + "/v1/chat/completions", json=body, timeout=60).status_code
        ),
        daemon=True,
    )
    t.start()
    assert wait_inflight(p.url, 1)
    p.p.send_signal(signal.SIGINT)
    assert p.p.wait(timeout=30) == 0
    t.join(timeout=10)
    # cancelled at the 0.5 s deadline and told to retry elsewhere (a drain that waited would
    # answer 200 after the request's four one-second steps)
    assert statuses == [503]
    assert any("did not finish" in line for line in p.log)


def test_sigterm_past_the_deadline_answers_every_request(procs: list[Proc]) -> None:
    """Requests held at the deadline and requests sent during the drain all get 503 with
    Retry-After (on kept-alive and on new connections), until the listener closes and a
    connection is refused; none is dropped without an answer or reset once it was sent. (A
    connect that races the listener's close is reset by the kernel before any request is
    sent: for a client that is a refusal, and it counts as one.)"""
    p = start(
        procs,
        [
            sys.executable,
            FAKE_MAIN,
            *FAKE_ARGS,
            "--step-delay-s",
            "2",
            "--shutdown-timeout-s",
            "3",
        ],
    )
    body = {"messages": [{"role": "user", "content": "held"}], "n": 2}  # 4 steps: 8 s
    outcomes: list[str] = []
    lock = threading.Lock()
    signalled: list[float] = []

    def call(session: requests.Session | None) -> None:
        try:
            r = (session or requests).post(p.url + "/v1/chat/completions", json=body, timeout=30)
            out = f"{r.status_code} {r.headers.get('Retry-After')}"
        except requests.ConnectionError as exc:
            reason = getattr(exc.args[0] if exc.args else None, "reason", None)
            unsent = isinstance(reason, urllib3.exceptions.NewConnectionError)  # connect failed
            out = "refused" if unsent or "refused" in str(exc).lower() else f"dropped: {exc}"
            if out != "refused":  # enough to tell the races apart if it ever happens
                kind = "kept-alive session" if session is not None else "new connection"
                when = (
                    f"{time.monotonic() - signalled[0]:.3f} s after SIGTERM"
                    if signalled
                    else "before SIGTERM"
                )
                out += f" ({kind}, {when})"
        with lock:
            outcomes.append(out)

    held = [threading.Thread(target=call, args=(None,)) for _ in range(6)]
    for t in held:
        t.start()
    assert wait_inflight(p.url, 6)
    sessions = [requests.Session() for _ in range(12)]
    for s in sessions:  # a kept-alive connection each
        assert s.get(p.url + "/health", timeout=5).status_code == 200
    go = threading.Event()

    def late(session: requests.Session | None) -> None:
        # from the signal until the process is gone, then once more (refused by then)
        go.wait()
        while True:
            gone = p.p.poll() is not None
            call(session)
            if gone:
                return
            time.sleep(0.01)

    # the clients are ready before the signal: each first call lands in the 3 s drain
    clients = [threading.Thread(target=late, args=(s,)) for s in [*sessions, *[None] * 12]]
    for t in clients:
        t.start()
    p.p.send_signal(signal.SIGTERM)
    signalled.append(time.monotonic())
    go.set()
    for t in [*held, *clients]:
        t.join(timeout=60)
    assert p.p.wait(timeout=30) == 0
    assert outcomes.count("503 1") >= 6 + 24, outcomes  # the held ones, each client's first
    assert "refused" in outcomes  # the clients ran on past the listener's close
    assert set(outcomes) == {"503 1", "refused"}, [o for o in outcomes if "dropped" in o]


def test_port_in_use_exits_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        srv = fake_server(port=taken.getsockname()[1])
        with pytest.raises(RuntimeError, match=r"start-up \(1\)"):
            srv.start()
        assert srv.exit_code == 1


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_failure_after_bind_frees_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: app_mod.Server) -> None:
        raise RuntimeError("front ends could not start")

    monkeypatch.setattr(app_mod.Server, "_join_frontends", boom)
    srv = fake_server()
    with pytest.raises(RuntimeError, match="during start-up"):
        srv.start()
    assert "front ends could not start" in str(srv.error)
    port = srv.server.port
    assert port and _port_free(port)  # the listener is closed, not left to process exit
    assert srv.server.state.backend.draining


def test_failure_during_shutdown_still_frees_the_port() -> None:
    srv = fake_server().start()
    port = srv.server.port

    def broken() -> None:
        raise RuntimeError("profiler could not stop")

    srv.server.state.profiler.shutdown = broken
    srv.stop()
    assert "profiler could not stop" in str(srv.error)  # the error reached the caller
    assert _port_free(port)
    assert not srv.served._thread.is_alive()  # the engine loop was stopped all the same


def test_non_loopback_logs_no_auth_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert app_mod.is_loopback("127.0.0.1") and app_mod.is_loopback("::1")
    assert app_mod.is_loopback("localhost")
    assert not app_mod.is_loopback("0.0.0.0") and not app_mod.is_loopback("10.1.2.3")
    monkeypatch.setattr(app_mod, "is_loopback", lambda host: False)
    with caplog.at_level(logging.WARNING, logger="flashrec.server"), fake_server():
        pass
    assert any("no authentication" in r.getMessage() for r in caplog.records)


def test_cli_serve_alias(procs: list[Proc], tiny_checkpoint: Path) -> None:
    p = start(procs, cli_argv(tiny_checkpoint, entry="--serve"))
    r = requests.post(
        p.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "n": 2},
        timeout=60,
    )
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    p.p.send_signal(signal.SIGTERM)
    assert p.p.wait(timeout=60) == 0
    assert any("warm-up done" in line for line in p.log)


def test_event_loop_uvloop_serves_and_says_so(procs: list[Proc], tiny_checkpoint: Path) -> None:
    pytest.importorskip("uvloop")
    p = start(procs, cli_argv(tiny_checkpoint, "--event-loop", "uvloop"))
    assert requests.get(p.url + "/get_server_info", timeout=30).json()["event_loop"] == "uvloop"
    r = requests.post(
        p.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "n": 2},
        timeout=60,
    )
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    p.p.send_signal(signal.SIGTERM)  # the drain and exit code work on that loop too
    assert p.p.wait(timeout=60) == 0
    assert any("event loop: uvloop" in line for line in p.log)


def test_event_loop_choice_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from flashrec.config import ServerConfig

    assert ServerConfig(model_path="m").resolved_event_loop == "asyncio"  # the default
    with pytest.raises(ValueError, match="auto, uvloop or asyncio"):
        ServerConfig(model_path="m", event_loop="trio")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "uvloop" else real(n, *a)
    )
    with pytest.raises(ValueError, match="uvloop is not installed"):
        ServerConfig(model_path="m", event_loop="uvloop")
    assert ServerConfig(model_path="m", event_loop="auto").resolved_event_loop == "asyncio"


def test_module_entry_point_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flashrec.server", "--help"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0
    for flag in ("--host", "--port", "--max-body-bytes", "--shutdown-timeout-s", "--beam-width"):
        assert flag in out.stdout
