"""The probe's comparison: the same beams with scores within the tolerance are the same
answer; a moved score, a lost or new beam (other than a near tie at the cut-off) or another
catalog is a change, logged with its time."""

from __future__ import annotations

import pytest

from harness.soak.probe import Answer, Probe, diff, parse

REF = Answer(("<a>", "<b>", "<c>"), (-1.0, -2.0, -3.0), "h1")


def test_the_same_answer_within_the_tolerance():
    assert diff(REF, REF, 1e-4) == []
    assert diff(REF, Answer(REF.beams, (-1.00001, -2.0, -3.00002), "h1"), 1e-4) == []


def test_a_near_tie_at_the_cut_off_may_swap():
    tie = Answer(("<a>", "<b>", "<d>"), (-1.0, -2.0, -3.00001), "h1")
    assert diff(REF, tie, 1e-4) == []
    assert diff(REF, tie, 0.0) != []  # exactly: the beam set changed


@pytest.mark.parametrize(
    "new,word",
    [
        (Answer(REF.beams, (-1.0, -2.5, -3.0), "h1"), "score of <b>"),
        (Answer(("<a>", "<x>", "<b>"), (-1.0, -1.5, -2.0), "h1"), "lost beam <c>"),
        (Answer(("<a>", "<x>", "<b>"), (-1.0, -1.5, -2.0), "h1"), "new beam <x>"),
        (Answer(REF.beams, REF.scores, "h2"), "catalog_hash h1 -> h2"),
        (Answer(REF.beams[:2], REF.scores[:2], "h1"), "3 beams -> 2"),
    ],
)
def test_changes_are_named(new, word):
    assert any(line.startswith(word) for line in diff(REF, new, 1e-4)), diff(REF, new, 1e-4)


def test_the_probe_logs_changes_and_errors_with_their_time():
    p = Probe(1e-4)
    assert p.check(0.0, REF) and p.check(30.0, REF)
    moved = Answer(REF.beams, (-1.0, -2.5, -3.0), "h1")
    assert not p.check(60.0, moved)
    assert not p.check(90.0, None, "HTTP 500: boom")
    s = p.summary
    assert (s["sent"], s["changes"], s["errors"]) == (4, 1, 1)
    assert s["change_log"][0]["t_s"] == 60.0 and s["error_log"][0]["error"] == "HTTP 500: boom"


def test_the_largest_score_move_is_kept_within_the_tolerance_too():
    p = Probe(0.5)
    assert p.check(0, REF) and p.summary["max_score_move"] == 0.0
    swapped = Answer(("<a>", "<c>", "<b>"), (-1.0, -2.6, -2.7), "h1")  # <b> -0.7, <c> +0.4
    assert not p.check(1, swapped)  # <b> moved past the tolerance
    assert p.check(2, Answer(REF.beams, (-1.1, -2.0, -3.0), "h1"))
    assert p.summary["max_score_move"] == pytest.approx(0.7)
    assert p.summary["tolerance"] == 0.5


def test_per_catalog_references():
    p = Probe(1e-4, key="catalog")
    other = Answer(("<x>", "<y>", "<z>"), (-1.0, -2.0, -3.0), "h2")
    assert p.check(0, REF) and p.check(1, other) and p.check(2, REF) and p.check(3, other)
    assert not p.check(4, Answer(("<x>", "<y>", "<q>"), (-1.0, -2.0, -2.5), "h2"))


def test_parse_reads_a_chat_answer_and_refuses_one_without_scores():
    data = {"catalog_hash": "h1", "choices": [
        {"message": {"content": "<a>"}, "sglext": {"sequence_score": -1.0}},
        {"message": {"content": "<b>"}, "sglext": {"sequence_score": -2.0}},
    ]}  # fmt: skip
    assert parse(data) == Answer(("<a>", "<b>"), (-1.0, -2.0), "h1")
    with pytest.raises(ValueError):
        parse({"choices": [{"message": {"content": "<a>"}}]})
    with pytest.raises(ValueError):
        parse({"choices": []})
