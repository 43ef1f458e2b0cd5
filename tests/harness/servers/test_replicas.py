"""harness.servers.replicas: N FlashRec replicas behind a real sglang-router, measured as one
engine, reported per replica, and none of them (nor the router) left after the run, even when
the harness is killed with ``kill -9``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from bench_helpers import REPO, write_matrix
from test_orphans import GONE_WITHIN_S, MARKER_ENV, _wait_gone, kill_marked, processes_with_env

from harness.servers.replicas import RoutedServer, replica_devices
from harness.soak.procs import cmdline
from harness.spec.matrix import SpecError, parse_spec

ROUTER_SKIP = "sglang-router (pip install sglang-router==0.3.2) does not import here"


def test_replica_devices_one_gpu_each_else_shared():
    assert replica_devices(2, ["0", "1", "2"]) == ["0", "1"]
    assert replica_devices(3, ["4", "5"]) == ["4", "5", "4"]  # fewer GPUs: shared
    assert replica_devices(2, ["0"]) == ["0", "0"]
    assert replica_devices(2, []) == [None, None]  # CPU: left as it is


def _engine(**extra):
    text = json.dumps({"engine": {"device": "cpu", **extra}, "model": {"path": "/m"}})
    return parse_spec(text)[0].engine


def test_routed_server_commands_and_devices(tmp_path):
    eng = _engine(replicas=2, router={"policy": "round_robin", "args": {"cache_threshold": 0.5,
                  "disable_retries": True, "dp_aware": False}}, env={"A": "1"})  # fmt: skip
    srv = RoutedServer(eng, {"beam_width": 8}, None, tmp_path / "e-1.log", gpus=["3", "7"])
    *replicas, router = srv.commands()
    assert len(replicas) == 2 and all("flashrec" in " ".join(r) for r in replicas)
    assert [r.engine.env for r in srv.replicas] == [
        {"A": "1", "CUDA_VISIBLE_DEVICES": "3"},
        {"A": "1", "CUDA_VISIBLE_DEVICES": "7"},
    ]
    ports = {r.port for r in srv.replicas} | {srv.router.port}
    assert len(ports) == 3
    assert router[router.index("--policy") + 1] == "round_robin"
    i = router.index("--worker-urls")
    assert router[i + 1 : i + 3] == srv.metrics_urls()
    assert "--disable-retries" in router and "--dp-aware" not in router
    assert router[router.index("--cache-threshold") + 1] == "0.5"
    assert srv.base_url == f"http://127.0.0.1:{srv.router.port}"
    assert [p.name for p in (r.log_path for r in srv.replicas)] == ["e-1-replica0.log",
                                                                     "e-1-replica1.log"]  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "words"),
    [
        ({"replicas": 2}, "needs 'router"),
        ({"router": {"policy": "fastest"}}, "round_robin"),
        ({"router": {"args": {"worker_urls": "x"}}}, "set by the harness"),
        ({"router": {"args": {"prometheus-port": 1}}}, "set by the harness"),
        ({"router": {}, "port": 8000}, "'port' cannot be fixed"),
        ({"kind": "external", "url": "http://x", "router": {}}, "launched engines"),
        ({"replicas": 0, "router": {}}, "greater than or equal to 1"),
        ({"router": {"command": []}}, "at least 1"),
    ],
)
def test_router_spec_errors(engine, words):
    text = json.dumps({"engine": engine, "model": {"path": "/m"}})
    with pytest.raises(SpecError) as err:
        parse_spec(text, "m.yaml")
    assert "m.yaml:" in str(err.value) and "engine" in str(err.value)
    assert words in str(err.value)


def _matrix(tiny_model: Path, engines: list[dict], requests: int) -> dict:
    return {
        "name": "routed",
        "engines": [{"device": "cpu", "startup_timeout_s": 300, **e} for e in engines],
        "model": {"path": str(tiny_model)},
        "workload": {"kind": "synthetic", "users": 4, "user_items": 2, "requests": requests,
                     "warmup_requests": 2, "median_tokens": 64, "system_prompt_tokens": 16},
        "load": {"rounds": 2, "concurrency": 2, "beam_width": 4, "radix": "cold",
                 "request_timeout_s": 60},
        "stats": {"min_rounds": 2},
    }  # fmt: skip


def _harness(path: Path, out: Path, marker: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
           os.environ.get("PYTHONPATH")])), MARKER_ENV: marker}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "harness", str(path), "--out", str(out)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def test_two_replicas_behind_the_real_router(tmp_path: Path, tiny_model: Path) -> None:
    """Direct, 2 replicas round-robin (chat) and 1 replica cache-aware (/generate) in one
    run: every cell measured at its URL, per-replica counts in report.json, nothing left."""
    pytest.importorskip("sglang_router", reason=ROUTER_SKIP)
    engines = [
        {"name": "direct"},
        {"name": "rr", "replicas": 2, "router": {"policy": "round_robin"}},
        {"name": "ca1", "protocol": "generate", "replicas": 1,
         "router": {"policy": "cache_aware"}},
    ]  # fmt: skip
    path = write_matrix(tmp_path, _matrix(tiny_model, engines, requests=8))
    marker = uuid.uuid4().hex
    harness = _harness(path, tmp_path / "out", marker)
    try:
        log, _ = harness.communicate(timeout=480)
        assert harness.returncode == 0, log[-3000:]
        assert _wait_gone(marker, GONE_WITHIN_S) == []
    finally:
        if harness.poll() is None:
            harness.kill()
        kill_marked(marker)  # a failed run: clean up what it left
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    cells = {c["id"]: c for c in report["cells"]}
    assert {c["status"] for c in cells.values()} == {"ok"}, log[-3000:]
    for c in cells.values():
        assert c["metrics"]["error_rate"]["median"] == 0
        assert 0 < c["metrics"]["server_radix_hit_rate"]["median"] < 1
        assert c["metrics"]["server_prefill_tokens_per_request"]["median"] > 0
    assert "replicas" not in cells["direct"]["server"]
    # the server's CPU: a routed cell's counts the router and every replica, with no one
    # main process; the direct server's main process is its own share of the whole
    direct, routed = cells["direct"]["metrics"], cells["rr"]["metrics"]
    assert direct["server_main_cpu_ms_per_request"]["median"] > 0
    assert direct["server_cpu_ms_per_request"]["median"] >= (
        direct["server_main_cpu_ms_per_request"]["median"])  # fmt: skip
    assert routed["server_cpu_ms_per_request"]["median"] > 0
    assert "server_main_cpu_ms_per_request" not in routed
    assert "host_other_cpu_cores" in routed
    rr = cells["rr"]["server"]
    assert rr["router"]["policy"] == "round_robin" and len(rr["replica_servers"]) == 2
    rows = rr["replicas"]
    assert [r["url"] for r in rows] == [s["url"] for s in rr["replica_servers"]]
    assert rr["url"] not in [r["url"] for r in rows]  # measured at the router, not a replica
    assert sum(r["requests"] for r in rows) == 8 * 2  # every measured request, both rounds
    assert all(r["requests"] >= 4 for r in rows)  # round-robin: both replicas served
    assert all(0 < r["radix_hit_rate"] < 1 for r in rows)
    ca1 = cells["ca1"]["server"]
    assert ca1["replicas"][0]["requests"] == 16 and cells["ca1"]["server"]["protocol"] == "generate"
    md = (tmp_path / "out" / "REPORT.md").read_text()
    assert "## Prefix cache and replicas" in md and "round_robin x 2" in md


def test_kill_9_of_the_harness_leaves_no_replica_and_no_router(
    tmp_path: Path, tiny_model: Path
) -> None:
    pytest.importorskip("sglang_router", reason=ROUTER_SKIP)
    engines = [{"name": "rr", "replicas": 2, "router": {"policy": "round_robin"},
                "args": {"warmup": False}}]  # fmt: skip
    path = write_matrix(tmp_path, _matrix(tiny_model, engines, requests=2000))
    marker = uuid.uuid4().hex
    harness = _harness(path, tmp_path / "out", marker)
    try:
        deadline, routed = time.monotonic() + 300, []
        while time.monotonic() < deadline and harness.poll() is None and not routed:
            time.sleep(0.5)
            found = [(p, cmdline(p)) for p in processes_with_env(marker)]
            routed = [p for p, cmd in found if "sglang_router" in cmd]
        assert routed, "the router never started"
        time.sleep(5.0)  # the router is up: the cell's load is under way
        found = [(p, cmdline(p)) for p in processes_with_env(marker) if p != harness.pid]
        assert len([p for p, cmd in found if "flashrec serve" in cmd]) == 2, found
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        left = _wait_gone(marker, GONE_WITHIN_S)
        assert left == [], [(p, cmdline(p)) for p in left]
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
        kill_marked(marker)  # a failed run: clean up what it left
