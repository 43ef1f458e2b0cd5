"""End to end: the tiny synthetic model served by FlashRec with two named catalogs of different
sizes, a 2-cell matrix (each cell one catalog, one server for both), every answer's SIDs inside
its cell's catalog."""

from __future__ import annotations

import json

import pytest
from bench_helpers import REPO, processes_with, run_cli, write_matrix

from flashrec.sid.catalog import load_catalog
from flashrec.synth.catalog import synth_catalog, write_catalog_json

pytestmark = pytest.mark.skipif(
    not (REPO / "flashrec" / "server" / "app.py").is_file(),
    reason="the FlashRec server is not in this checkout",
)


def test_two_catalogs_one_server_each_cell_inside_its_own(tmp_path, tiny_model, marker):
    every = synth_catalog(600, 64, 3, seed=11)  # the tiny preset: 3 levels of 64 codes
    small = write_catalog_json(every[::5], tmp_path / "small.json")  # 120 SIDs
    big = write_catalog_json([r for i, r in enumerate(every) if i % 5], tmp_path / "big.json")
    m = {
        "name": "catalogs-e2e",
        "engine": {
            "kind": "flashrec",
            "device": "cpu",
            "startup_timeout_s": 180,
            "args": {"served_model_name": marker},
        },
        "model": {"path": str(tiny_model)},
        "catalogs": {"small": str(small), "big": str(big)},
        "workload": {
            "kind": "synthetic",
            "requests": 4,
            "warmup_requests": 1,
            "median_tokens": 32,
            "system_prompt_tokens": 8,
        },
        "axes": {"catalog": ["small", "big"]},
        "load": {"beam_width": 8, "max_tokens": 4, "request_timeout_s": 60},
        "gates": [{"metric": "invalid_rate", "op": "==", "value": 0}],
    }
    out = tmp_path / "out"
    code = run_cli(str(write_matrix(tmp_path, m)), "--out", str(out), "--rounds", "1")
    assert not processes_with(marker), "every server stopped"
    rep = json.loads((out / "report.json").read_text())
    cells = {c["params"]["catalog"]: c for c in rep["cells"]}
    assert set(cells) == {"small", "big"}
    for name, c in cells.items():
        assert c["status"] == "ok", c["error"]
        assert c["metrics"]["invalid_rate"]["median"] == 0, name
        assert c["metrics"]["beams_mean"]["median"] == 8
    assert code == 0
    # one server for both cells, launched with both catalogs, the default first
    (cmd,) = {tuple(c["server"]["command"]) for c in cells.values()}
    files = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--sid-vocab-file"]
    assert files == [f"small={small}", f"big={big}"]
    # the top-1 answers of each cell lie in its own catalog, not in the other
    sets = {n: {tuple(r) for r in load_catalog(p).codes.tolist()} for n, p in
            (("small", small), ("big", big))}  # fmt: skip
    for name in ("small", "big"):
        d = next((out / "cells").glob(f"*catalog={name}*"))
        tops = [json.loads(line)["top1"] for line in (d / "records.jsonl").read_text().splitlines()]
        tops = [tuple(int(x) for x in t.split("-")) for t in tops if t]
        assert tops and all(t in sets[name] for t in tops), name
        assert not any(t in sets[{"small": "big", "big": "small"}[name]] for t in tops)
    # the server lists both (GET /get_server_info engine.catalogs), the default first
    info = cells["small"]["server"]["info"]
    assert [(c["name"], c["default"], c["sids"]) for c in info["engine"]["catalogs"]] == [
        ("small", True, 120),
        ("big", False, 480),
    ]
