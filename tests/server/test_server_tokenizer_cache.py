"""The server's prompt-building threads each hold a tokenizer copy, and the copies share the
engine tokenizer's Rust model, so one BPE word cache (the tokenizers library keeps up to
10,000 words per model). With a model per copy, distinct prompts grew host memory by that
many words per thread (``--tokenizer-workers`` 4: four caches filling for ~40,000 distinct
words). Each copy still encodes exactly as the engine's tokenizer does.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from server_helpers import server_config
from tokenizer_helpers import mixed_texts, qwen_like_tokenizer
from transformers import AutoTokenizer

from flashrec.engine.engine import private_prompt_builder
from flashrec.prompt import encode_text
from flashrec.server.engine_process.proxy import EngineClient


@pytest.fixture(params=["synthetic", "qwen-like"])
def tok(request, tiny_checkpoint: Path):
    if request.param == "synthetic":
        return AutoTokenizer.from_pretrained(tiny_checkpoint)
    return qwen_like_tokenizer()


def test_builder_copies_share_the_engine_tokenizers_model(tok, tiny_checkpoint: Path) -> None:
    builders = [private_prompt_builder(tok, str(tiny_checkpoint), None, 0) for _ in range(3)]
    copies = [b.args[0] for b in builders]
    assert all(c is not tok and c.backend_tokenizer is not tok.backend_tokenizer for c in copies)
    # one model behind them all: a model setting made through the engine's tokenizer is the
    # copies' setting too (a model of their own, with its own word cache, keeps its value)
    assert tok.backend_tokenizer.model.dropout is None
    tok.backend_tokenizer.model.dropout = 0.25
    assert [c.backend_tokenizer.model.dropout for c in copies] == [0.25] * 3
    tok.backend_tokenizer.model.dropout = None
    # the copies keep their own state: truncation set on one is not the others'
    copies[0].backend_tokenizer.enable_truncation(8)
    assert tok.backend_tokenizer.truncation is None
    assert copies[1].backend_tokenizer.truncation is None
    copies[0].backend_tokenizer.no_truncation()


def test_engine_process_front_end_copies_share_one_model(tiny_checkpoint: Path) -> None:
    """With ``--engine-process`` the front end preloads its copies (``load_tokenizers``):
    they share its tokenizer's model too."""
    client = EngineClient(server_config(str(tiny_checkpoint), tokenizer_workers=3), None)
    client.load_tokenizers()
    tok, copies = client.tokenizers[0], client.tokenizers[1:]
    assert len(copies) == 4  # the front end's own, two more threads, the large-prompt lane
    tok.backend_tokenizer.model.dropout = 0.25
    assert [c.backend_tokenizer.model.dropout for c in copies] == [0.25] * 4


def test_shared_model_encodes_the_same_from_many_threads(tok, tiny_checkpoint: Path) -> None:
    """Four copies encoding at once over one model give the engine tokenizer's ids."""
    copies = [private_prompt_builder(tok, str(tiny_checkpoint), None, 0).args[0] for _ in range(4)]
    texts = [f"{t} user {i}" for i in range(50) for t in mixed_texts(i % 3)[:2]]
    want = [encode_text(tok, t) for t in texts]

    def run(j: int) -> list[list[int]]:
        return [encode_text(copies[j], t) for t in texts[j::4]]

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(run, range(4)))
    for j in range(4):
        assert got[j] == want[j::4]
