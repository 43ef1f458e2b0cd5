"""trace_range, profile option validation and the /start_profile /stop_profile endpoints."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
import torch
from server_helpers import ServerThread, fake_server

from flashrec.profiler import ProfileError, parse_options, trace_range

CHAT = {"messages": [{"role": "user", "content": "profile me"}], "n": 2}


def trace_names(path: str | Path) -> set[str]:
    with gzip.open(path, "rt") as fh:
        return {e.get("name", "") for e in json.load(fh)["traceEvents"]}


def wait_files(directory: Path, pattern: str, timeout: float = 30.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(directory.glob(pattern))
        if found:
            return found
        time.sleep(0.05)
    raise TimeoutError(f"no {pattern} in {directory}")


def test_trace_range_without_and_with_profiler() -> None:
    with trace_range("flashrec.idle"):
        torch.ones(2).sum()
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.start()
    with trace_range("flashrec.test_span"):
        torch.ones(4).sum()
    prof.stop()
    assert "flashrec.test_span" in {e.name for e in prof.events()}


@pytest.mark.parametrize(
    "body",
    [
        {"output_dir": "../escape"},
        {"output_dir": "/etc"},
        {"output_dir": "a/../../b"},
        {"num_steps": 0},
        {"num_steps": "3"},
        {"start_step": -1},
        {"activities": ["CPU", "TPU"]},
        {"activities": "CPU"},
        {"profile_prefix": "a/b"},
        {"profile_prefix": "../x"},
        {"profile_id": "x y"},
        {"with_stack": "yes"},
    ],
)
def test_parse_options_rejects(tmp_path: Path, body: dict) -> None:
    with pytest.raises(ProfileError):
        parse_options(body, tmp_path)


def test_parse_options_symlink_escape(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "link").symlink_to(tmp_path)
    with pytest.raises(ProfileError):
        parse_options({"output_dir": "link"}, base)
    opts = parse_options({"output_dir": str(base / "sub"), "activities": ["cpu"]}, base)
    assert opts.output_dir == (base / "sub").resolve() and opts.activities == ("CPU",)


def test_output_dir_named_from_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    """The design notes' example: FLASHREC_TORCH_PROFILER_DIR=./profiles with output_dir
    "./profiles/run1" lands in ./profiles/run1, not ./profiles/profiles/run1."""
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "profiles"
    assert parse_options({"output_dir": "./profiles/run1"}, base).output_dir == base / "run1"
    assert parse_options({"output_dir": "run1"}, base).output_dir == base / "run1"
    assert parse_options({"output_dir": "profiles"}, base).output_dir == base
    assert parse_options({}, base).output_dir == base
    other = parse_options({"output_dir": "./elsewhere/run1"}, base).output_dir
    assert other == base / "elsewhere" / "run1"  # not inside from here: under the directory
    with pytest.raises(ProfileError):
        parse_options({"output_dir": "../x"}, base)


def test_profile_endpoints(profiler_dir: Path) -> None:
    with fake_server() as srv:
        err = srv.post("/stop_profile")
        assert err.status_code == 400 and "no profile" in err.json()["error"]["message"]
        ok = srv.post("/start_profile", {"output_dir": "manual", "profile_prefix": "t1"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["output_dir"] == str(profiler_dir / "manual")
        assert srv.metrics()["flashrec_profiler_active"] == 1
        assert srv.post("/start_profile", {}).status_code == 400  # double start
        assert srv.post("/v1/chat/completions", CHAT).status_code == 200
        stop = srv.post("/stop_profile")
        assert stop.status_code == 200, stop.text
        (path,) = stop.json()["files"]
        assert Path(path).parent == profiler_dir / "manual"
        assert Path(path).name.startswith("t1-") and path.endswith(".trace.json.gz")
        assert trace_names(path)
        assert srv.post("/stop_profile").status_code == 400
        for outside in ("/tmp", "../x"):
            r = srv.post("/start_profile", {"output_dir": outside})
            assert r.status_code == 400 and "inside the profiler directory" in r.text
        (profiler_dir / "a_file").write_text("x")
        assert srv.post("/start_profile", {"output_dir": "a_file/sub"}).status_code == 400
        assert srv.post("/start_profile", data=b"{not json").status_code == 400
        assert srv.post("/start_profile", [1]).status_code == 400
        assert srv.get("/health").status_code == 200


def test_profile_num_steps_and_start_step(profiler_dir: Path) -> None:
    with fake_server() as srv:
        r = srv.post("/start_profile", {"output_dir": "auto", "num_steps": 2})
        assert r.status_code == 200 and r.json()["state"] == "active"
        srv.post("/v1/chat/completions", CHAT)  # four engine steps
        (path,) = wait_files(profiler_dir / "auto", "*.trace.json.gz")
        assert trace_names(path)
        # auto-stopped already: the next stop answers with that trace, once
        stop = srv.post("/stop_profile")
        assert stop.status_code == 200, stop.text
        assert stop.json()["files"] == [str(path)] and stop.json()["auto_stopped"] is True
        assert srv.post("/stop_profile").status_code == 400
        r = srv.post("/start_profile", {"output_dir": "delayed", "start_step": 2, "num_steps": 1})
        assert r.json()["state"] == "pending"
        assert not list((profiler_dir / "delayed").glob("*.gz"))
        srv.post("/v1/chat/completions", CHAT)
        wait_files(profiler_dir / "delayed", "*.trace.json.gz")
        r = srv.post("/start_profile", {"output_dir": "cancelled", "start_step": 1000})
        assert r.status_code == 200
        assert srv.post("/stop_profile").json()["files"] == []


def test_profile_real_engine_has_engine_spans(real: ServerThread, profiler_dir: Path) -> None:
    assert real.post("/start_profile", {"output_dir": "real"}).status_code == 200
    assert real.post("/v1/chat/completions", CHAT).status_code == 200
    (path,) = real.post("/stop_profile").json()["files"]
    names = trace_names(path)
    assert "flashrec.schedule" in names and "flashrec.beam" in names


def test_output_dir_null_byte_is_a_400(fake: ServerThread) -> None:
    r = fake.post("/start_profile", {"output_dir": "a\u0000b"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "NUL" in err["message"] and err["type"] == "invalid_request_error"
    assert fake.post("/stop_profile").status_code == 400  # nothing was started


@pytest.mark.parametrize("how", ["moved", "removed"])
def test_output_dir_swapped_for_a_symlink_is_refused(
    profiler_dir: Path, tmp_path: Path, how: str
) -> None:
    """The directory checked at /start_profile is replaced by a symlink to a place outside the
    profiler directory before /stop_profile: no trace lands outside (nor in the old one)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    moved = tmp_path / "moved"
    name = f"swap-{how}"
    with fake_server() as srv:
        r = srv.post("/start_profile", {"output_dir": name, "profile_prefix": "swap"})
        assert r.status_code == 200, r.text
        assert srv.post("/v1/chat/completions", CHAT).status_code == 200
        created = profiler_dir / name
        if how == "moved":
            created.rename(moved)
        else:
            created.rmdir()
        created.symlink_to(outside, target_is_directory=True)
        stop = srv.post("/stop_profile")
        assert stop.status_code == 400, stop.text
        assert "replaced or moved" in stop.json()["error"]["message"]
        assert srv.get("/health").status_code == 200
        # the controller is idle again and a later profile works
        ok = srv.post("/start_profile", {"output_dir": f"after-{how}"})
        assert ok.status_code == 200, ok.text
        (path,) = srv.post("/stop_profile").json()["files"]
        assert Path(path).parent == profiler_dir / f"after-{how}"
    assert list(outside.iterdir()) == []
    assert not moved.exists() or list(moved.iterdir()) == []
