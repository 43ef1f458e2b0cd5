"""Connections the server cannot take: the open-file limit (a connection cap answered 503, and
accepts that back off instead of spinning), a 408 that closes its connection as it is sent,
and a port in use found before the model loads."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from raw_http import parse, request_bytes
from server_helpers import ServerThread, fake_server, wait_for
from test_server_lifecycle import FAKE_ARGS, FAKE_MAIN, ROOT, Proc, start

FD_LIMIT = 160  # the server's RLIMIT_NOFILE in these tests
# set the limit, then become the fake server (same pid: its CPU time and log are the server's)
LIMITED = (
    "import os, resource, sys; "
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, {FD_LIMIT})); "
    "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
)
HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"  # kept alive


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def first_answer(s: socket.socket, timeout: float = 30.0) -> bytes:
    """What the server sends first on ``s`` (one read after the headers complete)."""
    s.settimeout(timeout)
    got = b""
    try:
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    return got


def limited_server(procs: list, *flags: str) -> Proc:
    return start(procs, [sys.executable, "-c", LIMITED, FAKE_MAIN, *FAKE_ARGS, *flags])


def log_bytes(p: Proc) -> int:
    return sum(len(line) for line in p.log)


def read_to_eof(s: socket.socket, timeout: float = 10.0) -> tuple[bytes, bool]:
    """Everything until the server closes ``s``; whether it closed within ``timeout``."""
    s.settimeout(timeout)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except OSError:
        return got, False
    return got, True


def test_connections_over_the_cap_get_503_and_the_server_stays_idle(procs) -> None:
    p = limited_server(procs)
    port = int(p.url.rsplit(":", 1)[1])
    conns, answers = [], []
    try:
        for _ in range(FD_LIMIT + 20):  # more than the process can hold
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            conns.append(s)
            s.sendall(HEALTH)
            answers.append(first_answer(s, timeout=10.0))
            if parse(answers[-1]).status == 0:
                break  # not answered at all: the server is out of descriptors
        statuses = [parse(a).status for a in answers]
        kept = statuses.count(200)
        assert statuses.count(503) > 0 and kept + statuses.count(503) == len(statuses), statuses
        assert kept < FD_LIMIT - 32  # the cap leaves descriptors free below the limit
        refused = [(s, a) for s, a, st in zip(conns, answers, statuses) if st == 503]
        for s, answer in refused:  # closed with the answer
            rest, closed = read_to_eof(s)
            assert closed and b"server_busy" in answer + rest
        t0, c0 = time.monotonic(), cpu_s(p.p.pid)
        time.sleep(3.0)  # every kept connection open and idle
        cpu = (cpu_s(p.p.pid) - c0) / (time.monotonic() - t0)
        assert cpu < 0.5, f"server busy at {cpu:.0%} CPU with idle connections"
        assert log_bytes(p) < 64_000
    finally:
        for s in conns:
            s.close()
    wait_for(lambda: requests.get(p.url + "/health", timeout=10).ok, 30, "served after close")


def test_out_of_file_descriptors_backs_off_quietly(procs) -> None:
    # a cap above the limit: accept itself fails with EMFILE, as with no cap at all
    p = limited_server(procs, "--max-connections", "100000")
    port = int(p.url.rsplit(":", 1)[1])
    conns = []
    try:
        for _ in range(FD_LIMIT + 40):  # the kernel queues those the server cannot accept
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        wait_for(lambda: any("accept failed" in line for line in p.log), 30, "EMFILE logged")
        t0, c0, b0 = time.monotonic(), cpu_s(p.p.pid), log_bytes(p)
        time.sleep(3.0)
        cpu = (cpu_s(p.p.pid) - c0) / (time.monotonic() - t0)
        assert cpu < 0.5, f"accept loop at {cpu:.0%} CPU out of file descriptors"
        assert log_bytes(p) - b0 < 4_000  # rate-limited: not a line per wake-up
        assert any("Too many open files" in line for line in p.log)
    finally:
        for s in conns:
            s.close()
    wait_for(lambda: requests.get(p.url + "/health", timeout=10).ok, 30, "served after close")


@pytest.fixture(scope="module")
def slow_body() -> ServerThread:
    with fake_server(body_timeout_s=1.0) as s:
        yield s


def test_408_for_a_slow_body_closes_with_the_answer(slow_body: ServerThread) -> None:
    body = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}).encode()
    head = request_bytes("/generate", b"", {"Content-Length": str(len(body))})
    with socket.create_connection(("127.0.0.1", slow_body.server.port), timeout=60) as s:
        s.sendall(head + body[:5])  # headers complete, the body never is
        got = first_answer(s)
        answered = time.monotonic()
        assert parse(got).status == 408
        rest, closed = read_to_eof(s, timeout=30.0)
        closed_after = time.monotonic() - answered
    assert closed and parse(got + rest).headers.get("connection", "").lower() == "close"
    assert closed_after < 5.0, f"closed {closed_after:.1f} s after the 408 (lingered)"


def test_port_in_use_is_found_before_the_model_loads(tiny_checkpoint: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "flashrec", "serve", "--model-path", str(tiny_checkpoint),
             "--sid-vocab-file", str(tiny_checkpoint / "catalog.json"), "--device", "cpu",
             "--host", "127.0.0.1", "--port", str(port), "--no-warmup"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "in use" in r.stderr
    assert "SIDs, depth" not in r.stderr, "the engine loaded before the port was checked"


def test_an_engine_process_front_end_is_ready_when_it_says_so(tiny_checkpoint: Path) -> None:
    """No module of ours is imported by the first requests of a front end that /health
    said was ready (a lazy import there cost every front end ~0.75 s at its first request)."""
    script = Path(__file__).with_name("frontend_imports_main.py")
    r = subprocess.run(
        [sys.executable, str(script), str(tiny_checkpoint)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["new_modules"] == [], out
