"""SidText: the text of a beam's tokens from the SID table, with the tokenizer only for
tokens outside it."""

from __future__ import annotations

from flashrec.engine.scheduler import SidText


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
