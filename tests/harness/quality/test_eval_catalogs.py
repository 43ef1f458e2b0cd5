"""``flashrec-bench eval --catalogs NAME=PATH --task-catalog TASK=NAME``: each task asked over
its own catalog (tests/harness/catalog_server.py holds them as FlashRec does), its invalid
rate checked against it, the per-task results naming it; bad input exits 2."""

from __future__ import annotations

import json

import pytest
from catalog_server import serving

from flashrec.synth.catalog import synth_catalog, write_catalog_json
from flashrec.synth.tokenizer import format_sid
from harness.cli.eval import main
from harness.quality.catalogs import parse_catalogs, parse_task_catalogs


@pytest.fixture
def data(tmp_path):
    """Disjoint video (30 SIDs) and ad (90 SIDs) catalogs, and a JSONL of 4 samples a task."""
    every = synth_catalog(120, 64, 3, seed=9)
    video, ad = every[::4], [r for i, r in enumerate(every) if i % 4]
    cats = {
        "video": str(write_catalog_json(video, tmp_path / "video.json")),
        "ad": str(write_catalog_json(ad, tmp_path / "ad.json")),
    }
    rows = []
    for task, sids in (("video", video), ("ad", ad)):
        for i in range(4):
            q = [{"role": "user", "content": f"{task} {i}"}]
            rows.append({"messages": q, "answer": format_sid(sids[i]), "task": task})
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ds, cats


def run_eval(url: str, ds, cats: dict, out, *extra: str) -> dict:
    argv = [str(ds), "--url", url, "--beams", "4", "--ks", "1,4", "--out", str(out)]
    argv += ["--catalogs", f"video={cats['video']}", "--catalogs", f"ad={cats['ad']}"]
    assert main([*argv, *extra]) == 0
    return json.loads(out.read_text())


def test_each_task_is_asked_and_checked_over_its_catalog(tmp_path, data, capsys):
    ds, cats = data
    record = tmp_path / "bodies.jsonl"
    out = tmp_path / "r.json"
    with serving([f"{n}={p}" for n, p in cats.items()], str(record)) as url:
        res = run_eval(url, ds, cats, out, "--task-catalog", "ad=ad")
    assert res["catalog_checked"]
    for task in ("video", "ad"):
        assert res["tasks"][task]["catalog"] == task  # video: the default, named
        assert res["tasks"][task]["invalid_rate"]["count"] == 0
        assert res["tasks"][task]["metrics"]["pass@4"]["value"] >= 0
    assert "ad: 4 samples, 0 failed requests, catalog ad" in capsys.readouterr().out
    bodies = [json.loads(line) for line in record.read_text().splitlines()]
    asked = {(b["messages"][0]["content"].split()[0], b["catalog"]) for b in bodies}
    assert asked == {("video", "video"), ("ad", "ad")} and len(bodies) == 8


def test_a_task_is_checked_against_its_own_catalog(tmp_path, data):
    """A server whose 'ad' catalog holds the video SIDs: the ad task's beams are all invalid
    against ad.json, the video task's none (each checked against its own catalog)."""
    ds, cats = data
    served = [f"video={cats['video']}", f"ad={cats['video']}"]
    with serving(served, str(tmp_path / "bodies.jsonl")) as url:
        res = run_eval(url, ds, cats, tmp_path / "r.json", "--task-catalog", "ad=ad")
    assert res["tasks"]["video"]["invalid_rate"]["count"] == 0
    assert res["tasks"]["ad"]["invalid_rate"]["count"] == res["tasks"]["ad"]["invalid_rate"]["n"]
    assert res["tasks"]["ad"]["invalid_rate"]["n"] == 16


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--catalogs", "video"], "expected NAME=PATH"),
        (["--catalogs", "=x.json"], "expected NAME=PATH"),
        (["--catalogs", "bad name=x.json"], "is no catalog name"),
        (["--catalogs", "v={video}", "--catalogs", "v={ad}"], "given twice"),
        (["--task-catalog", "ad=ad"], "--task-catalog needs --catalogs"),
        (["--catalogs", "v={video}", "--task-catalog", "ad"], "expected TASK=NAME"),
        (["--catalogs", "v={video}", "--task-catalog", "ad=x"], "'x' is not given by --catalogs"),
        (["--catalogs", "v={video}", "--task-catalog", "music=v"], "no sample has task 'music'"),
        (["--catalogs", "v={video}", "--task-catalog", "ad=v", "--task-catalog", "ad=v"], "twice"),
        (["--catalogs", "v={video}", "--catalog", "{ad}"], "not both"),
        (["--catalogs", "v={tmp}/missing.json"], "missing.json"),
    ],
)
def test_bad_catalog_options_exit_2(tmp_path, data, capsys, extra, message):
    ds, cats = data
    extra = [a.format(tmp=tmp_path, **cats) for a in extra]
    assert main([str(ds), "--url", "http://127.0.0.1:9", *extra]) == 2
    assert message in capsys.readouterr().err


def test_parsers():
    assert parse_catalogs(["a=x.json", "b = y.json"]) == {"a": "x.json", "b": "y.json"}
    assert parse_catalogs(None) == {}
    assert parse_task_catalogs(["t=b"], {"a": "x", "b": "y"}, ["t", "u"]) == {"t": "b"}
    assert parse_task_catalogs(None, {}, ["t"]) == {}
