"""Prompt construction shared by the engine, the HF reference and the harness."""

from __future__ import annotations

from collections.abc import Sequence

from flashrec.sid.layout import SidLayout


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
) -> list[int]:
    """Chat template with thinking off (``messages``), raw text, or raw ids (used as-is);
    then ``<|sid_begin|>`` appended unless it is already last."""
    if input_ids is not None:
        ids = [int(t) for t in input_ids]
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"input_ids out of vocabulary [0, {vocab_size}): {bad[0]}")
    elif text is not None:
        ids = tokenizer.encode(text, add_special_tokens=False)
    elif messages is not None:
        kwargs = {"enable_thinking": False}
        kwargs.update(chat_template_kwargs or {})
        rendered = tokenizer.apply_chat_template(
            normalise_messages(messages), tokenize=False, add_generation_prompt=True, **kwargs
        )
        ids = tokenizer.encode(rendered, add_special_tokens=False)
    else:
        raise ValueError("one of messages, text or input_ids is required")
    if not ids or ids[-1] != layout.sid_begin:
        ids = ids + [layout.sid_begin]
    return ids
