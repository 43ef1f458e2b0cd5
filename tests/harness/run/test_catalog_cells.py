"""A matrix whose cells each pick a named catalog, run against a server that holds them
(tests/harness/catalog_server.py): each cell's requests carry its catalog on both protocols,
and its SIDs are checked against that catalog."""

from __future__ import annotations

import json

from bench_helpers import run_cli, write_matrix
from catalog_server import serving

from flashrec.synth.catalog import synth_catalog, write_catalog_json


def two_catalogs(tmp_path) -> dict[str, str]:
    """Disjoint catalogs of 40 and 200 SIDs (3 levels of 64 codes)."""
    every = synth_catalog(240, 64, 3, seed=5)
    return {
        "small": str(write_catalog_json(every[::6], tmp_path / "small.json")),
        "big": str(
            write_catalog_json([r for i, r in enumerate(every) if i % 6], tmp_path / "big.json")
        ),
    }


def test_each_cell_asks_and_checks_its_own_catalog(tmp_path):
    cats = two_catalogs(tmp_path)
    record = tmp_path / "bodies.jsonl"
    with serving([f"{n}={p}" for n, p in cats.items()], str(record)) as url:
        engine = {"kind": "external", "url": url}
        m = {
            "name": "catalog-cells",
            "engines": [
                {**engine, "name": "chat"},
                {**engine, "name": "gen", "protocol": "generate"},
            ],
            "catalogs": cats,
            "workload": {"kind": "lorem", "requests": 4, "warmup_requests": 1, "median_tokens": 20},
            "axes": {"catalog": ["small", "big"]},
            "load": {"rounds": 1, "beam_width": 4, "max_tokens": 4},
            "gates": [{"metric": "invalid_rate", "op": "==", "value": 0}],
        }
        out = tmp_path / "out"
        assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0
    rep = json.loads((out / "report.json").read_text())
    cells = {c["id"]: c for c in rep["cells"]}
    assert set(cells) == {f"{e},catalog={n}" for e in ("chat", "gen") for n in cats}
    for c in cells.values():
        assert c["status"] == "ok", c["error"]
        assert c["params"]["catalog"] in cats  # the report records the cell's catalog
        assert c["metrics"]["invalid_rate"]["median"] == 0  # its answers are in its catalog
    assert [n for n, _, _ in rep["model"]["catalogs"]] == ["small", "big"]
    bodies = [json.loads(line) for line in record.read_text().splitlines()]
    chat = [b["catalog"] for b in bodies if "messages" in b]
    gen = [b["sampling_params"]["catalog"] for b in bodies if "sampling_params" in b]
    # every request (warm-up, priming, measured) of each cell named its catalog
    assert len(chat) == len(gen) and sorted(set(chat)) == sorted(set(gen)) == ["big", "small"]
    assert chat.count("small") == chat.count("big")


def test_a_cell_checked_against_another_catalog_sees_invalid_sids(tmp_path, monkeypatch):
    """The check is the cell's catalog: with the name dropped from its requests, the server
    answers from its default (small) and every SID of the cell of big is invalid."""
    import dataclasses

    import harness.run.cell as cell_run
    from harness.load.loop import make_requests

    def nameless(*args, **kwargs):
        return [dataclasses.replace(r, catalog=None) for r in make_requests(*args, **kwargs)]

    monkeypatch.setattr(cell_run, "make_requests", nameless)
    cats = two_catalogs(tmp_path)
    with serving([f"{n}={p}" for n, p in cats.items()], str(tmp_path / "bodies.jsonl")) as url:
        m = {
            "engine": {"kind": "external", "url": url},
            "catalogs": cats,
            "workload": {"kind": "lorem", "requests": 3, "warmup_requests": 1, "median_tokens": 20},
            "cells": [{"catalog": "big"}],
            "load": {"rounds": 1, "beam_width": 4, "max_tokens": 4},
        }
        out = tmp_path / "out"
        run_cli(str(write_matrix(tmp_path, m)), "--out", str(out))
    (cell,) = json.loads((out / "report.json").read_text())["cells"]
    assert cell["metrics"]["invalid_rate"]["median"] == 1.0
