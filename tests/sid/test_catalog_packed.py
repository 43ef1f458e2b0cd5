"""Packed-integer SID keys decode in the base the file was written in (RecIF's 8192, or an
explicit ``packed_base``), never in the model's codebook size: a code the codebook cannot hold
is an inexpressible SID, counted and named like any other; ``flashrec catalog PATH`` is
``flashrec catalog --from PATH``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from flashrec.cli import main as flashrec_main
from flashrec.sid.catalog import CatalogError, load_catalog, read_raw_catalog
from flashrec.sid.layout import SidLayout
from flashrec.sid.rows import RowError, decode_sid_keys, pack_sid

K = 64  # codes per level of the tiny preset's layout
LAYOUT = SidLayout(code_start=261, codebook_size=K, num_levels=3, sid_begin=453, sid_end=454)


def packed(sids: list[tuple[int, int, int]], base: int = 8192) -> dict[str, list]:
    return {str((a * base + b) * base + c): [{"pid": i}] for i, (a, b, c) in enumerate(sids)}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    rc = flashrec_main(["catalog", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_key_below_codebook_cubed_reads_base_8192_under_a_64_code_layout(tmp_path: Path):
    """90121 = 11 * 8192 + 9 is (0, 11, 9) and 16385 is (0, 2, 1); read base 64 (both below
    64^3) they were silently (22, 0, 9) and (4, 0, 1)."""
    path = tmp_path / "sid2pid.json"
    path.write_text(json.dumps(packed([(0, 11, 9), (0, 2, 1)])))
    assert set(json.loads(path.read_text())) == {"90121", "16385"}
    for kwargs in ({}, {"layout": LAYOUT}, {"codebook_size": K}):
        assert load_catalog(path, **kwargs).codes.tolist() == [[0, 2, 1], [0, 11, 9]], kwargs
    raw = read_raw_catalog(path, LAYOUT)
    assert raw.kind == "RecIF sid2pid JSON, packed keys base 8192" and raw.packed_base == 8192
    # a file packed base 64 reads right when told so, and only then
    p64 = tmp_path / "p64.json"
    p64.write_text(json.dumps(packed([(0, 11, 9), (0, 2, 1)], base=K)))
    assert load_catalog(p64, LAYOUT, packed_base=K).codes.tolist() == [[0, 2, 1], [0, 11, 9]]
    assert load_catalog(p64).codes.tolist() == [[0, 0, 129], [0, 0, 713]]  # its digits base 8192


def test_a_packed_code_beyond_the_codebook_is_inexpressible(tmp_path, capsys):
    """(0, 100, 9) and (70, 1, 1) packed base 8192 hold codes a 64-code layout lacks: the
    report counts them and names each key, the conversion writes nothing, a server refuses
    the file with the count, and the message says which base the keys were read in."""
    sids = [(0, 11, 9), (0, 100, 9), (70, 1, 1)]
    path = tmp_path / "sid2pid.json"
    path.write_text(json.dumps(packed(sids)))
    out = tmp_path / "out.json"
    rc, stdout, err = run_cli(capsys, path, "--sid", LAYOUT.to_arg(), "--out", out)
    assert rc == 1 and not out.exists()
    assert re.search(r"inexpressible +2 SIDs\n", stdout)
    key_b, key_a = pack_sid((0, 100, 9)), pack_sid((70, 1, 1))
    beyond = "is at or beyond the codebook size 64"
    assert f"key '{key_b}': 0,100,9: code 100 at level b {beyond}" in stdout
    assert f"key '{key_a}': 70,1,1: code 70 at level a {beyond}" in stdout
    assert "2 of 3 SIDs cannot be expressed by the SID layout" in err
    assert "packed keys decoded base 8192" in err and "nothing written" in err
    rc, stdout, _ = run_cli(capsys, path, "--sid", LAYOUT.to_arg(), "--json")
    report = json.loads(stdout)
    assert (rc, report["inexpressible"], report["sids"]) == (1, 2, 3)
    assert [e["sid"] for e in report["examples"]] == [[0, 100, 9], [70, 1, 1]]
    with pytest.raises(CatalogError, match=r"2 of 3 SIDs cannot be expressed .*first: key "
                       rf"'{key_b}': 0,100,9: code 100 at level b"):  # fmt: skip
        load_catalog(path, LAYOUT)


def test_catalog_command_takes_the_file_as_positional_or_from(tmp_path, capsys):
    path = tmp_path / "c.txt"
    path.write_text("1,2,3\n4,5,6\n")
    reports = []
    for how in ([path], ["--from", path], [path, "--from", path]):
        rc, stdout, _ = run_cli(capsys, *how, "--json")
        assert rc == 0
        reports.append(json.loads(stdout))
    assert reports[0] == reports[1] == reports[2] and reports[0]["sids"] == 2
    rc, _, err = run_cli(capsys)
    assert rc == 2 and "no catalog file" in err and "--from PATH" in err
    rc, _, err = run_cli(capsys, path, "--from", tmp_path / "other.txt")
    assert rc == 2 and "two catalog files" in err


def test_the_one_key_decoder(tmp_path):
    """Comma keys are codes, comma-free keys packed (mixed in one file too); a bad key is named."""
    codes, was_packed = decode_sid_keys(["90121", "1,2,3", str(pack_sid((5, 6, 7), 16))], 3, None)
    assert was_packed and codes.tolist() == [[0, 11, 9], [1, 2, 3], [0, 0, 1383]]
    codes, _ = decode_sid_keys([str(pack_sid((5, 6, 7), 16))], 3, 16)
    assert codes.tolist() == [[5, 6, 7]]
    with pytest.raises(RowError) as info:
        decode_sid_keys(["1,2,3", str(8192**3)], 3, None)
    assert info.value.index == 1 and "exceeds 8192^3 - 1" in info.value.why
    with pytest.raises(RowError) as info:
        decode_sid_keys(["7", "1,2"], 3, None)
    assert info.value.index == 1 and "expected 3 codes" in info.value.why
    with pytest.raises(ValueError, match="does not fit a packed key base 8192"):
        pack_sid((1, 8192, 3))
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps({"90121": [], "1,2,3": []}))
    np.testing.assert_array_equal(load_catalog(path).codes, [[0, 11, 9], [1, 2, 3]])
    with pytest.raises(CatalogError, match="packed-base 1 must be at least 2"):
        load_catalog(path, packed_base=1)
