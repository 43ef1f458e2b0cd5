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
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    yield url
    proc.kill()
    proc.wait()
