"""Workloads: the prompts of a cell (measured and warm-up) and their ground truth.

Kinds: ``synthetic`` (``flashrec.synth.synth_prompts``), ``lorem`` (the harness's own filler
text, no engine code needed), ``jsonl`` (one chat a line) and ``recif`` (OpenOneRec RecIF
parquet: a ``messages`` column and ground-truth SIDs in ``metadata.answer``). Measured prompts
come first and warm-up prompts after them, so the measured set does not depend on the number of
warm-up requests.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from harness.load.sids import Sid, parse_sid_list
from harness.load.users import user_chats
from harness.spec.cells import ClientSettings
from harness.spec.matrix import WorkloadSpec

SID_BEGIN = "<|sid_begin|>"
_LOREM = (
    "user watched clicked liked shared skipped bought saved searched item music travel cooking "
    "comedy sports news gaming fashion pets science dance fitness beauty cars movies anime tech"
).split()


@dataclass(frozen=True)
class Prompt:
    """One chat request's messages and, when the workload has it, its ground-truth SIDs."""

    index: int
    messages: list[dict]
    truth: tuple[Sid, ...] | None = None


@dataclass(frozen=True)
class PromptSet:
    """The measured and warm-up prompts of a cell."""

    measured: list[Prompt]
    warmup: list[Prompt]

    @property
    def has_truth(self) -> bool:
        return any(p.truth for p in self.measured)


def _lorem(num: int, c: ClientSettings, seed: int) -> list[list[dict]]:
    system = None
    if c.system_prompt_tokens:
        rng = random.Random(seed * 7919 + 1)
        words = " ".join(rng.choice(_LOREM) for _ in range(c.system_prompt_tokens))
        system = {"role": "system", "content": "You are a recommender. " + words}
    out = []
    for i in range(num):
        rng = np.random.default_rng([seed, i])
        n = max(8, round(c.median_tokens * float(np.exp(c.spread * rng.standard_normal()))))
        text = " ".join(_LOREM[j] for j in rng.integers(0, len(_LOREM), size=n))
        user = {"role": "user", "content": f"History {i}: {text}"}
        out.append([system, user] if system else [user])
    return out


def _normalise(messages: Any) -> list[dict] | None:
    if isinstance(messages, str):
        messages = json.loads(messages)
    if hasattr(messages, "tolist"):
        messages = messages.tolist()
    if not isinstance(messages, list):
        return None
    out = []
    for m in messages:
        content = m.get("content")
        if hasattr(content, "tolist"):
            content = content.tolist()
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        out.append({"role": m.get("role"), "content": content})
    return out


def _truth(value: Any, levels: int) -> tuple[Sid, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        sids = parse_sid_list(value, levels)
    else:
        sids = [tuple(int(c) for c in row) for row in value]
    return tuple(sids) or None


def _row(messages: Any, answer: Any, levels: int) -> tuple[list[dict], Any] | None:
    msgs = _normalise(messages)
    if not msgs:
        return None
    if msgs[-1].get("role") == "assistant":  # SFT rows carry the answer as the last turn
        last = msgs.pop()
        answer = answer if answer is not None else last.get("content")
    return (msgs, _truth(answer, levels)) if msgs else None


def _read_jsonl(path: Path, levels: int) -> list[tuple[list[dict], Any]]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if isinstance(obj, list):
            row = _row(obj, None, levels)
        else:
            answer = obj.get("ground_truth", obj.get("answer"))
            row = _row(obj.get("messages"), answer, levels)
        if row is None:
            raise ValueError(f"{path}:{n}: expected a list of messages or {{'messages': [...]}}")
        rows.append(row)
    return rows


def _read_recif(path: Path, levels: int) -> list[tuple[list[dict], Any]]:
    import pandas as pd

    files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"{path}: no .parquet files")
    rows = []
    for f in files:
        df = pd.read_parquet(f)
        if "messages" not in df.columns:
            raise ValueError(f"{f}: a RecIF parquet needs a 'messages' column")
        for rec in df.to_dict("records"):
            meta = rec.get("metadata")
            if isinstance(meta, str):
                meta = json.loads(meta)
            answer = meta.get("answer") if isinstance(meta, dict) else None
            row = _row(rec["messages"], answer, levels)
            if row:
                rows.append(row)
    return rows


@lru_cache(maxsize=4)
def _dataset(kind: str, path: str, levels: int) -> tuple:
    p = Path(path)
    rows = _read_jsonl(p, levels) if kind == "jsonl" else _read_recif(p, levels)
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return tuple(rows)


def build_prompts(
    workload: WorkloadSpec, client: ClientSettings, levels: int, tokenizer: Any = None
) -> PromptSet:
    """The measured and warm-up prompts for a cell's client settings."""
    total = client.requests + client.warmup_requests
    if workload.kind in ("synthetic", "lorem"):

        def chats_of(num: int) -> list[list[dict]]:
            if workload.kind == "lorem":
                return _lorem(num, client, workload.seed)
            from flashrec.synth import synth_prompts

            return synth_prompts(
                num,
                median_tokens=client.median_tokens,
                spread=client.spread,
                seed=workload.seed,
                system_prompt_tokens=client.system_prompt_tokens,
                tokenizer=tokenizer,
            )

        if workload.users:  # histories that grow per user (harness.load.users)
            w = workload
            measured, warm = user_chats(chats_of, client.requests, client.warmup_requests,
                                        w.users, w.user_items, w.user_order, w.seed)  # fmt: skip
            chats = measured + warm
        else:
            chats = chats_of(total)
        prompts = [Prompt(i, m) for i, m in enumerate(chats)]
    else:
        rows = list(_dataset(workload.kind, str(workload.path), levels))
        order = list(range(len(rows)))
        if workload.shuffle:
            random.Random(workload.seed).shuffle(order)
        prompts = [Prompt(order[i % len(rows)], *rows[order[i % len(rows)]]) for i in range(total)]
    return PromptSet(prompts[: client.requests], prompts[client.requests :])


# --------------------------------------------------------------------------- rendering


def builtin_template(messages: list[dict]) -> str:
    """ChatML with an empty think block (Qwen3, ``enable_thinking=False``)."""
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n<think>\n\n</think>\n\n"


class PromptRenderer:
    """Prompt text for the ``/generate`` protocol: chat template + ``<|sid_begin|>``.

    Uses the tokenizer at ``tokenizer_path`` (``apply_chat_template``); without one, the
    built-in ChatML template (what Qwen3-family models, OneRec included, use).
    """

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    @property
    def source(self) -> str:
        return "tokenizer" if self.tokenizer is not None else "builtin-chatml"

    def render(self, messages: list[dict]) -> str:
        if self.tokenizer is None:
            return builtin_template(messages) + SID_BEGIN
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
            )
        except TypeError:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        return text + SID_BEGIN


def load_tokenizer(path: str | None) -> Any:
    """``AutoTokenizer.from_pretrained(path)`` or None without a path."""
    if not path:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
