"""Where the semantic-ID tokens live in the vocabulary.

OneRec convention: the tokenizer holds ``L`` codebooks of ``K`` codes each as tokens with
contiguous ids, level by level, followed by the two delimiters::

    code_start                                  code_start + L*K
    |<s_a_0> .. <s_a_K-1>|<s_b_0> .. <s_b_K-1>|..|<|sid_begin|>|<|sid_end|>|
      level 0              level 1                 sid_begin     sid_end = sid_begin + 1

A SID is written ``<|sid_begin|><s_a_12><s_b_7><s_c_301><|sid_end|>``. The layout is read off
the tokenizer (``infer_sid_layout``) or given on the command line as
``--sid START:END/SIZE[,begin=ID][,end=ID]`` (``parse_sid_arg``).
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SID_BEGIN_TOKEN = "<|sid_begin|>"
SID_END_TOKEN = "<|sid_end|>"
LEVEL_LETTERS = string.ascii_lowercase
CODE_TOKEN_RE = re.compile(r"<s_([a-z])_(\d+)>")
_SID_ARG_RE = re.compile(r"\s*(\d+)\s*:\s*(\d+)\s*/\s*(\d+)\s*")

_log = logging.getLogger("flashrec")


class SidLayoutError(ValueError):
    """The SID layout is missing, malformed, or disagrees with the catalog."""


def code_token(level: int, code: int) -> str:
    """Token text of ``code`` in codebook ``level``: ``code_token(1, 7) == "<s_b_7>"``."""
    return f"<s_{LEVEL_LETTERS[level]}_{code}>"


@dataclass(frozen=True)
class SidLayout:
    """Token ids of the SID codebooks and delimiters (see the module docstring)."""

    code_start: int
    codebook_size: int
    num_levels: int
    sid_begin: int
    sid_end: int

    def __post_init__(self) -> None:
        if self.code_start < 0 or self.codebook_size < 1 or self.num_levels < 1:
            raise SidLayoutError(
                f"bad SID layout: code_start={self.code_start}, "
                f"codebook_size={self.codebook_size}, num_levels={self.num_levels}"
            )
        if self.num_levels > len(LEVEL_LETTERS):
            raise SidLayoutError(f"at most {len(LEVEL_LETTERS)} SID levels, got {self.num_levels}")
        for name in ("sid_begin", "sid_end"):
            tok = getattr(self, name)
            if tok < 0 or self.code_start <= tok < self.code_end:
                raise SidLayoutError(
                    f"{name}={tok} must be a token id outside the code range "
                    f"[{self.code_start}, {self.code_end})"
                )
        if self.sid_begin == self.sid_end:
            raise SidLayoutError(f"sid_begin and sid_end are the same token id {self.sid_begin}")

    @property
    def code_end(self) -> int:
        """One past the last code token id: ``code_start + num_levels * codebook_size``."""
        return self.code_start + self.num_levels * self.codebook_size

    @property
    def sid_range(self) -> tuple[int, int]:
        """``[code_start, end)`` covering every code token and both delimiters.

        NOTE: with the conventional layout this is ``[code_start, sid_end + 1)``; an overridden
        layout whose delimiters sit below ``code_start`` is not covered by it.
        """
        return self.code_start, max(self.code_end, self.sid_begin + 1, self.sid_end + 1)

    def level_range(self, level: int) -> tuple[int, int]:
        """``[start, end)`` token ids of codebook ``level``."""
        self._check_level(level)
        start = self.code_start + level * self.codebook_size
        return start, start + self.codebook_size

    def code_to_token(self, level: int, code: int) -> int:
        """Token id of ``code`` in codebook ``level``."""
        self._check_level(level)
        if not 0 <= code < self.codebook_size:
            raise SidLayoutError(f"code {code} outside [0, {self.codebook_size})")
        return self.code_start + level * self.codebook_size + code

    def token_to_code(self, token: int) -> tuple[int, int]:
        """``(level, code)`` of a code token id."""
        if not self.code_start <= token < self.code_end:
            raise SidLayoutError(
                f"token {token} is not a SID code (range [{self.code_start}, {self.code_end}))"
            )
        return divmod(token - self.code_start, self.codebook_size)

    def to_arg(self) -> str:
        """The ``--sid`` text of this layout; ``parse_sid_arg(x.to_arg()) == x``."""
        return (
            f"{self.code_start}:{self.code_end}/{self.codebook_size},"
            f"begin={self.sid_begin},end={self.sid_end}"
        )

    def format_sid(self, codes: Sequence[int]) -> str:
        """Text form of a (possibly partial) SID, delimiters included, for logs and tests."""
        if len(codes) > self.num_levels:
            raise SidLayoutError(f"{len(codes)} codes for a {self.num_levels}-level layout")
        for code in codes:
            if not 0 <= int(code) < self.codebook_size:
                raise SidLayoutError(f"code {code} outside [0, {self.codebook_size})")
        body = "".join(code_token(level, int(code)) for level, code in enumerate(codes))
        return f"{SID_BEGIN_TOKEN}{body}{SID_END_TOKEN}"

    def _check_level(self, level: int) -> None:
        if not 0 <= level < self.num_levels:
            raise SidLayoutError(f"level {level} outside [0, {self.num_levels})")


def parse_sid_arg(text: str) -> SidLayout:
    """Parse ``START:END/SIZE[,begin=ID][,end=ID]``; begin/end default to END and END+1."""
    head, *opts = text.split(",")
    match = _SID_ARG_RE.fullmatch(head)
    if match is None:
        raise SidLayoutError(f"--sid {text!r}: expected START:END/SIZE[,begin=ID][,end=ID]")
    start, end, size = (int(g) for g in match.groups())
    if end <= start or size < 1 or (end - start) % size:
        raise SidLayoutError(
            f"--sid {text!r}: END-START = {end - start} must be a positive multiple of "
            f"SIZE = {size}"
        )
    ids = {"begin": end, "end": end + 1}
    seen: set[str] = set()
    for opt in opts:
        key, sep, value = (part.strip() for part in opt.partition("="))
        if not sep or key not in ids or key in seen or not value.isdigit():
            raise SidLayoutError(
                f"--sid {text!r}: bad option {opt!r} (expected begin=ID or end=ID, once each)"
            )
        seen.add(key)
        ids[key] = int(value)
    return SidLayout(start, size, (end - start) // size, ids["begin"], ids["end"])


def _vocab_of(tokenizer: Any) -> Mapping[str, int]:
    """token -> id over the base vocabulary and the added tokens."""
    if isinstance(tokenizer, Mapping):
        return tokenizer
    vocab = dict(tokenizer.get_vocab())
    if hasattr(tokenizer, "get_added_vocab"):
        vocab.update(tokenizer.get_added_vocab())
    return vocab


def infer_sid_layout(tokenizer: Any) -> SidLayout:
    """Read the SID layout off a tokenizer (HF tokenizer, ``tokenizers.Tokenizer`` or a vocab).

    Works through ``get_vocab()``/``get_added_vocab()``, so the SID tokens may live in the base
    vocabulary or among the added tokens. Checks that every codebook ``a, b, c, ...`` holds
    codes ``0..K-1`` with the same ``K``, that all code ids are contiguous and in strict order,
    and that ``<|sid_begin|>``, ``<|sid_end|>`` follow right after; raises ``SidLayoutError``
    naming the first offending token otherwise.
    """
    vocab = _vocab_of(tokenizer)
    hint = "pass --sid START:END/SIZE,begin=ID,end=ID"
    levels: dict[int, dict[int, int]] = {}
    for tok, tid in vocab.items():
        match = CODE_TOKEN_RE.fullmatch(tok)
        if match:
            level = LEVEL_LETTERS.index(match.group(1))
            levels.setdefault(level, {})[int(match.group(2))] = int(tid)
    if 0 not in levels.get(0, {}):
        raise SidLayoutError(f"no <s_a_0> SID tokens in the tokenizer; {hint}")
    num_levels = max(levels) + 1
    size = max(levels[0]) + 1
    code_start = levels[0][0]
    for level in range(num_levels):
        codes = levels.get(level, {})
        for code in range(max(size, max(codes, default=-1) + 1)):
            tok = code_token(level, code)
            if code >= size:
                raise SidLayoutError(
                    f"SID token {tok} exceeds the codebook size {size} of level 'a'; {hint}"
                )
            if code not in codes:
                raise SidLayoutError(f"SID token {tok} is missing from the tokenizer; {hint}")
            expected = code_start + level * size + code
            if codes[code] != expected:
                raise SidLayoutError(
                    f"SID token {tok} has id {codes[code]}, expected {expected}: code tokens "
                    f"must be contiguous and in order from <s_a_0> = {code_start}; {hint}"
                )
    code_end = code_start + num_levels * size
    for tok, expected in ((SID_BEGIN_TOKEN, code_end), (SID_END_TOKEN, code_end + 1)):
        if tok not in vocab:
            raise SidLayoutError(f"{tok} is missing from the tokenizer; {hint}")
        if vocab[tok] != expected:
            raise SidLayoutError(
                f"{tok} has id {vocab[tok]}, expected {expected} (right after the last code "
                f"token); {hint}"
            )
    return SidLayout(code_start, size, num_levels, code_end, code_end + 1)


def resolve_sid_layout(
    tokenizer: Any, sid_arg: str | None, log: logging.Logger = _log
) -> SidLayout:
    """The layout to serve with: ``--sid`` when given, else inferred from the tokenizer. Logs
    one line (``Inferred --sid ...`` or ``Using --sid ...``). A catalog is then read under it,
    which refuses SIDs with more codes than its levels (``flashrec.sid.catalog``)."""
    if sid_arg:
        layout = parse_sid_arg(sid_arg)
        log.info("Using --sid %s", layout.to_arg())
    else:
        layout = infer_sid_layout(tokenizer)
        log.info("Inferred --sid %s", layout.to_arg())
    return layout
