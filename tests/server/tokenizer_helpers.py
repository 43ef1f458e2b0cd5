"""Tokenizers and texts for the prompt-building tests: a Qwen2-shaped BPE tokenizer trained here,
and texts that mix the characters and added tokens tokenizers trip on."""

from __future__ import annotations

import random

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


def mixed_texts(seed: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = "ab \n\t.,é€😀\u0301ᄀ\u1161\u11a8<>|_"
    specials = ["<|im_start|>", "<|im_end|>", "<|sid_begin|>", "<s_a_1>", "<think>"]
    out = []
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.2:
                parts.append(rng.choice(specials))
            else:
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))))
        out.append("".join(parts))
    out += ["", " " * 500, "x" * 1000, "<|im_start|>" * 50, "e\u0301" * 200]
    return out


def qwen_like_tokenizer() -> PreTrainedTokenizerFast:
    """A Qwen2-shaped tokenizer: NFC, regex Split (isolated) + ByteLevel, BPE with merges."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(r"\s+|\w+|[^\s\w]+", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["the quick brown fox jumps over the lazy dog " * 20, "aaaa" * 200, "    " * 100]
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)
