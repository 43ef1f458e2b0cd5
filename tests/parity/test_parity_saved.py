"""A parity server's answers on disk (harness.parity.saved): read back only under the same key
and only when every case was answered."""

from __future__ import annotations

from harness.parity.compare import Beam
from harness.parity.saved import asked_key, load, save


def test_saved_answers_round_trip_and_refusals(tmp_path):
    path = tmp_path / "answers" / "x.json"
    answers = {
        ("chat", 0, 2): [Beam((1, 2, 3), -0.5, "a"), Beam((1, 2, 4), -1.25, "b")],
        ("generate", 1, 1): [Beam((7,), -0.125, "")],
    }
    key = asked_key(args={"dtype": "float32"}, ns=[1, 2])
    assert key == asked_key(ns=[1, 2], args={"dtype": "float32"})  # order-free
    assert key != asked_key(args={"dtype": "bfloat16"}, ns=[1, 2])
    save(path, key, answers, {"url": "http://127.0.0.1:1", "max_tokens": 4})
    got, meta = load(path, key)
    assert got == answers and meta["max_tokens"] == 4 and meta["saved_at"] > 0
    assert load(path, asked_key(args={"dtype": "bfloat16"}, ns=[1, 2])) is None  # other cases
    assert load(tmp_path / "missing.json", key) is None
    # a case that failed (the reference out of memory, say) is asked again: nothing read back
    save(path, key, {**answers, ("chat", 1, 2): "RuntimeError: HTTP 500"}, {})
    assert load(path, key) is None
    path.write_text("{not json")
    assert load(path, key) is None
    assert not list(path.parent.glob("*.tmp"))
