"""The server's prompt-building threads each hold a tokenizer copy, and the copies share the
engine tokenizer's Rust model. Before tokenizers 0.23 that was one BPE word cache (up to
10,000 words per model); with a model per copy, distinct prompts grew host memory by that
many words per thread (``--tokenizer-workers`` 4: four caches filling for ~40,000 distinct
words). Since 0.23 the cache is per thread (and per model), so the shared model's capacity
is cut to 10,000 words over the threads (``bound_word_cache``): measured here as the
memory one thread's cache takes. Each copy still encodes exactly as the engine's tokenizer
does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from server_fakes import StubEngine
from server_helpers import server_config
from tokenizer_helpers import mixed_texts, qwen_like_tokenizer
from transformers import AutoTokenizer

from flashrec.engine.engine import private_prompt_builder
from flashrec.prompt import WORD_CACHE_WORDS, bound_word_cache, build_prompt_ids, encode_text
from flashrec.server.backend import Backend
from flashrec.server.engine_process.proxy import EngineClient
from flashrec.server.protocol import Limits


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


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _malloc_in_use() -> int | None:
    """Bytes malloc has handed out and not had back, over every arena (glibc 2.33+)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    fn = getattr(libc, "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = _Mallinfo2
    info = fn()
    return info.uordblks + info.hblkhd


def _cache_growth(tok, words: int) -> int:
    """Bytes still allocated after one new thread encodes ``words`` distinct words with
    ``tok``, measured before the thread ends (its word cache is freed with the thread)."""
    out: list[int] = []

    def run() -> None:
        for i in range(50):  # the thread's first allocations (its cache map, buffers)
            encode_text(tok, f"warm {i}")
        before = _malloc_in_use()
        for i in range(words):
            encode_text(tok, "word " + "".join(chr(97 + int(c)) for c in f"{i:08d}") * 4)
        out.append(_malloc_in_use() - before)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]


class _TokenizerEngine(StubEngine):
    """An engine whose prompts are built with real tokenizer copies."""

    layout = None
    vocab_size = 1000

    def __init__(self, tokenizer, path: str) -> None:
        self.tokenizer, self.path = tokenizer, path

    def prompt_builders(self, count: int):
        own = functools.partial(build_prompt_ids, self.tokenizer, None, self.vocab_size)
        copies = (
            private_prompt_builder(self.tokenizer, self.path, None, self.vocab_size)
            for _ in range(count - 1)
        )
        return [own, *copies]


def test_bound_word_cache_splits_the_words_over_the_threads(tiny_checkpoint: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    assert bound_word_cache(tok, 5) == WORD_CACHE_WORDS // 5
    assert bound_word_cache(tok, 0) == WORD_CACHE_WORDS
    assert bound_word_cache(object(), 4) is None  # no Rust backend: nothing to bound


def test_backend_bounds_each_threads_word_cache(tiny_checkpoint: Path) -> None:
    """With 4 prompt-building threads (+ the large lane) a thread's word cache stops at
    10,000 / 5 words: 6,000 distinct words leave a third of what an unbounded tokenizer
    keeps (its cache takes all 6,000)."""
    if _malloc_in_use() is None:
        pytest.skip("needs glibc's mallinfo2")
    path = str(tiny_checkpoint)
    free = AutoTokenizer.from_pretrained(tiny_checkpoint)  # the library's own capacity
    unbounded = _cache_growth(free, 6000)
    engine = _TokenizerEngine(AutoTokenizer.from_pretrained(tiny_checkpoint), path)
    limits = Limits(
        max_beam_rows=8, vocab_size=1000, max_seq_len=4096, default_n=2, default_max_tokens=3
    )
    be = Backend(engine=engine, limits=limits, tokenizer_workers=4)
    try:
        assert be.word_cache_words == WORD_CACHE_WORDS // 5
        copy = be._large_builder.args[0]  # a copy sharing the engine tokenizer's model
        bounded = _cache_growth(copy, 6000)
    finally:
        be.close()
    assert unbounded > 6000 * 200  # each cached word costs hundreds of bytes
    assert bounded < 0.5 * unbounded, (bounded, unbounded)
