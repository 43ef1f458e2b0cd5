"""Several engines side by side with a real second server: this checkout's FlashRec, and the
same server behind a peer's shape (``tests/harness/peer_shim``: a package also named
``flashrec`` on the peer's own PYTHONPATH, the public flashrec 0.1.2's ``--serve`` command
line) with another knob. Interleaved rounds, the engines section of the report, a peer that
cannot start, and parity against a peer (the matrix stage and ``pytest -m parity``)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from bench_helpers import HERE, REPO, processes_with, run_cli, write_matrix

SHIM = str(HERE / "peer_shim")

pytestmark = pytest.mark.skipif(
    not (REPO / "flashrec" / "server" / "app.py").is_file(),
    reason="the FlashRec server is not in this checkout",
)


def _peer(marker: str, **extra) -> dict:
    """The shim peer as a matrix engine: its own command and PYTHONPATH, knobs of its own."""
    return {
        "name": "peer",
        "kind": "command",
        "command": ["python", "-P", "-m", "flashrec", "--serve"],
        "pythonpath": [SHIM],
        "device": "cpu",
        "startup_timeout_s": 180,
        "args": {"served_model_name": marker},
        **extra,
    }


def _ours(marker: str) -> dict:
    return {"name": "flashrec", "kind": "flashrec", "device": "cpu", "startup_timeout_s": 180,
            "args": {"served_model_name": marker}}  # fmt: skip


def _windows(out: Path) -> dict[tuple[str, int], tuple[float, float]]:
    """(engine, round) -> (first send, last end) of the measured requests in records.csv."""
    spans: dict[tuple[str, int], list[float]] = defaultdict(list)
    with open(out / "records.csv") as f:
        for r in csv.DictReader(f):
            if r["phase"] == "measure":
                key = (r["cell"].split(",")[0], int(r["round"]))
                spans[key] += [float(r["t_send"]), float(r["t_end"])]
    return {k: (min(v), max(v)) for k, v in spans.items()}


def test_engines_interleaved_with_a_peer_and_one_that_cannot_start(tmp_path, tiny_model, marker):
    broken = {
        "name": "broken",
        "kind": "command",
        "command": ["python", "-c",
                    "import sys; print('broken: CUDA out of memory', flush=True); sys.exit(3)"],
        "standard_args": False,
        "startup_timeout_s": 60,
    }  # fmt: skip
    m = {
        "name": "peers-cpu",
        # the peer runs in a folder of its own: nothing but its PYTHONPATH names a flashrec
        "engines": [_ours(marker), _peer(marker, link={"batch_slots": "4 * beam_width"},
                                         cwd=str(tmp_path)), broken],
        "model": {"path": str(tiny_model)},
        "catalog": {"path": str(tiny_model / "catalog.json")},
        "workload": {"kind": "synthetic", "requests": 6, "warmup_requests": 2,
                     "median_tokens": 32, "system_prompt_tokens": 8},
        "axes": {"beam_width": [4], "concurrency": [2]},
        "load": {"rounds": 3, "radix": "warm", "request_timeout_s": 60,
                 "interleave_engines": True},
    }  # fmt: skip
    out = tmp_path / "out"
    run_cli(str(write_matrix(tmp_path, m)), "--out", str(out))
    rep = json.loads((out / "report.json").read_text())
    cells = {c["engine"]: c for c in rep["cells"]}
    assert cells["flashrec"]["status"] == "ok" and cells["peer"]["status"] == "ok"
    for name in ("flashrec", "peer"):
        assert cells[name]["metrics"]["beams_mean"]["median"] == 4
        assert cells[name]["metrics"]["invalid_rate"]["median"] == 0
        assert cells[name]["metrics"]["qps"]["n"] == 3
    # the peer ran its own command line on its own PYTHONPATH, with its own knob
    peer_cmd = " ".join(cells["peer"]["server"]["command"])
    assert "-m flashrec --serve" in peer_cmd and "--batch-slots 16" in peer_cmd
    assert "--batch-slots" not in " ".join(cells["flashrec"]["server"]["command"])
    # rounds alternate: A B, then B A, then A B, each engine's round apart from the other's
    w = _windows(out)
    order = [("flashrec", "peer"), ("peer", "flashrec"), ("flashrec", "peer")]
    for rnd, (first, second) in enumerate(order):
        assert w[(first, rnd)][1] <= w[(second, rnd)][0], (rnd, w)
        if rnd:
            assert w[(order[rnd - 1][1], rnd - 1)][1] <= w[(first, rnd)][0], (rnd, w)
    # the engine that could not start is a row of the comparison, with its log line
    sec = rep["engines"]
    assert sec["base"] == "flashrec" and sec["interleaved"] is True and len(sec["rows"]) == 1
    row = sec["rows"][0]
    assert row["engines"]["broken"]["status"] == "failed"
    assert "CUDA out of memory" in row["engines"]["broken"]["log_line"]
    r = row["ratios"]["peer"]["qps"]
    assert r["paired"] is True and r["rounds"] == 3
    assert r["ci_low"] <= r["ratio"] <= r["ci_high"] and r["ratio"] > 0
    assert set(row["ratios"]["peer"]) == {"qps", "latency_p50_ms", "latency_p99_ms"}
    md = (out / "REPORT.md").read_text()
    assert "## Engines side by side" in md and "CUDA out of memory" in md
    assert not processes_with(marker)


def test_parity_stage_candidate_is_a_matrix_engine(tmp_path, tiny_model, marker):
    from harness.parity.stage import run_parity_stage
    from harness.spec.matrix import parse_spec

    text = json.dumps({
        "engines": [_ours(marker), _peer(marker, args={"served_model_name": marker,
                                                       "dtype": "float32", "quantization": "none",
                                                       "batch_slots": 8})],
        "model": {"path": str(tiny_model)},
        "axes": {"beam_width": [4]},
        "parity": {"candidates": [{"name": "ours"},
                                  {"name": "peer", "engine": "peer", "against": "ours"}]},
    })  # fmt: skip
    spec, _ = parse_spec(text)
    section = {"reference_dtype": "float32", "ns": [1, 4], "prompts": 3, "device": "cpu",
               "protocols": ["chat"], "startup_timeout_s": 180,
               "candidates": [{"name": "ours", "server_args": {"served_model_name": marker}},
                              {"name": "peer", "engine": "peer", "against": "ours"}]}  # fmt: skip
    res = run_parity_stage(section, str(tiny_model), str(tiny_model / "catalog.json"),
                           tmp_path / "parity", log=lambda *a: None,
                           engines={e.name: e for e in spec.engine_list})  # fmt: skip
    cands = {c["name"]: c for c in res["candidates"]}
    assert cands["peer"]["kind"] == "engine" and cands["peer"]["gate"] is False
    assert cands["peer"]["args"]["batch_slots"] == 8
    assert cands["peer"]["status"] == "pass", cands["peer"]["failures"]
    rows = {r["n"]: r for r in res["against"]}
    assert sorted(rows) == [1, 4]
    for r in rows.values():  # the same engine behind both names: the same beams
        assert (r["candidate"], r["against"], r["cases"], r["errors"]) == ("peer", "ours", 3, 0)
        assert r["top1_agreement"] == 1.0 and r["overlap_mean"] == 1.0
        assert r["max_score_diff"] <= 1e-4
    assert not processes_with(marker)


def test_matrix_refuses_a_parity_engine_it_does_not_have(tiny_model):
    from harness.spec.matrix import SpecError, parse_spec

    text = json.dumps({
        "engines": [{"name": "flashrec"}, {"name": "peer", "kind": "external",
                                           "url": "http://127.0.0.1:9"}],
        "model": {"path": str(tiny_model)},
        "parity": {"candidates": [{"name": "p", "engine": "pear"}]},
    })  # fmt: skip
    with pytest.raises(SpecError, match="'pear' is not an engine of this matrix"):
        parse_spec(text)


def test_pytest_parity_against_a_peer_url(tmp_path, tiny_model, marker):
    from harness.parity.servers import one_server
    from harness.spec.matrix import EngineSpec

    catalog = str(tiny_model / "catalog.json")
    peer = EngineSpec(**_peer(marker, args={}))
    args = {"dtype": "float32", "quantization": "none", "served_model_name": marker}
    with one_server("candidate", args, str(tiny_model), catalog, tmp_path / "ours.log",
                    "cpu") as (ours, _), \
         one_server("candidate", {**args, "batch_slots": 8}, str(tiny_model), catalog,
                    tmp_path / "peer.log", engine=peer) as (peer_url, _):  # fmt: skip
        got = tmp_path / "peer_parity.json"
        env = {**os.environ, "PEER_BEAM_URL": peer_url, "FLASHREC_URL": ours,
               "PARITY_NS": "1,4", "PARITY_PROMPTS": "3", "PEER_PARITY_OUT": str(got),
               "MODEL_PATH": str(tiny_model)}  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-m", "parity", "-p", "no:cacheprovider",
             str(REPO / "tests" / "parity" / "test_peer_parity.py")],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
    rows = {r["n"]: r for r in json.loads(got.read_text())["rows"]}
    assert sorted(rows) == [1, 4]
    for r in rows.values():
        assert r["cases"] == 3 and r["errors"] == 0
        assert r["top1_agreement"] == 1.0 and r["overlap_mean"] == 1.0
        assert r["max_score_diff"] <= 1e-4
    assert not processes_with(marker)


def test_command_server_gets_its_own_pythonpath_and_the_guard_keeps_ours(tmp_path):
    """A peer's PYTHONPATH holds another package named flashrec: the server process gets it
    first, and the guard around it (which imports this checkout's flashrec.parentwatch) never
    imports that package."""
    import time

    from harness.servers.launch import LaunchedServer
    from harness.spec.matrix import EngineSpec

    peer = tmp_path / "peer-site"
    (peer / "flashrec").mkdir(parents=True)
    (peer / "flashrec" / "__init__.py").write_text(
        "raise ImportError('the peer package was imported by the guard')\n"
    )
    script = "import os, sys; print('child path', os.environ['PYTHONPATH'].split(os.pathsep)[0])"
    eng = EngineSpec(name="p", kind="command", command=["python", "-c", script],
                     pythonpath=[str(peer)], env={"X_PEER": "1"}, standard_args=False,
                     cwd=str(tmp_path))  # fmt: skip
    srv = LaunchedServer(eng, {}, None, tmp_path / "p.log")
    srv.launch()
    deadline = time.monotonic() + 60
    while srv.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    log = (tmp_path / "p.log").read_text()
    srv.stop()
    assert srv.exit_code() == 0, log
    assert f"child path {peer}" in log and "imported by the guard" not in log


def test_peers_matrix_dry_run(capsys, monkeypatch):
    """matrices/h200_peers.yaml validates here: both engines on the five cells, the peer by the
    public engine's own command line on PEER_DIR, with its own knobs and max_tokens."""
    monkeypatch.setenv("PEER_DIR", "/opt/peer-site")
    monkeypatch.delenv("MODEL_PATH", raising=False)
    assert run_cli(str(REPO / "matrices" / "h200_peers.yaml"), "--dry-run") == 0
    out = capsys.readouterr().out
    assert "10 cell(s)" in out and "engines interleaved" in out
    peer = [ln for ln in out.splitlines() if "-P -m flashrec --serve" in ln]
    assert len(peer) == 5 and all("--disable-radix" in ln for ln in peer)
    assert "--cuda-graph-max-bs 4096 --batch-slots 4096" in peer[1]
    assert "--kv-pool-tokens" not in " ".join(peer)
    assert out.count("max_tokens=3") == 5
