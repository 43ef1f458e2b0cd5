"""BeamColumns: a request's beams held column by column, read as the list of
BeamResult they stand for; the engine returns them, the pipe and the answer encoders take the
columns as they are."""

from __future__ import annotations

import pytest
from prefill_helpers import make_engine, make_prompts

from flashrec.engine.request import BeamColumns, BeamResult, GenRequest, GenResult


def _cols(text="") -> BeamColumns:
    return BeamColumns(
        [[5, 6, 9], [5, 7, 9], [4, 4]], [-1.0, -2.5, -3.0], [-0.5, -1.25, -1.5],
        ["stop", "stop", "length"], text,
    )  # fmt: skip


def test_columns_read_as_the_list_of_beams():
    made = []

    def text(ids):
        made.append(list(ids))
        return "-".join(map(str, ids))

    cols = _cols(text)
    want = [
        BeamResult([5, 6, 9], -1.0, -0.5, "stop"),
        BeamResult([5, 7, 9], -2.5, -1.25, "stop"),
        BeamResult([4, 4], -3.0, -1.5, "length"),
    ]
    assert len(cols) == 3 and cols == want and want == cols and list(cols) == want
    assert cols[-1] == want[2] and cols[1:] == want[1:] and cols[0] is cols[0]
    with pytest.raises(IndexError):
        cols[3]
    assert made == []  # no text is made until one is read
    assert cols[1].text == "5-7-9" and cols.texts() == ["5-6-9", "5-7-9", "4-4"]
    assert cols == _cols("other text") and cols != _cols()[:2] and cols != "x"
    assert (
        GenResult("r", cols, 10).completion_tokens
        == 8
        == GenResult("r", want, 10).completion_tokens
    )
    assert _cols("fixed").texts() == ["fixed"] * 3
    back = BeamColumns.from_beams(want, text)
    assert back == cols and back.texts() == cols.texts() and BeamColumns.from_beams(cols) is cols
    with pytest.raises(ValueError, match="different lengths"):
        BeamColumns([[1]], [0.0], [], ["stop"])
    assert BeamColumns([], [], [], []) == [] and not BeamColumns([], [], [], [])


def test_the_engine_returns_columns_equal_to_its_beams(tiny_model):
    """The engine's results: columns, best first, each beam's finish reason from its last
    token, the text from the SID table, the same values as the beams they stand for."""
    eng = make_engine(tiny_model)
    prompts = make_prompts(eng, (3, 20))
    reqs = [GenRequest(f"r{i}", ids, n=8, max_tokens=4) for i, ids in enumerate(prompts)]
    end = eng.layout.sid_end
    for res in eng.generate(reqs):
        cols = res.beams
        assert isinstance(cols, BeamColumns) and len(cols) == 8
        assert cols.sequence_scores == sorted(cols.sequence_scores, reverse=True)
        for b, reason in zip(cols, cols.finish_reasons):
            assert reason == ("stop" if b.token_ids[-1] == end else "length")
            assert type(b.cum_logprob) is float and all(type(t) is int for t in b.token_ids)
        assert cols.texts() == [b.text for b in cols] and cols.texts()[0].startswith("<s_a_")
