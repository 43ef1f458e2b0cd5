"""Fixtures for the harness tests (helpers live in bench_helpers.py)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from bench_helpers import FAKE


@pytest.fixture
def marker() -> str:
    """A unique token to pass to fake servers (``--marker TOKEN``) to find them later."""
    return f"hbtest-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def fake_url(marker):
    """An externally started fake server (the harness does not own it); yields its URL."""
    from harness.servers.launch import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, FAKE, "--port", str(port), "--marker", marker],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a loaded machine can take long to start Python
    try:
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=10)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"the fake server exited with {proc.returncode} before answering")
                if time.monotonic() > deadline:
                    pytest.fail("the fake server never answered /health")
                time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait()
