"""End to end on the tiny model: fresh ``flashrec serve`` processes on 127.0.0.1 ephemeral
ports (always stopped), compared bit for bit; the planted id()-keyed cache is caught and
localised. The acceptance-size run (120 requests x 3 processes, both modes) is a CLI run:
``flashrec-bench determinism --model-path DIR --sid-vocab-file F --requests 120 --processes 3``.
"""

from __future__ import annotations

import json

import pytest

from harness.cli.determinism import main
from harness.determinism import HOST_STATE, NUMERICS, run_determinism

pytestmark = pytest.mark.slow

# the planted id()-keyed cache (tests/plants/flashrec_plants.py), installed in the servers by
# the sitecustomize that tests/conftest.py puts on their PYTHONPATH
PLANT_ID_CACHE_ENV = "FLASHREC_TEST_PLANT_ID_CACHE"


def test_cli_sequential_is_bit_identical(tiny_model, tmp_path):
    code = main([
        "--model-path", str(tiny_model), "--sid-vocab-file", str(tiny_model / "catalog.json"),
        "--requests", "16", "--processes", "2", "--mode", "sequential", "--ns", "1,4,16",
        "--out", str(tmp_path), "--server-arg", "batch_slots=256", "--no-localise",
    ])  # fmt: skip
    report = json.loads((tmp_path / "determinism.json").read_text())
    assert code == 0, report
    seq = report["sequential"]
    assert report["status"] == "pass" and seq["drifting_requests"] == 0 and seq["errors"] == 0
    assert seq["requests"] == 16 and seq["processes"] == 2
    assert sorted(p.name for p in (tmp_path / "servers").iterdir()) == [
        "sequential-0.log",
        "sequential-1.log",
    ]


def test_planted_id_cache_is_detected_and_localised(tiny_model, tmp_path):
    res = run_determinism(
        str(tiny_model), str(tiny_model / "catalog.json"), requests=30, processes=3,
        mode="sequential", out_dir=tmp_path, server_env={PLANT_ID_CACHE_ENV: "1"},
        log=lambda msg: None,
    )  # fmt: skip
    seq, loc = res["sequential"], res["localisation"]["sequential"]
    assert res["status"] == "fail" and seq["errors"] == 0
    assert seq["drifting_requests"] > 0 and seq["requests_with_rank_changes"] > 0
    assert loc["first_divergence"], f"no drift in {loc['replays']} step-hash replay(s)"
    for e in loc["first_divergence"]:
        assert e["verdict"] == HOST_STATE, e
        assert (e["step"], e["phase"]) == (1, "decode"), e  # prefill is clean: slots are not
    assert json.loads((tmp_path / "determinism.json").read_text())["status"] == "fail"


def test_concurrent_drift_against_sequential_is_localised(tiny_model, tmp_path):
    """Default serving: concurrent answers differ from the sequential ones (few-row CPU GEMMs
    take another path, prompts share a prefill forward); the replay names the first step
    where each differs, as numerics. With --deterministic a strict run passes."""
    res = run_determinism(
        str(tiny_model), str(tiny_model / "catalog.json"), requests=24, processes=2,
        mode="both", concurrency=16, out_dir=tmp_path / "default", log=lambda msg: None,
    )  # fmt: skip
    assert res["concurrent"]["vs_sequential"]["drifting_requests"] > 0
    loc = res["localisation"]["concurrent_vs_sequential"]
    assert loc["first_divergence"], f"no drift in {loc['replays']} step-hash replay(s)"
    for e in loc["first_divergence"]:
        assert e["verdict"] == NUMERICS and e["phase"] in ("prefill", "decode"), e
    strict = run_determinism(
        str(tiny_model), str(tiny_model / "catalog.json"), requests=24, processes=2,
        mode="both", concurrency=16, out_dir=tmp_path / "mode", log=lambda msg: None,
        server_args={"deterministic": True}, strict_concurrent=True,
    )  # fmt: skip
    assert strict["status"] == "pass" and "concurrent_vs_sequential" not in strict["localisation"]
