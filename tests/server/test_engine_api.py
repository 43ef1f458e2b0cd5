"""Every engine the server serves has the whole ``ServedEngine`` interface, in one shape: the
in-process loop (over the fake engine), the engine-process facade and the unit tests' stub."""

from __future__ import annotations

import inspect
from concurrent.futures import Future
from typing import Any

import pytest
from server_fakes import FakeEngine, StubEngine
from server_helpers import server_config

from flashrec.engine.loop import EngineLoop
from flashrec.engine.request import GenRequest
from flashrec.server.engine_api import ServedEngine
from flashrec.server.engine_process import RemoteEngine
from flashrec.server.engine_process.messages import Ready

MEMBERS = sorted(name for name in vars(ServedEngine) if not name.startswith("_"))


class _Client:
    """An ``EngineClient`` that records what it would send."""

    def __init__(self, config: Any, layout: Any) -> None:
        self.config = config
        self.info = Ready({"engine": "remote"}, layout, 300, 8, 1 << 16, 1234)
        self.sent: list[GenRequest] = []

    def take_tokenizer(self) -> Any:
        return None

    def submit(self, req: GenRequest) -> Future:
        self.sent.append(req)
        return Future()


def _remote(monkeypatch) -> RemoteEngine:
    import flashrec.server.engine_process.facades as facades

    monkeypatch.setattr(facades, "load_tokenizer", lambda path: None)
    config = server_config("/models/fake")
    return RemoteEngine(_Client(config, FakeEngine(config).layout))  # type: ignore[arg-type]


def _engines(monkeypatch) -> dict[str, Any]:
    return {
        "EngineLoop": EngineLoop(FakeEngine(server_config("/models/fake"))),  # type: ignore[arg-type]
        "RemoteEngine": _remote(monkeypatch),
        "StubEngine": StubEngine(),
    }


def test_the_interface_names_what_the_server_uses():
    assert "submit" in MEMBERS and "prompt_builders" in MEMBERS and "profiler" in MEMBERS
    assert "loop" not in MEMBERS and "proc" not in MEMBERS  # no implementation's innards


@pytest.mark.parametrize("name", ["EngineLoop", "RemoteEngine", "StubEngine"])
def test_every_engine_has_every_member_in_one_shape(name: str, monkeypatch) -> None:
    engine = _engines(monkeypatch)[name]
    missing = [m for m in MEMBERS if not hasattr(engine, m)]
    assert missing == [], f"{name} lacks {missing}"
    methods = [m for m in MEMBERS if inspect.isfunction(getattr(ServedEngine, m))]
    assert len(methods) > 10
    for method in methods:
        want = list(inspect.signature(getattr(ServedEngine, method)).parameters)[1:]
        got = inspect.signature(getattr(engine, method)).parameters
        assert list(got)[: len(want)] == want, method  # the same names, in the same order
        extra = list(got.values())[len(want) :]  # and nothing more the server must pass
        assert all(p.default is not p.empty or p.kind == p.VAR_KEYWORD for p in extra), method


def test_remote_engine_checks_a_request_before_it_crosses_the_pipe(monkeypatch) -> None:
    remote = _remote(monkeypatch)
    with pytest.raises(ValueError, match="--batch-slots"):
        remote.submit(GenRequest("wide", [5, 6], 9, 4))
    assert remote.proc.sent == []  # type: ignore[attr-defined]
    remote.submit(GenRequest("ok", [5, 6], 8, 4))
    assert [r.rid for r in remote.proc.sent] == ["ok"]  # type: ignore[attr-defined]


def test_in_process_metrics_snapshot_reads_the_loop_and_its_profiler() -> None:
    loop = EngineLoop(FakeEngine(server_config("/models/fake")))  # type: ignore[arg-type]
    stats, profiler_state, engine_gc = loop.metrics_snapshot()
    assert stats["queue_len"] == 0 and profiler_state == "idle" and engine_gc is None
    assert loop.freeze_gc() == 0  # one process: the server's own freeze covers the engine
