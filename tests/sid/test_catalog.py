"""Catalog loading: every format, validation errors, and the ``flashrec catalog`` conversion."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest

from flashrec.sid.catalog import (
    CatalogError,
    add_catalog_args,
    load_catalog,
    run_catalog,
    unique_rows,
    write_catalog_json,
)
from flashrec.sid.layout import SidLayout

SIDS = [[12, 7, 301], [0, 0, 0], [12, 7, 5], [511, 3, 9], [12, 7, 301]]  # one duplicate
EXPECTED = np.array([[0, 0, 0], [12, 7, 5], [12, 7, 301], [511, 3, 9]])
K = 512
LAYOUT = SidLayout(code_start=1000, codebook_size=K, num_levels=3, sid_begin=2536, sid_end=2537)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def formats(tmp: Path) -> dict[str, Path]:
    """The same SIDs in every supported format."""
    packed = {
        str((a * K + b) * K + c): [{"pid": i, "count": 1}] for i, (a, b, c) in enumerate(SIDS)
    }
    tokens = "".join(f"<|sid_begin|><s_a_{a}><s_b_{b}><s_c_{c}><|sid_end|>\n" for a, b, c in SIDS)
    return {
        "comma_key": write(tmp / "ck.json", json.dumps({",".join(map(str, s)): {} for s in SIDS})),
        "recif": write(tmp / "sid2pid.json", json.dumps(packed)),
        "list": write(tmp / "list.json", json.dumps(SIDS)),
        "text_comma": write(tmp / "a.txt", "".join(f"{a},{b},{c}\n" for a, b, c in SIDS)),
        "text_space": write(
            tmp / "b.txt", "# header\n\n" + "".join(f" {a} {b}\t{c} \n" for a, b, c in SIDS)
        ),
        "text_tokens": write(tmp / "c.txt", tokens.replace("<|sid_end|>\n", "\n", 1)),
        "text_crlf": write(tmp / "d.txt", "".join(f"{a}, {b}, {c}\r\n" for a, b, c in SIDS)),
    }


@pytest.mark.parametrize(
    "fmt", ["comma_key", "recif", "list", "text_comma", "text_space", "text_tokens", "text_crlf"]
)
def test_formats_agree(tmp_path: Path, fmt: str) -> None:
    path = formats(tmp_path)[fmt]
    base = {"packed_base": K} if fmt == "recif" else {}  # packed base K, not RecIF's 8192
    for kwargs in ({"layout": LAYOUT}, {"codebook_size": K}):
        catalog = load_catalog(path, **kwargs, **base)
        np.testing.assert_array_equal(catalog.codes, EXPECTED)
        assert catalog.codes.dtype == np.int64
        assert (len(catalog), catalog.depth, catalog.source) == (4, 3, str(path))


def test_recif_default_codebook_and_depth(tmp_path: Path) -> None:
    k = 8192
    keys = {str((5 * k + 8191) * k + 17): [], str(3): []}
    catalog = load_catalog(write(tmp_path / "sid2pid.json", json.dumps(keys)))
    np.testing.assert_array_equal(catalog.codes, [[0, 0, 3], [5, 8191, 17]])
    two_levels = SidLayout(0, 16, 2, 32, 33)  # the depth is the layout's, the base the file's
    catalog = load_catalog(
        write(tmp_path / "p.json", json.dumps({"35": [], "255": []})), two_levels, packed_base=16
    )
    np.testing.assert_array_equal(catalog.codes, [[2, 3], [15, 15]])


def test_trailing_end_code_dropped(tmp_path: Path) -> None:
    path = write(
        tmp_path / "ck.json", json.dumps({"12,7,301,0": {}, "12,7,301,1": {}, "1,2,3,0": {}})
    )
    np.testing.assert_array_equal(load_catalog(path, LAYOUT).codes, [[1, 2, 3], [12, 7, 301]])
    assert load_catalog(path).depth == 4  # without a layout nothing is dropped
    path = write(tmp_path / "pids.json", json.dumps({"1,2,3,0": [7], "1,2,3,1": [8], "0,1,2,0": 5}))
    catalog = load_catalog(path, LAYOUT, keep_pids=True)
    assert catalog.pids == [5, [7, 8]]


def test_shallower_catalog_than_layout(tmp_path: Path) -> None:
    path = write(tmp_path / "two.txt", "1,2\n3,4\n")
    assert load_catalog(path, LAYOUT).depth == 2
    deep = write(tmp_path / "deep.txt", "1,2,3,4,5\n")
    with pytest.raises(CatalogError, match="5 codes, more than the layout's 3 levels"):
        load_catalog(deep, LAYOUT)


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("bad.json", '{"1,2,3": {}, "4,5,6": ', "invalid JSON at line 1"),
        ("depth.txt", "1,2,3\n# note\n4,5,6\n7,8\n", "line 4: expected 3 codes"),
        (
            "range.txt",
            "1,2,3\n4,512,6\n",
            "1 of 2 SIDs cannot be expressed by the SID layout; "
            "first: line 2: 4,512,6: code 512 at level b is at or beyond the codebook size 512",
        ),
        ("nonint.txt", "1,2,3\n4,x,6\n", "line 2: code 'x'"),
        ("neg.txt", "1,2,3\n4,-5,6\n", "line 2: code '-5'"),
        ("float.txt", "1,2,3\n4,5.5,6\n", "line 2: code '5.5'"),
        ("tokens.txt", "<s_a_1><s_c_2><s_b_3>\n", "line 1: expected SID tokens"),
        ("empty.txt", "# nothing\n\n", "holds no SIDs"),
        ("key_depth.json", '{"1,2,3": {}, "4,5": {}}', "key '4,5': expected 3 codes"),
        ("key_range.json", '{"1,2,3": {}, "4,5,600": {}}', "key '4,5,600': 4,5,600: code 600"),
        ("key_nonint.json", '{"1,2,3": {}, "4,b,6": {}}', "key '4,b,6': code 'b'"),
        ("list_depth.json", "[[1,2,3],[4,5]]", "entry 1: expected 3 codes"),
        ("list_type.json", '[[1,2,3],[4,"5",6]]', "entry 1: code '5'"),
        ("list_float.json", "[[1,2,3],[4,5.0,6]]", "entry 1: code 5.0"),
        ("recif_big.json", json.dumps({"1": [], str(8192**3): []}), f"key '{8192**3}': packed SID"),
        ("scalar.json", "[", "invalid JSON"),
        ("obj.json", "[1, 2]", "entry 0: expected a non-empty list"),
    ],
)
def test_malformed_files_name_path_and_entry(
    tmp_path: Path, name: str, text: str, where: str
) -> None:
    path = write(tmp_path / name, text)
    with pytest.raises(CatalogError, match=f"^{re.escape(str(path))}: .*{where}"):
        load_catalog(path, codebook_size=K)


def test_missing_file_and_size_mismatch(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot (read|open)"):
        load_catalog(tmp_path / "nope.json")
    path = write(tmp_path / "a.txt", "1,2,3\n")
    with pytest.raises(CatalogError, match="disagrees"):
        load_catalog(path, LAYOUT, codebook_size=8)


def test_large_values_fall_back_to_checked_parse(tmp_path: Path) -> None:
    huge = "9" * 25
    path = write(tmp_path / "huge.txt", f"1,2,3\n4,{huge},6\n")
    with pytest.raises(CatalogError, match="line 2: code '9999"):
        load_catalog(path)
    path = write(tmp_path / "ok.txt", "1,2,123456789012345678\n")
    assert load_catalog(path).codes[0, 2] == 123456789012345678


def test_unique_rows_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    for size in (3, 1 << 40):  # the packed-key path and the lexsort path
        codes = rng.integers(0, size, size=(500, 3))
        codes[::7] = codes[1::7][: len(codes[::7])]
        unique, inverse = unique_rows(codes)
        ref, ref_inverse = np.unique(codes, axis=0, return_inverse=True)
        np.testing.assert_array_equal(unique, ref)
        np.testing.assert_array_equal(inverse, ref_inverse.ravel())


def test_run_catalog_roundtrip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_catalog_args(parser)
    src = formats(tmp_path)["recif"]
    out = tmp_path / "out.json"
    argv = ["--from", str(src), "--out", str(out), "--sid", LAYOUT.to_arg()]
    assert run_catalog(parser.parse_args([*argv, "--packed-base", str(K)])) == 0
    assert "4 SIDs, depth 3" in capsys.readouterr().out
    written = json.loads(out.read_text())
    assert written == {"0,0,0": [1], "12,7,5": [2], "12,7,301": [4], "511,3,9": [3]}
    np.testing.assert_array_equal(load_catalog(out, LAYOUT).codes, EXPECTED)

    args = parser.parse_args(["--from", str(formats(tmp_path)["text_comma"]), "--out", str(out)])
    assert run_catalog(args) == 0
    assert json.loads(out.read_text()) == {",".join(map(str, s)): {} for s in EXPECTED.tolist()}

    bad = write(tmp_path / "bad.txt", "1,2,3\n1,2\n")
    args = parser.parse_args(["--from", str(bad), "--out", str(out), "--codebook-size", "8"])
    assert run_catalog(args) == 1
    assert f"{bad}: line 2" in capsys.readouterr().err


def test_write_catalog_json_large_roundtrip(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    codes = unique_rows(rng.integers(0, 8192, size=(20000, 3)))[0]
    path = tmp_path / "big.json"
    write_catalog_json(codes, path)
    np.testing.assert_array_equal(load_catalog(path, codebook_size=8192).codes, codes)


def _raw_both_ways(path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs):
    """read_raw_catalog through the written-layout fast path and through json.loads."""
    import flashrec.sid.catalog as cat

    fast = cat.read_raw_catalog(path, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(cat, "_written_keys", lambda text: None)
        slow = cat.read_raw_catalog(path, **kwargs)
    return fast, slow


def _same_raw(fast, slow) -> None:
    np.testing.assert_array_equal(fast.codes, slow.codes)
    assert (fast.kind, fast.items, fast.values) == (slow.kind, slow.items, slow.values)
    assert [fast.label(i) for i in range(len(fast.codes))] == [
        slow.label(i) for i in range(len(slow.codes))
    ]


@pytest.mark.parametrize("keep_pids", [False, True])
def test_written_comma_key_json_reads_as_json_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_pids: bool
) -> None:
    """The fast path for write_catalog_json's own layout gives what json.loads gives: same
    codes in file order, labels, kind, values; a key written twice merges (json keeps the
    first position); leading zeros and packed (comma-free) keys as well."""
    import flashrec.sid.catalog as cat

    rng = np.random.default_rng(1)
    codes = rng.integers(0, K, size=(300, 3))
    codes[17] = codes[3]  # a duplicate SID
    path = tmp_path / "w.json"
    write_catalog_json(codes, path)
    text = path.read_text()
    assert cat._written_keys(text) is not None  # the fast path applies
    fast, slow = _raw_both_ways(path, monkeypatch, keep_pids=keep_pids)
    _same_raw(fast, slow)
    assert len(fast.codes) == 299  # the SID written twice is one key, as json.loads has it
    # the same key text twice: json.loads keeps one
    twice = write(tmp_path / "twice.json", '{\n"1,2,3": {},\n"4,5,6": {},\n"1,2,3": {}\n}\n')
    fast, slow = _raw_both_ways(twice, monkeypatch, keep_pids=keep_pids)
    _same_raw(fast, slow)
    assert fast.codes.tolist() == [[1, 2, 3], [4, 5, 6]]
    zeros = write(tmp_path / "z.json", '{\n"012,7,301": {},\n"12,7,5": {}\n}\n  \n')
    _same_raw(*_raw_both_ways(zeros, monkeypatch, keep_pids=keep_pids))
    packed = write(tmp_path / "p.json", f'{{\n"{(12 * K + 7) * K + 301}": {{}},\n"7": {{}}\n}}\n')
    fast, slow = _raw_both_ways(packed, monkeypatch, packed_base=K, keep_pids=keep_pids)
    _same_raw(fast, slow)
    assert fast.kind.startswith("RecIF") and fast.codes.tolist()[0] == [12, 7, 301]
    # the loaded catalog is the same either way
    assert load_catalog(path).codes.tolist() == np.unique(codes, axis=0).tolist()


@pytest.mark.parametrize(
    "text",
    [
        '{\n"1,2,3": {},\n"4,5,6": {},\n}\n',  # a trailing comma: invalid JSON
        '{\n"1,2,3": {}\n"4,5,6": {}\n}\n',  # a missing comma: invalid JSON
        '{\n"1,2,3": {},\n"4,5,6": {}\n',  # no closing brace
        '{\n"1,2,3": {},\n"4,5,6": {}\n}\n}\n',  # a brace too many
    ],
)
def test_written_layout_lookalikes_that_are_not_json_still_fail(tmp_path: Path, text: str) -> None:
    import flashrec.sid.catalog as cat

    assert cat._written_keys(text) is None
    path = write(tmp_path / "bad.json", text)
    with pytest.raises(CatalogError, match="invalid JSON"):
        load_catalog(path)


@pytest.mark.parametrize(
    "text",
    [
        '{\r\n"1,2,3": {},\r\n"4,5,6": {}\r\n}\r\n',  # other line ends
        '{\n"1,2,3": {"pid": 4},\n"4,5,6": {}\n}\n',  # values of their own
        '{\n"1,2,3":{},\n"4,5,6": {}\n}\n',  # other spacing
        '{\n"\\u0031,2,3": {},\n"4,5,6": {}\n}\n',  # an escape
        '{"1,2,3": {}, "4,5,6": {}}',  # one line
    ],
)
def test_other_json_layouts_take_the_json_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    import flashrec.sid.catalog as cat

    assert cat._written_keys(text) is None
    path = write(tmp_path / "o.json", text)
    assert load_catalog(path).codes.tolist() == [[1, 2, 3], [4, 5, 6]]
