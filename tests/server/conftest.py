"""Fixtures of the server tests (helpers live in ``server_helpers.py``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from server_helpers import (  # noqa: E402
    ServerThread,
    fake_server,
    real_engine,
    real_server,
)

from flashrec.profiler import PROFILER_DIR_ENV  # noqa: E402


@pytest.fixture
def procs() -> Iterator[list[Any]]:
    """Server processes (``test_server_lifecycle.Proc``) a test starts; each is closed after
    it, its whole process group killed."""
    started: list[Any] = []
    yield started
    for p in started:
        p.close()


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_model: Path) -> Path:
    """The tiny synthetic Qwen3 checkpoint with a catalog (``tests/conftest.py``)."""
    assert (tiny_model / "catalog.json").is_file()
    return tiny_model


@pytest.fixture(scope="session", autouse=True)
def profiler_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every server of the session writes traces under one temporary profiler directory."""
    path = tmp_path_factory.mktemp("profiles")
    old = os.environ.get(PROFILER_DIR_ENV)
    os.environ[PROFILER_DIR_ENV] = str(path)
    yield path
    if old is None:
        os.environ.pop(PROFILER_DIR_ENV, None)
    else:
        os.environ[PROFILER_DIR_ENV] = old


@pytest.fixture(scope="module")
def fake() -> Iterator[ServerThread]:
    """A shared fake-engine server (module scope)."""
    with fake_server() as srv:
        yield srv


@pytest.fixture(scope="session")
def real(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    """A shared real-engine server on the tiny checkpoint (session scope)."""
    with real_server(tiny_checkpoint) as srv:
        yield srv


@pytest.fixture(scope="session")
def offline(tiny_checkpoint: Path) -> Any:
    """A second real engine with the same configuration, run offline (``Engine.generate``)."""
    engine, _ = real_engine(tiny_checkpoint)
    return engine
