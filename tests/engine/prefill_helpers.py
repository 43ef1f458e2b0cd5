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


def same_results(a, b, tol=1e-4) -> None:
    """Two engines' results: the same beams in the same order, scores within ``tol``."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert [p.token_ids for p in x.beams] == [q.token_ids for q in y.beams]
        for p, q in zip(x.beams, y.beams):
            assert abs(p.cum_logprob - q.cum_logprob) <= tol
