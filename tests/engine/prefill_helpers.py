"""Shared by the prefill graph tests: a tiny-model engine and prompts of chosen lengths."""

from __future__ import annotations

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine


def make_engine(model_dir, **kw) -> Engine:
    return Engine(
        EngineConfig(
            model_path=str(model_dir),
            sid_vocab_file=str(model_dir / "catalog.json"),
            batch_slots=256,
            **kw,
        )
    )


def make_prompts(eng: Engine, words=(3, 20, 40, 90)) -> list[list[int]]:
    """One chat prompt per entry, ``words`` distinct words each (~50, ~200, ~380, ~830
    tokens for the defaults with the tiny tokenizer)."""
    out = []
    for i, n in enumerate(words):
        text = " ".join(f"item{i}_{j}" for j in range(n))
        out.append(eng.build_prompt(messages=[{"role": "user", "content": text}]))
    return out
