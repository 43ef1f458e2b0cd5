"""harness.load.sids: parsing, validity, duplicates, quality metrics, catalog readers."""

from __future__ import annotations

import json
import math

import pytest

from harness.load.sids import (
    SidChecker,
    load_catalog_sids,
    parse_sid,
    parse_sid_list,
    quality,
)


def test_parse_sid():
    assert parse_sid("<s_a_12><s_b_7><s_c_301><|sid_end|>", 3) == (12, 7, 301)
    assert parse_sid("<|sid_begin|><s_a_1><s_b_2><s_c_3>", 3) == (1, 2, 3)
    assert parse_sid("<s_a_1><s_b_2>", 3) is None  # too few levels
    assert parse_sid("<s_a_1><s_c_2><s_b_3>", 3) is None  # out of order
    assert parse_sid("<s_a_1><s_b_2><s_c_3> hello", 3) is None  # junk
    assert parse_sid("<s_a_1><s_b_2><s_c_3><s_d_4>", 3) is None


def test_parse_sid_list():
    text = "<|sid_begin|><s_a_1><s_b_2><s_c_3><|sid_end|>, <s_a_4><s_b_5><s_c_6> <s_a_9><s_b_1>"
    assert parse_sid_list(text, 3) == [(1, 2, 3), (4, 5, 6)]


def test_checker_counts_invalid_and_duplicates():
    checker = SidChecker(3, {(1, 2, 3), (4, 5, 6)})
    beams = [
        "<s_a_1><s_b_2><s_c_3><|sid_end|>",
        "<s_a_1><s_b_2><s_c_3><|sid_end|>",
        "<s_a_7><s_b_7><s_c_7><|sid_end|>",
        "<s_a_4><s_c_5>",
        "<s_a_4><s_b_5><s_c_6>",
    ]
    c = checker.check(beams)
    assert (c.beams, c.invalid, c.duplicates) == (5, 2, 1)
    assert c.ranked == ((1, 2, 3), (7, 7, 7), (4, 5, 6))
    assert c.top1 == "1-2-3"
    assert SidChecker(3).check(beams).invalid == 1  # without a catalog: format only


def test_quality_metrics():
    ranked = ((1, 1, 1), (2, 2, 2), (3, 3, 3))
    q = quality(ranked, ((2, 2, 2), (9, 9, 9)), [1, 3])
    assert q["hit@1"] == 0 and q["hit@3"] == 1
    assert q["recall@3"] == 0.5 and q["mrr@3"] == 0.5
    assert q["ndcg@3"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))


def test_catalog_readers(tmp_path):
    comma = tmp_path / "c.json"
    comma.write_text(json.dumps({"1,2,3": 0, "4,5,6": 1}))
    lists = tmp_path / "l.json"
    lists.write_text(json.dumps([[1, 2, 3], [4, 5, 6]]))
    text = tmp_path / "t.txt"
    text.write_text("# sids\n1,2,3\n<s_a_4><s_b_5><s_c_6>\n")
    packed = tmp_path / "sid2pid.json"  # RecIF packs base 8192, or the base the reader is told
    packed.write_text(json.dumps({str((1 * 8192 + 2) * 8192 + 3): [], "4,5,6": []}))
    packed64 = tmp_path / "p64.json"
    sids = [(1, 2, 3), (4, 5, 6)]
    packed64.write_text(json.dumps({str((a * 64 + b) * 64 + c): [] for a, b, c in sids}))
    for p in (comma, lists, text, packed):
        assert load_catalog_sids(p) == {(1, 2, 3), (4, 5, 6)}
    assert load_catalog_sids(packed64, packed_base=64) == {(1, 2, 3), (4, 5, 6)}
