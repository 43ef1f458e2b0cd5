"""SidText: the text of a beam's tokens from the SID table, with the tokenizer only for
tokens outside it."""

from __future__ import annotations

from flashrec.engine.request import SidText


class _Layout:
    sid_range = (100, 106)  # begin, four codes, end


class _Tokenizer:
    def __init__(self) -> None:
        self.decoded: list[list[int]] = []

    def convert_ids_to_tokens(self, ids):
        return [f"<t{i}>" for i in ids]

    def decode(self, tokens, skip_special_tokens=False):
        self.decoded.append(list(tokens))
        return "|".join(f"d{t}" for t in tokens)


def test_sid_tokens_come_from_the_table_without_a_tokenizer_call():
    tok = _Tokenizer()
    text = SidText(tok, _Layout())
    assert text([100, 103, 101, 105]) == "<t100><t103><t101><t105>"
    assert text([]) == ""
    assert tok.decoded == []


def test_a_token_outside_the_sid_range_decodes_the_whole_beam():
    tok = _Tokenizer()
    text = SidText(tok, _Layout())
    assert text([100, 7, 105]) == "d100|d7|d105"
    assert tok.decoded == [[100, 7, 105]]


def test_without_a_tokenizer_the_text_is_empty():
    text = SidText(None, _Layout())
    assert text([100, 101]) == ""
    assert text([]) == ""


def test_from_table_makes_the_same_text_and_loads_the_tokenizer_on_first_need(tiny_model):
    """A SidText over a table read elsewhere (a respond worker's): SID tokens from the table
    without a tokenizer; a beam with other tokens loads it from the model path once."""
    from flashrec.config import EngineConfig
    from flashrec.engine.engine import Engine

    cfg = EngineConfig(model_path=str(tiny_model), sid_vocab_file=str(tiny_model / "catalog.json"))
    full = Engine(cfg).scheduler._text  # the engine's own, over its tokenizer
    copy = SidText.from_table(full.table, str(tiny_model))
    sid = list(full.table)[:4]
    assert copy(sid) == full(sid) and copy.tokenizer is None
    other = [5, 6, *sid[:2]]  # tokens outside the SID table
    assert copy(other) == full(other) != "" and copy.tokenizer is not None
    assert SidText.from_table(full.table, None)(other) == ""


def test_texts_of_many_rows_are_each_rows_text():
    """``texts`` (one pass over equal-length rows) gives what a call per row gives, for rows of
    one length, of mixed lengths, empty rows and a row with a token outside the table (only
    that row goes to the tokenizer)."""
    tok = _Tokenizer()
    text = SidText(tok, _Layout())
    same = [[100, 101, 102, 105], [100, 104, 103, 105], [100, 101, 101, 105]]
    mixed = [[100, 101], [100, 102, 105], []]
    outside = [[100, 101, 105], [100, 7, 105], [100, 102, 105]]
    for rows in (same, mixed, [[], []], [], outside):
        tok.decoded.clear()
        assert text.texts(rows) == [text(r) for r in rows]
    assert text.texts(same)[1] == "<t100><t104><t103><t105>"
    tok.decoded.clear()
    text.texts(outside)
    assert tok.decoded == [[100, 7, 105]]
