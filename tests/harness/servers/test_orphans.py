"""``kill -9`` of a running ``flashrec-bench`` leaves no FlashRec process behind: each launched
server holds the read end of a watchdog pipe and stops itself once the harness's end closes;
its engine process follows the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
from bench_helpers import REPO, write_matrix

from harness.servers.launch import free_port
from harness.soak.procs import cmdline

MARKER_ENV = "FLASHREC_ORPHAN_TEST"
# what the tests prove is that nothing is left, not how fast: the slowest fallbacks (the
# server exits 3 s after its parent, its engine process 2 s after it) plus a loaded machine
GONE_WITHIN_S = 30.0


def processes_with_env(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``MARKER_ENV=marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env.split(b"\0") and state != "Z":
            out.append(int(entry.name))
    return out


def kill_marked(marker: str) -> None:
    """SIGKILL every process still carrying ``marker`` (a failed test's leftovers)."""
    for pid in processes_with_env(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_gone(marker: str, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = processes_with_env(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_with_env(marker)
    return left


@pytest.mark.parametrize("engine_process", ["off", "on"])
def test_kill_9_of_the_harness_mid_cell_leaves_no_flashrec_process(
    tmp_path: Path, tiny_model: Path, engine_process: str
) -> None:
    marker = uuid.uuid4().hex
    port = free_port()
    matrix = {
        "name": "orphans",
        "engine": {
            "name": "flashrec",
            "kind": "flashrec",
            "device": "cpu",
            "port": port,
            "startup_timeout_s": 300,
            "args": {"engine_process": engine_process, "warmup": False},
        },
        "model": {"path": str(tiny_model)},
        "workload": {
            "kind": "synthetic",
            "requests": 2000,
            "warmup_requests": 2,
            "median_tokens": 64,
            "seed": 0,
        },  # fmt: skip
        "axes": {"beam_width": [4]},
        "load": {"rounds": 1, "concurrency": 2, "max_tokens": 4, "request_timeout_s": 60},
    }
    path = write_matrix(tmp_path, matrix)
    env = {**os.environ, "PYTHONPATH": str(REPO), MARKER_ENV: marker}
    harness = subprocess.Popen(
        [sys.executable, "-m", "harness", str(path), "--out", str(tmp_path / "out")],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the harness's group: the server starts a session of its own
    )
    try:
        deadline = time.monotonic() + 300
        up = False
        while time.monotonic() < deadline and harness.poll() is None and not up:
            try:
                up = requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok
            except requests.RequestException:
                time.sleep(0.2)
        assert up, "the launched server never became healthy"
        time.sleep(2.0)  # the cell's rounds are under way
        launched = [p for p in processes_with_env(marker) if p != harness.pid]
        servers = [p for p in launched if "flashrec serve" in cmdline(p)]
        assert servers, [(p, cmdline(p)) for p in launched]
        if engine_process == "on":
            assert len(launched) >= len(servers) + 1, "no engine process beside the server"
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        left = _wait_gone(marker, GONE_WITHIN_S)
        assert left == [], [(p, cmdline(p)) for p in left]
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
        kill_marked(marker)  # a failed run: clean up what it left


def test_engine_process_dies_with_its_server(tmp_path: Path, tiny_model: Path) -> None:
    """``kill -9`` of a server with ``--engine-process on``: its engine process goes too."""
    marker = uuid.uuid4().hex
    port = free_port()
    argv = [sys.executable, "-m", "flashrec", "serve", "--model-path", str(tiny_model),
            "--sid-vocab-file", str(tiny_model / "catalog.json"), "--device", "cpu",
            "--host", "127.0.0.1", "--port", str(port), "--engine-process", "on",
            "--no-warmup"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), MARKER_ENV: marker}
    server = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        up = False
        while time.monotonic() < deadline and server.poll() is None and not up:
            try:
                up = requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok
            except requests.RequestException:
                time.sleep(0.2)
        assert up, "the server never became healthy"
        others = [p for p in processes_with_env(marker) if p != server.pid]
        assert others, "no engine process"
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        left = _wait_gone(marker, GONE_WITHIN_S)
        assert left == [], [(p, cmdline(p)) for p in left]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        kill_marked(marker)


GUARDED_SERVER = """
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

LAUNCHER = """
import asyncio, sys, time
import aiohttp
from harness.servers.launch import LaunchedServer
from harness.spec.matrix import EngineSpec
engine = EngineSpec(name="x", kind="command", port=int(sys.argv[1]), startup_timeout_s=60,
                    command=["{python}", sys.argv[2], "{port}"])
srv = LaunchedServer(engine, {}, None, __import__("pathlib").Path(sys.argv[3]))
async def main():
    srv.launch()
    async with aiohttp.ClientSession() as s:
        await srv.wait_healthy(s)
asyncio.run(main())
print("ready", flush=True)
time.sleep(600)
"""


def test_kill_9_of_the_launcher_stops_a_custom_command_server(tmp_path: Path) -> None:
    """A ``kind: command`` server (one that knows nothing of the pipe) runs under
    ``harness.servers.guard``, which stops it once the launcher is gone."""
    marker = uuid.uuid4().hex
    (tmp_path / "srv.py").write_text(GUARDED_SERVER)
    (tmp_path / "launch.py").write_text(LAUNCHER)
    env = {**os.environ, MARKER_ENV: marker, "PYTHONPATH": str(REPO)}
    launcher = subprocess.Popen(
        [sys.executable, str(tmp_path / "launch.py"), str(free_port()), str(tmp_path / "srv.py"),
         str(tmp_path / "srv.log")],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert launcher.stdout.readline().strip() == "ready"
        pids = processes_with_env(marker)
        cmdlines = [cmdline(p) for p in pids if p != launcher.pid]
        assert any("srv.py" in c and "harness.servers.guard" not in c for c in cmdlines), cmdlines
        assert any("harness.servers.guard" in c for c in cmdlines), cmdlines
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        left = _wait_gone(marker, GONE_WITHIN_S)
        assert not left, [(p, cmdline(p)) for p in left]
    finally:
        if launcher.poll() is None:
            launcher.kill()
        kill_marked(marker)
