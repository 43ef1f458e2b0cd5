"""harness.servers.launch: process groups, health wait, stop escalation, nothing left behind."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from bench_helpers import FAKE, processes_with

from harness.servers.launch import LaunchedServer, ServerError, group_members
from harness.spec.matrix import EngineSpec
from harness.spec.serve_args import flags


def engine(*args: str, **kw) -> EngineSpec:
    return EngineSpec(
        name="f",
        kind="command",
        command=["python", FAKE, *args],
        startup_timeout_s=kw.pop("startup_timeout_s", 20),
        stop_timeout_s=kw.pop("stop_timeout_s", 5),
        **kw,
    )


async def start(server: LaunchedServer) -> None:
    async with aiohttp.ClientSession() as session:
        await server.start(session)


def test_flags():
    assert flags(
        {
            "beam_width": 4,
            "disable_cuda_graph": True,
            "enable_prefix_cache": False,
            "sid": None,
            "quantization": "fp8",
        }
    ) == [
        "--beam-width",
        "4",
        "--disable-cuda-graph",
        "--no-enable-prefix-cache",
        "--quantization",
        "fp8",
    ]


def test_command_for_flashrec_and_custom():
    from harness.spec.model import ResolvedModel

    model = ResolvedModel("/m", "/m/catalog.json", "h", "path", 3)
    fr = LaunchedServer(
        EngineSpec(kind="flashrec", device="cpu", port=9000),
        {"beam_width": 4},
        model,
        Path("x.log"),
    )
    cmd = fr.command()
    assert cmd[1:4] == ["-m", "flashrec", "serve"]
    assert cmd[4:] == [
        "--model-path",
        "/m",
        "--sid-vocab-file",
        "/m/catalog.json",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--device",
        "cpu",
        "--beam-width",
        "4",
    ]
    custom = LaunchedServer(
        EngineSpec(kind="command", command=["srv", "--p={port}"], standard_args=False, port=9001),
        {},
        model,
        Path("x.log"),
    )
    # a custom command runs under the guard, which stops it if the harness dies
    guard = [sys.executable, "-m", "harness.servers.guard", "--"]
    assert custom.command() == [*guard, "srv", "--p=9001"]


def test_start_stop_leaves_no_process(tmp_path, marker):
    s = LaunchedServer(
        engine("--spawn-child", "--marker", marker), {"beam_width": 4}, None, tmp_path / "s.log"
    )
    asyncio.run(start(s))
    pgid = s.proc.pid
    assert len(group_members(pgid)) == 3  # the guard, the server and its child
    assert s.info["extra_args"] == ["--marker", marker, "--beam-width", "4"]
    s.stop()
    assert group_members(pgid) == [] and processes_with(marker) == []
    assert "listening" in s.log_tail()


def test_stop_escalates_to_sigkill(tmp_path, marker):
    s = LaunchedServer(
        engine("--ignore-sigterm", "--marker", marker, stop_timeout_s=0.5),
        {},
        None,
        tmp_path / "s.log",
    )
    asyncio.run(start(s))
    t0 = time.monotonic()
    s.stop()
    assert time.monotonic() - t0 < 5
    assert processes_with(marker) == []


def test_failed_start_reports_log_tail(tmp_path, marker):
    s = LaunchedServer(engine("--fail-start", "--marker", marker), {}, None, tmp_path / "s.log")
    with pytest.raises(ServerError) as info:
        asyncio.run(start(s))
    assert "exited with code 2" in str(info.value)
    assert "impossible flag" in info.value.log_tail
    assert processes_with(marker) == []


def test_startup_timeout_kills_the_group(tmp_path, marker):
    s = LaunchedServer(
        engine("--startup-s", "30", "--spawn-child", "--marker", marker, startup_timeout_s=1.0),
        {},
        None,
        tmp_path / "s.log",
    )
    with pytest.raises(ServerError, match="not healthy after 1 s"):
        asyncio.run(start(s))
    assert processes_with(marker) == []
