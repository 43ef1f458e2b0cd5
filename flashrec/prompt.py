"""Prompt construction shared by the engine, the server's prompt-building threads and the
HF reference: the tokenizer, the chat template with thinking off, the length guard."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flashrec.sid.layout import SidLayout

# pre-tokenizers that split or re-spell text but never drop any of it (Split / Punctuation
# only without behavior "Removed")
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Split", "Digits", "Punctuation"}


def load_tokenizer(model_path: str):
    """The HF tokenizer of a checkpoint directory (``transformers`` imported on first use)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


WORD_CACHE_WORDS = 10_000  # the tokenizers library's default BPE word cache, in words


def share_word_cache(clone: Any, tokenizer: Any) -> bool:
    """Point ``clone``'s Rust model at ``tokenizer``'s, so that the copies of the server's
    prompt-building threads share one model and so one word-cache capacity
    (``bound_word_cache``). Before tokenizers 0.23 the model held one BPE word cache of up
    to 10,000 words, and a model per copy grew host memory that many words per thread under
    distinct prompts; since 0.23 (huggingface/tokenizers#2028) the cache is per thread and
    per model, so a thread that borrows every copy in turn would hold one cache per copy.
    The model is only read while serving; each copy keeps its own truncation and padding
    state. False where either has no Rust backend or the model cannot be set."""
    src = getattr(tokenizer, "backend_tokenizer", None)
    dst = getattr(clone, "backend_tokenizer", None)
    if src is None or dst is None or src is dst:
        return False
    try:
        dst.model = src.model
    except Exception:  # noqa: BLE001 - another backend: the copy keeps a model of its own
        return False
    return True


def bound_word_cache(tokenizer: Any, threads: int) -> int | None:
    """Cap the BPE word cache of ``tokenizer``'s Rust model (its copies' too, where they
    share it: ``share_word_cache``) at ``WORD_CACHE_WORDS // threads`` words, so that the
    caches of ``threads`` threads encoding through it hold at most ``WORD_CACHE_WORDS`` words
    in all. Since tokenizers 0.23 every thread keeps a cache of its own (thread-local, never
    evicted, filled up to the model's capacity): distinct prompts grew each prompt-building
    thread by up to 10,000 words (an entry costs its word's bytes plus about 32 bytes per
    byte of it, so ~0.4 KB for a short word, ~8 KB for a 255-byte one). With an older
    library, one cache behind a lock, this only makes that one cache smaller. Returns the
    words per thread, or None where the model has no resizable cache (not BPE, or no Rust
    backend)."""
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    resize = getattr(model, "_resize_cache", None)
    if resize is None:
        return None
    words = max(1, WORD_CACHE_WORDS // max(1, int(threads)))
    try:
        resize(words)
    except Exception:  # noqa: BLE001 - a model that cannot resize keeps its own capacity
        return None
    return words


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=False)``. A HF fast tokenizer's Rust
    backend encodes without offsets (``encode_batch_fast``), about 1.5x faster, and gives the
    same ids where its state is what such a call sets: no truncation, no padding, special
    tokens split only if ``split_special_tokens``. Checked per call, since another call on the
    same tokenizer may leave truncation or padding set; else the HF call."""
    bt = getattr(tokenizer, "backend_tokenizer", None)
    fast = getattr(bt, "encode_batch_fast", None)
    if (
        fast is not None
        and bt.truncation is None
        and bt.padding is None
        and getattr(bt, "encode_special_tokens", False)
        == bool(getattr(tokenizer, "split_special_tokens", False))
    ):
        return fast([text], add_special_tokens=False)[0].ids
    return tokenizer.encode(text, add_special_tokens=False)


class PromptTooLong(ValueError):
    """A text that provably encodes to more tokens than allowed, refused before encoding."""


@dataclass(frozen=True)
class LengthGuard:
    """Refuses a text whose token count is provably above ``max_tokens`` from its length.

    Every token of the tokenizer stands for at most ``token_bytes`` bytes of the (normalized)
    UTF-8 text and no text is dropped, so a text of B bytes has at least ceil(B /
    token_bytes) tokens. ``nfc``: the tokenizer NFC-normalizes first; NFC leaves an NFC text
    as it is, so only such a text is judged (any other goes to the tokenizer)."""

    max_tokens: int
    token_bytes: int
    nfc: bool = False

    def check(self, text: str) -> None:
        """``PromptTooLong`` when ``text`` cannot fit ``max_tokens`` tokens."""
        limit = self.max_tokens * self.token_bytes
        if len(text) * 4 <= limit:  # at most 4 bytes a character: it may fit
            return
        if len(text) <= limit:
            size = len(text.encode("utf-8", "surrogatepass"))
            if size <= limit:
                return
        else:
            size = len(text)  # a lower bound on its bytes, already too many
        if self.nfc and not unicodedata.is_normalized("NFC", text):
            return
        least = -(-size // self.token_bytes)
        raise PromptTooLong(
            f"the prompt has at least {least} tokens ({size} bytes, at most "
            f"{self.token_bytes} bytes a token); the server accepts at most "
            f"{self.max_tokens} (--max-seq-len)"
        )


def length_guard(tokenizer: Any, max_tokens: int) -> LengthGuard | None:
    """The ``LengthGuard`` of a HF fast BPE tokenizer, or None where no bound is provable
    (another model, a normalizer other than NFC, a pre-tokenizer that drops text, fused
    unknown tokens, added tokens that swallow the whitespace around them)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        spec = json.loads(backend.to_str())
    except Exception:  # noqa: BLE001 - a tokenizer that cannot describe itself is not judged
        return None
    model = spec.get("model") or {}
    norm = spec.get("normalizer")
    if model.get("type") != "BPE" or model.get("dropout") not in (None, 0, 0.0):
        return None
    if norm is not None and norm.get("type") != "NFC":
        return None
    pre = spec.get("pre_tokenizer")
    pres = (
        []
        if pre is None
        else pre.get("pretokenizers", [pre])
        if pre.get("type") == "Sequence"
        else [pre]
    )
    for p in pres:
        if p.get("type") not in _KEEPING_PRE_TOKENIZERS or p.get("behavior") == "Removed":
            return None
    byte_level = any(p.get("type") == "ByteLevel" for p in pres)
    vocab = model.get("vocab") or {}
    # byte-level vocabularies spell each byte as one character; others spell the text itself
    widths = [len(t) if byte_level else len(t.encode("utf-8")) for t in vocab]
    if model.get("unk_token") is not None and not byte_level:
        if model.get("fuse_unk"):
            return None
        widths.append(4)  # an unknown token stands for one character
    for added in spec.get("added_tokens") or []:
        if added.get("lstrip") or added.get("rstrip"):
            return None
        widths.append(len(str(added.get("content", "")).encode("utf-8")))
    if not widths or max(widths) < 1:
        return None
    return LengthGuard(int(max_tokens), max(widths), nfc=norm is not None)


def normalise_messages(messages) -> list[dict]:
    """Chat messages with ``content`` as a string or a list of text parts (joined)."""
    if not isinstance(messages, list | tuple) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if not isinstance(p, dict) or not isinstance(p.get("text", ""), str):
                    raise ValueError(
                        f"messages[{i}].content parts must be {{'type': 'text', 'text': str}}"
                    )
                parts.append(p.get("text", ""))
            content = "".join(parts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
        out.append({"role": m["role"], "content": content})
    return out


def build_prompt_ids(
    tokenizer,
    layout: SidLayout,
    vocab_size: int,
    *,
    messages=None,
    text: str | None = None,
    input_ids: Sequence[int] | None = None,
    chat_template_kwargs: dict | None = None,
    guard: LengthGuard | None = None,
) -> list[int]:
    """Chat template with thinking off (``messages``), raw text, or raw ids (used as-is);
    then ``<|sid_begin|>`` appended unless it is already last. ``guard``: a text (the
    rendered template included) that cannot fit is refused before it is encoded."""
    if input_ids is not None:
        ids = [int(t) for t in input_ids]
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"input_ids out of vocabulary [0, {vocab_size}): {bad[0]}")
    elif text is not None:
        if guard is not None:
            guard.check(text)
        ids = encode_text(tokenizer, text)
    elif messages is not None:
        kwargs = {"enable_thinking": False}
        kwargs.update(chat_template_kwargs or {})
        rendered = tokenizer.apply_chat_template(
            normalise_messages(messages), tokenize=False, add_generation_prompt=True, **kwargs
        )
        if guard is not None:
            guard.check(rendered)
        ids = encode_text(tokenizer, rendered)
    else:
        raise ValueError("one of messages, text or input_ids is required")
    if not ids or ids[-1] != layout.sid_begin:
        ids = ids + [layout.sid_begin]
    return ids
