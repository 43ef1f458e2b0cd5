"""SID layout: inference from a tokenizer, the --sid argument, and the catalog cross-check."""

from __future__ import annotations

import logging

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from flashrec.sid.layout import (
    SidLayout,
    SidLayoutError,
    code_token,
    infer_sid_layout,
    parse_sid_arg,
    resolve_sid_layout,
)

BASE = ["[UNK]", "hello", "world", "<|im_start|>"]


def sid_tokens(levels: int, size: int) -> list[str]:
    codes = [code_token(level, code) for level in range(levels) for code in range(size)]
    return [*codes, "<|sid_begin|>", "<|sid_end|>"]


def make_tokenizer(added: list[str], base: list[str] = BASE) -> PreTrainedTokenizerFast:
    """WordLevel tokenizer over ``base`` with ``added`` appended as added tokens, in order."""
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(base)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_tokens(added)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_infer_from_added_tokens() -> None:
    tok = make_tokenizer(sid_tokens(3, 5))
    layout = infer_sid_layout(tok)
    assert layout == SidLayout(
        code_start=4, codebook_size=5, num_levels=3, sid_begin=19, sid_end=20
    )
    assert layout.level_range(1) == (9, 14)
    assert layout.sid_range == (4, 21)
    assert layout.code_to_token(2, 3) == tok.convert_tokens_to_ids("<s_c_3>")
    assert layout.token_to_code(tok.convert_tokens_to_ids("<s_b_4>")) == (1, 4)
    text = layout.format_sid([1, 4, 0])
    assert text == "<|sid_begin|><s_a_1><s_b_4><s_c_0><|sid_end|>"
    assert tok(text).input_ids == [19, 5, 13, 14, 20]


def test_infer_from_base_vocab() -> None:
    """SID tokens stored in the model vocabulary rather than as added tokens."""
    tok = make_tokenizer([], base=BASE + sid_tokens(2, 3))
    assert infer_sid_layout(tok) == SidLayout(4, 3, 2, 10, 11)
    assert infer_sid_layout(tok.backend_tokenizer) == SidLayout(4, 3, 2, 10, 11)


def test_sid_arg_roundtrip() -> None:
    layout = SidLayout(code_start=151669, codebook_size=8192, num_levels=3, sid_begin=176245,
                       sid_end=176246)  # fmt: skip
    assert layout.to_arg() == "151669:176245/8192,begin=176245,end=176246"
    assert parse_sid_arg(layout.to_arg()) == layout
    assert parse_sid_arg("100:124/8") == SidLayout(100, 8, 3, 124, 125)
    assert parse_sid_arg("100:124/8,end=7,begin=5") == SidLayout(100, 8, 3, 5, 7)


@pytest.mark.parametrize(
    "text",
    ["100:125/8", "124:100/8", "100:124", "a:b/c", "100:124/0", "100:124/8,begin=110",
     "100:124/8,foo=1", "100:124/8,begin=3,begin=4", "100:124/8,begin=x", "100:124/8,end=124"],
)  # fmt: skip
def test_sid_arg_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="--sid|sid_begin|sid_end|same token"):
        parse_sid_arg(text)


def test_no_sid_tokens() -> None:
    with pytest.raises(SidLayoutError, match=r"no <s_a_0> SID tokens.*--sid START:END/SIZE"):
        infer_sid_layout(make_tokenizer(["<extra>"]))


@pytest.mark.parametrize(
    ("added", "offender"),
    [
        # <s_a_1> before <s_a_0>
        (["<s_a_1>", "<s_a_0>", "<s_b_0>", "<s_b_1>", "<|sid_begin|>", "<|sid_end|>"], "<s_a_1>"),
        # a foreign token between the codebooks
        (["<s_a_0>", "<s_a_1>", "<x>", "<s_b_0>", "<s_b_1>", "<|sid_begin|>", "<|sid_end|>"],
         "<s_b_0>"),
        # a missing code
        (["<s_a_0>", "<s_a_1>", "<s_b_0>", "<|sid_begin|>", "<|sid_end|>"], "<s_b_1>"),
        # a level larger than level a
        (["<s_a_0>", "<s_b_0>", "<s_b_1>", "<|sid_begin|>", "<|sid_end|>"], "<s_b_1>"),
        # a skipped level
        (["<s_a_0>", "<s_c_0>", "<|sid_begin|>", "<|sid_end|>"], "<s_b_0>"),
        # delimiters swapped, missing, or not right after the codes
        (["<s_a_0>", "<s_a_1>", "<|sid_end|>", "<|sid_begin|>"], "<|sid_begin|>"),
        (["<s_a_0>", "<s_a_1>", "<|sid_begin|>"], "<|sid_end|>"),
        (["<s_a_0>", "<s_a_1>", "<x>", "<|sid_begin|>", "<|sid_end|>"], "<|sid_begin|>"),
    ],
)  # fmt: skip
def test_broken_layout_names_token(added: list[str], offender: str) -> None:
    with pytest.raises(SidLayoutError) as info:
        infer_sid_layout(make_tokenizer(added))
    assert offender in str(info.value)


def test_resolve_logs_where_the_layout_came_from(caplog: pytest.LogCaptureFixture) -> None:
    tok = make_tokenizer(sid_tokens(3, 4))
    log = logging.getLogger("flashrec.test_sid")
    with caplog.at_level(logging.INFO, logger=log.name):
        layout = resolve_sid_layout(tok, None, log)
    assert layout.num_levels == 3
    assert [r.getMessage() for r in caplog.records] == [f"Inferred --sid {layout.to_arg()}"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=log.name):
        override = resolve_sid_layout(tok, "4:12/4", log)
    assert override == SidLayout(4, 4, 2, 12, 13)
    assert [r.getMessage() for r in caplog.records] == [f"Using --sid {override.to_arg()}"]


def test_layout_bounds() -> None:
    layout = SidLayout(10, 4, 2, 18, 19)
    with pytest.raises(SidLayoutError):
        layout.level_range(2)
    with pytest.raises(SidLayoutError):
        layout.code_to_token(0, 4)
    with pytest.raises(SidLayoutError):
        layout.token_to_code(18)
    with pytest.raises(SidLayoutError):
        layout.format_sid([1, 2, 3])
    with pytest.raises(SidLayoutError):
        SidLayout(10, 4, 2, 12, 19)  # sid_begin inside the code range
