"""Catalogs as users have them: the RecIF pid2sid parquet, both sid2pid key forms, and the
``flashrec catalog`` report (depth, size, codes per level, SIDs the tokenizer cannot express)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flashrec.sid.catalog import (
    CatalogError,
    add_catalog_args,
    load_catalog,
    read_raw_catalog,
    run_catalog,
)
from flashrec.sid.catalog_report import build_report
from flashrec.sid.layout import SidLayout, infer_sid_layout

# pid -> SID; pids 10 and 12 share a SID (a collision the catalog merges)
PID2SID = {10: [5, 7, 301], 11: [0, 0, 0], 12: [5, 7, 301], 13: [511, 3, 9], 14: [5, 7, 2]}
UNIQUE = np.array([[0, 0, 0], [5, 7, 2], [5, 7, 301], [511, 3, 9]])
PIDS_BY_SID = [[11], [14], [10, 12], [13]]
K = 512
LAYOUT = SidLayout(code_start=1000, codebook_size=K, num_levels=3, sid_begin=2536, sid_end=2537)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_catalog_args(p)
    return p


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = run_catalog(parser().parse_args([str(a) for a in argv]))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def pid2sid_frame(shape: str) -> pd.DataFrame:
    pids = list(PID2SID)
    codes = np.array(list(PID2SID.values()))
    if shape == "sid_list":  # RecIF: pid, sid = [c0, c1, c2]
        return pd.DataFrame({"pid": pids, "sid": [np.array(c) for c in codes]})
    if shape == "other_list":
        return pd.DataFrame({"pid": pids, "codes": list(codes.tolist()), "note": "x"})
    names = {"letters": "sid_{}", "zero": "c{}", "one": "code_{}"}[shape]
    first = {"letters": 0, "zero": 0, "one": 1}[shape]
    cols = {
        names.format("abc"[i] if shape == "letters" else i + first): codes[:, i]
        for i in (2, 0, 1)  # column order must not matter, only the level in the name
    }
    return pd.DataFrame({"pid": pids, **cols})


@pytest.mark.parametrize("shape", ["sid_list", "other_list", "letters", "zero", "one"])
def test_pid2sid_parquet_roundtrip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: str
) -> None:
    src = tmp_path / "pid2sid.parquet"
    pid2sid_frame(shape).to_parquet(src, index=False)
    catalog = load_catalog(src, LAYOUT, keep_pids=True)
    np.testing.assert_array_equal(catalog.codes, UNIQUE)
    assert catalog.pids == PIDS_BY_SID

    out = tmp_path / "catalog.json"
    rc, stdout, _ = run(capsys, "--from", src, "--out", out, "--sid", LAYOUT.to_arg())
    assert rc == 0
    assert "4 SIDs, depth 3" in stdout and "5 entries (1 duplicate)" in stdout
    written = json.loads(out.read_text())
    assert written == {",".join(map(str, s)): p for s, p in zip(UNIQUE.tolist(), PIDS_BY_SID)}
    np.testing.assert_array_equal(load_catalog(out, LAYOUT).codes, UNIQUE)


def test_parquet_found_by_magic_and_kept_without_pids(tmp_path: Path) -> None:
    src = tmp_path / "catalog.bin"  # no .parquet suffix: the PAR1 magic decides
    pid2sid_frame("sid_list").drop(columns="pid").to_parquet(src, index=False)
    catalog = load_catalog(src, keep_pids=True)
    np.testing.assert_array_equal(catalog.codes, UNIQUE)
    assert catalog.pids is None
    assert read_raw_catalog(src).items is None


@pytest.mark.parametrize(
    ("frame", "where"),
    [
        (
            pd.DataFrame({"pid": [1, 2], "caption": ["a", "b"], "count": [3, 4]}),
            "no usable SID columns: expected a list column 'sid'.*found pid \\(int64\\), "
            "caption \\(.*string\\), count \\(int64\\)",
        ),
        (
            pd.DataFrame({"pid": [1], "a": [[1, 2]], "b": [[3, 4]]}),
            "no usable SID columns.*found several candidates: pid",
        ),
        (
            pd.DataFrame({"pid": [1, 2], "sid_a": [1, 2], "sid_c": [3, 4]}),  # level b missing
            "no usable SID columns",
        ),
        (pd.DataFrame({"pid": [7, 8], "sid": [[1, 2, 3], None]}), "row 1 \\(pid 8\\): SID is null"),
        (
            pd.DataFrame({"pid": [7, 8, 9], "sid": [[1, 2, 3], [1, 2, 3], [4, 5]]}),
            "row 2 \\(pid 9\\): expected 3 codes like the first row, got 2",
        ),
        (pd.DataFrame({"pid": [7, 8], "sid": [[1, 2, 3], [1, -2, 3]]}), "row 1 .*code -2"),
    ],
)
def test_unusable_parquet_names_path_and_columns(
    tmp_path: Path, frame: pd.DataFrame, where: str
) -> None:
    src = tmp_path / "pid2sid.parquet"
    frame.to_parquet(src, index=False)
    with pytest.raises(CatalogError, match=f"^{re.escape(str(src))}: {where}"):
        load_catalog(src)


def test_empty_parquet_holds_no_sids(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "empty.parquet"
    empty = {"pid": pa.array([], pa.int64()), "sid": pa.array([], pa.list_(pa.int64()))}
    pq.write_table(pa.table(empty), src)
    with pytest.raises(CatalogError, match=f"^{re.escape(str(src))}: catalog holds no SIDs"):
        load_catalog(src)


def test_parquet_errors_without_pyarrow_or_with_a_broken_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(CatalogError, match="cannot read parquet"):
        load_catalog(broken)
    src = tmp_path / "pid2sid.parquet"
    pid2sid_frame("sid_list").to_parquet(src, index=False)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(CatalogError, match="needs pyarrow: pip install pyarrow"):
        load_catalog(src)


def test_sid2pid_key_forms_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    by_sid: dict[tuple[int, ...], list[dict]] = {}
    for pid, sid in PID2SID.items():
        by_sid.setdefault(tuple(sid), []).append(
            {"pid": pid, "count": pid % 3 + 1, "count_after_downsample": 1}
        )
    k = 8192  # RecIF packing: c1*8192^2 + c2*8192 + c3
    packed = {str((a * k + b) * k + c): v for (a, b, c), v in by_sid.items()}
    comma = {",".join(map(str, s)): v for s, v in by_sid.items()}
    paths = {}
    for name, obj in (("packed", packed), ("comma", comma)):
        paths[name] = tmp_path / f"sid2pid_{name}.json"
        paths[name].write_text(json.dumps(obj))
    loaded = {name: load_catalog(p, keep_pids=True) for name, p in paths.items()}
    for catalog in loaded.values():
        np.testing.assert_array_equal(catalog.codes, UNIQUE)
        assert catalog.pids == PIDS_BY_SID
    reports = {}
    for name, path in paths.items():
        rc, stdout, _ = run(capsys, "--from", path, "--codebook-size", str(k), "--json")
        assert rc == 0
        reports[name] = json.loads(stdout)
    assert reports["packed"]["kind"].startswith("RecIF sid2pid JSON, packed keys base 8192")
    assert reports["comma"]["kind"] == "comma-key JSON"
    for key in ("depth", "entries", "sids", "items", "levels", "inexpressible"):
        assert reports["packed"][key] == reports["comma"][key], key
    assert reports["packed"]["items"] == len(PID2SID)


# a hand-built catalog over codebooks of 8: two SIDs use a code the tokenizer lacks
HAND = """0,1,2
0,1,3
7,1,2
0,8,2
0,1,2
0,8,2
9,9,9
"""
HAND_LAYOUT = SidLayout(code_start=100, codebook_size=8, num_levels=3, sid_begin=124, sid_end=125)


def test_report_counts_on_a_hand_built_catalog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "hand.txt"
    src.write_text(HAND)
    out = tmp_path / "out.json"
    rc, stdout, err = run(
        capsys, "--from", src, "--sid", HAND_LAYOUT.to_arg(), "--json", "--out", out
    )
    assert rc == 1 and not out.exists()
    assert "2 of 5 SIDs cannot be expressed" in err and "nothing written" in err
    report = json.loads(stdout)
    assert (report["depth"], report["entries"], report["sids"], report["duplicates"]) == (
        3,
        7,
        5,
        2,
    )
    assert report["levels"] == [
        {"level": 0, "distinct": 3, "min": 0, "max": 9},  # a: 0, 7, 9
        {"level": 1, "distinct": 3, "min": 1, "max": 9},  # b: 1, 8, 9
        {"level": 2, "distinct": 3, "min": 2, "max": 9},  # c: 2, 3, 9
    ]
    assert (report["codebook_size"], report["num_levels"]) == (8, 3)
    assert report["inexpressible"] == 2  # 0,8,2 twice counts once; 9,9,9
    assert [(e["where"], e["sid"]) for e in report["examples"]] == [
        ("line 4", [0, 8, 2]),
        ("line 7", [9, 9, 9]),
    ]
    assert "level b" in report["examples"][0]["why"] and "level a" in report["examples"][1]["why"]

    rc, stdout, _ = run(capsys, "--from", src, "--sid", HAND_LAYOUT.to_arg())
    assert rc == 1
    assert re.search(r"inexpressible +2 SIDs\n  line 4: 0,8,2: code 8 at level b", stdout)
    assert re.search(r"level b +3 distinct codes, 1\.\.9", stdout)

    rc, stdout, _ = run(capsys, "--from", src)  # no layout: a report, nothing checked
    assert rc == 0 and "codes not checked" in stdout and "inexpressible" not in stdout

    src.write_text(
        "".join(line + "\n" for line in HAND.splitlines() if "8" not in line and "9" not in line)
    )
    rc, stdout, _ = run(capsys, "--from", src, "--sid", HAND_LAYOUT.to_arg(), "--out", out)
    assert rc == 0 and re.search(r"inexpressible +none", stdout)
    assert json.loads(out.read_text()) == {"0,1,2": {}, "0,1,3": {}, "7,1,2": {}}


def test_report_depth_against_the_layout(tmp_path: Path) -> None:
    deep = tmp_path / "deep.txt"
    deep.write_text("1,2,3,4,5\n1,2,3,4,6\n1,2,3,4,6\n")
    report = build_report(read_raw_catalog(deep, HAND_LAYOUT), HAND_LAYOUT)
    assert (report.sids, report.inexpressible) == (2, 2)
    assert "5 codes, more than the layout's 3 levels" in report.examples[0].why

    with_end = tmp_path / "end.txt"  # one code past the levels: a trailing end code, dropped
    with_end.write_text("1,2,3,0\n1,2,3,1\n4,5,6,0\n")
    report = build_report(read_raw_catalog(with_end, HAND_LAYOUT), HAND_LAYOUT)
    assert (report.depth, report.sids, report.duplicates, report.inexpressible) == (3, 2, 1, 0)
    assert report.end_code_dropped and "trailing end code dropped" in report.format()

    shallow = tmp_path / "shallow.txt"
    shallow.write_text("1,2\n3,4\n")
    report = build_report(read_raw_catalog(shallow, HAND_LAYOUT), HAND_LAYOUT)
    assert (report.inexpressible, report.shallower) == (0, True)
    assert "served as 2-code SIDs" in report.format()


def test_layout_from_the_model_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoTokenizer

    from flashrec.synth.tokenizer import write_tokenizer

    model = tmp_path / "model"
    model.mkdir()
    write_tokenizer(model, codebook_size=8, num_levels=3)
    layout = infer_sid_layout(AutoTokenizer.from_pretrained(model))
    assert (layout.codebook_size, layout.num_levels) == (8, 3)
    src = tmp_path / "hand.txt"
    src.write_text(HAND)
    rc, stdout, _ = run(capsys, "--from", src, "--model-path", model, "--json")
    report = json.loads(stdout)
    assert rc == 1
    assert (report["layout"], report["inexpressible"]) == (layout.to_arg(), 2)
    rc, stdout, _ = run(capsys, "--from", src, "--model-path", model, "--sid", "0:48/16", "--json")
    assert json.loads(stdout)["inexpressible"] == 0  # --sid wins: 16 codes a level fit them all
