"""Prompt encoding: ``encode_text`` takes the Rust backend's offset-free encoder where it gives
what ``tokenizer.encode(text, add_special_tokens=False)`` gives, and the HF call elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizer_helpers import mixed_texts, qwen_like_tokenizer
from transformers import AutoTokenizer

from flashrec.prompt import encode_text


def _hf(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _no_hf_call(tok) -> None:
    """Make the HF call fail on this tokenizer object, so a test sees which path ran."""

    def refuse(*_a, **_kw):
        raise AssertionError("the HF encode ran")

    tok.encode = refuse


@pytest.fixture(params=["synthetic", "qwen-like"])
def tok(request, tiny_checkpoint: Path):
    if request.param == "synthetic":
        return AutoTokenizer.from_pretrained(tiny_checkpoint)
    return qwen_like_tokenizer()


def test_same_ids_as_the_hf_call(tok) -> None:
    texts = mixed_texts(2)
    if tok.chat_template:  # the rendered chat prompts the server encodes
        texts += [
            tok.apply_chat_template(
                [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
            )
            for t in texts[:20]
        ]
    want = [_hf(tok, t) for t in texts]
    _no_hf_call(tok)  # from here on only the backend's encoder can answer
    got = [encode_text(tok, t) for t in texts]
    assert got == want
    assert all(type(i) is int for ids in got for i in ids)


def test_the_hf_call_where_the_backend_is_set_otherwise(tok) -> None:
    """Truncation or padding left on the backend by another call, or special tokens split:
    the HF call, which sets the backend for a plain encode itself."""
    text = "<|im_start|>" + "the quick brown fox " * 20
    full = _hf(tok, text)
    tok.backend_tokenizer.enable_truncation(8)
    assert encode_text(tok, text) == full and len(full) > 8
    tok.backend_tokenizer.no_truncation()
    tok.backend_tokenizer.enable_padding(length=len(full) + 16)
    assert encode_text(tok, text) == full
    tok.backend_tokenizer.no_padding()
    tok.split_special_tokens = True
    split = _hf(tok, text)
    assert split != full  # the added token is encoded as its characters
    assert encode_text(tok, text) == split


def test_a_tokenizer_without_a_rust_backend_is_called_as_it_is() -> None:
    class Plain:
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            assert add_special_tokens is False
            return [ord(c) for c in text]

    assert encode_text(Plain(), "ab") == [97, 98]
