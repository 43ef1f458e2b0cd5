"""Synthetic chat prompts: "user history" text with log-normally distributed lengths."""

from __future__ import annotations

from typing import Any

import numpy as np

MIN_TOKENS = 16
_ACTIONS = ("watched", "clicked", "liked", "shared", "skipped", "bought", "saved", "searched")
_WORDS = tuple(
    "music travel cooking comedy sports news gaming fashion pets science dance fitness beauty "
    "cars movies anime history tech art finance vlog nature food kids diy live short series".split()
)
_SYSTEM_HEAD = (
    "You are a recommender. Read the user's history and answer with the semantic "
    "IDs of the items they are most likely to engage with next. "
)


def _event(rng: np.random.Generator) -> str:
    action = _ACTIONS[rng.integers(len(_ACTIONS))]
    if action == "searched":
        words = rng.choice(len(_WORDS), size=rng.integers(1, 4), replace=False)
        return 'searched "' + " ".join(_WORDS[w] for w in words) + '"'
    tag = _WORDS[rng.integers(len(_WORDS))]
    return f"{action} item {int(rng.integers(0, 1_000_000))} ({tag})"


class _Measure:
    """Cuts text to an exact length in bytes, or in tokens of a tokenizer."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def length(self, text: str) -> int:
        if self.tokenizer is None:
            return len(text.encode())
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def cut(self, text: str, n: int) -> str:
        if self.tokenizer is None:
            return text.encode()[:n].decode(errors="ignore")  # text is ASCII: exact
        ids = self.tokenizer.encode(text, add_special_tokens=False)[:n]
        return self.tokenizer.decode(ids)


def _fill(rng: np.random.Generator, head: str, n: int, measure: _Measure, sep: str) -> str:
    """``head`` followed by random events until at least ``n`` units, cut to exactly ``n``."""
    events: list[str] = []
    size, want = len(head), n  # want: bytes to generate before measuring
    while True:
        while size < want:
            events.append(_event(rng))
            size += len(events[-1]) + len(sep)
        text = head + sep.join(events)
        have = measure.length(text)
        if have >= n:
            return measure.cut(text, n)
        want = size * n // max(have, 1) + 16  # scale up by the measured bytes-per-unit


def synth_system_prompt(num_tokens: int, seed: int = 0, tokenizer: Any = None) -> str:
    """The system prompt of a prompt set: ``num_tokens`` long, a function of ``seed`` only."""
    rng = np.random.default_rng([seed, 0x5157])
    return _fill(
        rng, _SYSTEM_HEAD + "Known catalog themes: ", num_tokens, _Measure(tokenizer), ", "
    )


def synth_prompts(
    num: int,
    *,
    median_tokens: int,
    spread: float = 0.25,
    seed: int = 0,
    system_prompt_tokens: int = 0,
    tokenizer: Any = None,
) -> list[list[dict]]:
    """``num`` chat conversations ``[system?, user]`` for recommendation requests.

    The user text's length is log-normal (median ``median_tokens``, sigma ``spread``, at least
    16), measured in bytes (= tokens of the synthetic byte-level tokenizer) or, with
    ``tokenizer``, in its tokens. Prompt ``i`` depends only on ``(seed, i)``, so a longer set
    extends a shorter one. The system message (only when ``system_prompt_tokens > 0``) is the same
    for every prompt of the set.
    """
    measure = _Measure(tokenizer)
    system = None
    if system_prompt_tokens > 0:
        system = {
            "role": "system",
            "content": synth_system_prompt(system_prompt_tokens, seed, tokenizer),
        }
    prompts = []
    for i in range(num):
        rng = np.random.default_rng([seed, 0x7573, i])
        n = max(MIN_TOKENS, round(median_tokens * float(np.exp(spread * rng.standard_normal()))))
        user = {"role": "user", "content": _fill(rng, "User history: ", n, measure, "; ")}
        prompts.append([system, user] if system else [user])
    return prompts
