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
