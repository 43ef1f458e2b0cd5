"""Byte-level tokenizer with ChatML specials and semantic-ID tokens, written as HF files.

Token id layout (K = codebook_size, L = num_levels)::

    0 .. 255                    one token per byte (ByteLevel alphabet, no merges)
    256 .. 260                  <|endoftext|> <|im_start|> <|im_end|> <think> </think>
    261 .. 261+L*K-1            <s_a_0> .. <s_a_{K-1}> <s_b_0> .. (level-major, contiguous)
    261+L*K, 261+L*K+1          <|sid_begin|> <|sid_end|>

Every text encodes losslessly, and a byte string of n bytes is exactly n tokens.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK = ("<think>", "</think>")
SID_BEGIN, SID_END = "<|sid_begin|>", "<|sid_end|>"
EOS, PAD = "<|im_end|>", "<|endoftext|>"

# Qwen3-style ChatML. Content is a string or a list of {"type": "text", "text": ...} parts.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)


def level_letter(level: int) -> str:
    """Letter naming SID level ``level``: a, b, ..., z, then aa, ab, ... (never needed in practice)."""
    letters = string.ascii_lowercase
    return letters[level] if level < 26 else letters[level // 26 - 1] + letters[level % 26]


def sid_token(level: int, code: int) -> str:
    """Text of the token for ``code`` at ``level``, e.g. ``sid_token(1, 7) == "<s_b_7>"``."""
    return f"<s_{level_letter(level)}_{code}>"


def format_sid(codes: list[int] | tuple[int, ...]) -> str:
    """One item's SID as text: ``<|sid_begin|><s_a_12><s_b_7><s_c_301><|sid_end|>``."""
    return SID_BEGIN + "".join(sid_token(i, c) for i, c in enumerate(codes)) + SID_END


@dataclass(frozen=True)
class TokenLayout:
    """Ids of the special and SID tokens of a synthetic tokenizer."""

    codebook_size: int
    num_levels: int

    base: int = 256

    @property
    def endoftext_id(self) -> int:
        return self.base

    @property
    def eos_id(self) -> int:
        return self.base + SPECIALS.index(EOS)

    @property
    def first_code_id(self) -> int:
        return self.base + len(SPECIALS) + len(THINK)

    @property
    def sid_begin_id(self) -> int:
        return self.first_code_id + self.num_levels * self.codebook_size

    @property
    def sid_end_id(self) -> int:
        return self.sid_begin_id + 1

    @property
    def size(self) -> int:
        return self.sid_end_id + 1

    def code_id(self, level: int, code: int) -> int:
        return self.first_code_id + level * self.codebook_size + code


def _added(content: str, special: bool) -> AddedToken:
    return AddedToken(
        content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special
    )


def build_tokenizer(codebook_size: int, num_levels: int) -> Tokenizer:
    """The ``tokenizers`` object for the layout in this module's docstring."""
    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([_added(t, True) for t in SPECIALS])
    tok.add_tokens([_added(t, False) for t in THINK])
    codes = [sid_token(lv, c) for lv in range(num_levels) for c in range(codebook_size)]
    tok.add_tokens([_added(t, False) for t in codes])
    tok.add_special_tokens([_added(SID_BEGIN, True), _added(SID_END, True)])
    layout = TokenLayout(codebook_size, num_levels)
    if tok.get_vocab_size() != layout.size or tok.token_to_id(SID_END) != layout.sid_end_id:
        raise AssertionError("synthetic tokenizer ids do not match TokenLayout")
    return tok


def _byte_alphabet() -> list[str]:
    """The ByteLevel character standing for each byte 0..255 (printable bytes stand for themselves)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(shifted)}
    alphabet = [chars[b] for b in range(256)]
    if set(alphabet) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise AssertionError("ByteLevel alphabet differs from the GPT-2 byte map")
    return alphabet


def write_tokenizer(out_dir: Path, codebook_size: int, num_levels: int) -> TokenLayout:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json``."""
    tok = build_tokenizer(codebook_size, num_levels)
    tok.save(str(out_dir / "tokenizer.json"), pretty=False)
    decoder = {
        str(i): {
            "content": t.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t.special,
        }
        for i, t in sorted(tok.get_added_tokens_decoder().items())
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    special_map = {"eos_token": EOS, "pad_token": PAD}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return TokenLayout(codebook_size, num_levels)
