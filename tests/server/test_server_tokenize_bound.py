"""Work per prompt is bounded: a text that cannot fit --max-seq-len is refused from its length
before it is encoded, large prompts are built on a lane of their own, /health reports a stall."""

from __future__ import annotations

import asyncio
import threading
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from server_fakes import StubEngine
from server_helpers import ServerThread, real_server
from tokenizer_helpers import mixed_texts, qwen_like_tokenizer
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from flashrec.prompt import LengthGuard, PromptTooLong, length_guard
from flashrec.server.backend import LARGE_PROMPT_CHARS, Backend
from flashrec.server.protocol import Limits

BODY_LIMIT = 8 * 1024 * 1024
SMALL = {"messages": [{"role": "user", "content": "an ordinary prompt"}], "n": 4}
# the ordinary request's answer bound: the measured stall behind four near-8-MiB prompts
# was 25-30 s per prompt (101 s behind four); any bound well below that shows the effect
SMALL_BOUND_S = 10.0


def _assert_sound(tok, guard: LengthGuard, texts: list[str]) -> None:
    """No text is ever refused that the tokenizer encodes within the limit."""
    for text in texts:
        n = len(tok.encode(text, add_special_tokens=False))
        tight = LengthGuard(n, guard.token_bytes, guard.nfc)  # refuses iff bound > n
        tight.check(text)  # raises if the bound claims more than n tokens: unsound
        if guard.nfc and not unicodedata.is_normalized("NFC", text):
            continue
        least = -(-len(text.encode()) // guard.token_bytes)
        assert n >= least, (text, n, least)


def test_guard_is_sound_for_the_synthetic_tokenizer(tiny_checkpoint: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    guard = length_guard(tok, 4096)
    # one byte a token, the longest added token ("<|sid_begin|>") 13 bytes
    assert guard == LengthGuard(4096, 13, nfc=False)
    _assert_sound(tok, guard, mixed_texts(0))
    with pytest.raises(PromptTooLong, match="at least"):
        guard.check("y" * (4096 * 13 + 1))
    guard.check("y" * (4096 * 13))  # may fit: left to the tokenizer


def test_guard_is_sound_for_a_qwen_shaped_tokenizer() -> None:
    tok = qwen_like_tokenizer()
    guard = length_guard(tok, 100)
    assert guard is not None and guard.nfc
    longest = max(len(t) for t in tok.backend_tokenizer.get_vocab(with_added_tokens=False))
    assert guard.token_bytes == max(longest, len("<|im_start|>")) > 8  # merges were learned
    _assert_sound(tok, guard, mixed_texts(1) + ["aaaa" * 300, "    " * 300, "the quick " * 100])
    one = LengthGuard(1, guard.token_bytes, nfc=True)
    decomposed = "e\u0301" * guard.token_bytes  # not NFC: NFC shortens it, so it is not judged
    one.check(decomposed)
    with pytest.raises(PromptTooLong):
        one.check(unicodedata.normalize("NFC", decomposed))


def test_no_guard_where_no_bound_is_provable() -> None:
    def fast(tok: Tokenizer) -> PreTrainedTokenizerFast:
        return PreTrainedTokenizerFast(tokenizer_object=tok)

    dropping = Tokenizer(models.BPE(unk_token="[UNK]"))
    dropping.pre_tokenizer = pre_tokenizers.Whitespace()  # whitespace is dropped
    assert length_guard(fast(dropping), 10) is None
    lowered = Tokenizer(models.BPE())
    lowered.normalizer = normalizers.Lowercase()  # the Kelvin sign (3 bytes) becomes "k"
    assert length_guard(fast(lowered), 10) is None
    fused = Tokenizer(models.BPE(unk_token="[UNK]", fuse_unk=True))
    assert length_guard(fast(fused), 10) is None
    assert length_guard(object(), 10) is None  # not a fast tokenizer


def _post(url: str, body: dict) -> tuple[int, str, float]:
    t0 = time.monotonic()
    r = requests.post(url, json=body, timeout=300)
    return r.status_code, r.text, time.monotonic() - t0


def _flood(srv: ServerThread, n_big: int) -> tuple[list[tuple[int, str, float]], float]:
    """``n_big`` near-8-MiB text prompts at once, then an ordinary chat request behind them:
    the big answers and the ordinary request's latency."""
    big = {"text": "q" * (BODY_LIMIT - 4096), "sampling_params": {"n": 2, "max_new_tokens": 4}}
    with ThreadPoolExecutor(n_big) as pool:
        bigs = [pool.submit(_post, srv.url + "/generate", big) for _ in range(n_big)]
        time.sleep(1.0)  # the big bodies are on their way / being built
        status, text, small_s = _post(srv.url + "/v1/chat/completions", SMALL)
        assert status == 200, text
        health = srv.get("/health")
        assert health.status_code == 200, health.text
        return [f.result() for f in bigs], small_s


def test_near_limit_prompts_refused_from_their_length(real: ServerThread) -> None:
    """The reproducer: four near-8-MiB prompts at once (--max-seq-len 4096) do not hold the
    prompt-building threads; the ordinary request behind them answers at once."""
    bigs, small_s = _flood(real, 4)
    assert small_s < SMALL_BOUND_S
    for status, text, took in bigs:
        assert status == 400 and "at least" in text and "--max-seq-len" in text, text
        assert took < SMALL_BOUND_S


def test_large_prompts_take_their_own_lane(tiny_checkpoint: Path) -> None:
    """With a --max-seq-len too large for the length bound to refuse them, near-8-MiB prompts
    are encoded, on the large lane: the ordinary request does not wait for them, and the
    large lane holds at most two (the others: 503)."""
    with real_server(tiny_checkpoint, max_seq_len=1 << 22, tokenizer_workers=2) as srv:
        bigs, small_s = _flood(srv, 4)
    assert small_s < SMALL_BOUND_S
    statuses = sorted(status for status, _, _ in bigs)
    assert statuses.count(503) >= 2 and set(statuses) <= {400, 503}, bigs
    assert any("large prompts" in text for status, text, _ in bigs if status == 503)


class _BlockingEngine(StubEngine):
    """An engine whose prompt building waits for ``release`` (a tokenizer that hangs)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def build_prompt(self, **kwargs) -> list[int]:
        self.release.wait(30)
        return [1, 2, 3]


def test_health_degraded_while_prompts_wait() -> None:
    limits = Limits(
        max_beam_rows=8, vocab_size=100, max_seq_len=64, default_n=2, default_max_tokens=3
    )
    engine = _BlockingEngine()
    be = Backend(engine=engine, limits=limits, tokenizer_workers=1, stall_limit_s=0.3)

    async def main() -> None:
        first = asyncio.ensure_future(be.build_prompt("text", text="a"))
        second = asyncio.ensure_future(be.build_prompt("text", text="b"))  # waits for a thread
        await asyncio.sleep(1.0)
        reason = be.degraded()
        assert reason is not None and "waited" in reason
        engine.release.set()
        assert await first == [1, 2, 3] and await second == [1, 2, 3]
        assert be.degraded() is None and be.stalled_s() == 0.0

    try:
        asyncio.run(main())
    finally:
        engine.release.set()
        be.close()


def test_large_prompt_lane_is_separate() -> None:
    """A large prompt that hangs in the tokenizer leaves the ordinary threads free."""
    limits = Limits(
        max_beam_rows=8, vocab_size=100, max_seq_len=64, default_n=2, default_max_tokens=3
    )

    class Engine(_BlockingEngine):
        def build_prompt(self, **kwargs) -> list[int]:
            if len(kwargs.get("text", "")) > LARGE_PROMPT_CHARS:
                self.release.wait(30)
            return [4]

    engine = Engine()
    be = Backend(engine=engine, limits=limits, tokenizer_workers=1)
    large = "z" * (LARGE_PROMPT_CHARS + 1)

    async def main() -> None:
        stuck = [asyncio.ensure_future(be.build_prompt("text", text=large)) for _ in range(2)]
        await asyncio.sleep(0.2)
        with pytest.raises(Exception) as err:  # a third large one: the lane is full
            await be.build_prompt("text", text=large)
        assert getattr(err.value, "status", None) == 503
        assert await asyncio.wait_for(be.build_prompt("text", text="small"), 10) == [4]
        engine.release.set()
        assert [await s for s in stuck] == [[4], [4]]

    try:
        asyncio.run(main())
    finally:
        engine.release.set()
        be.close()
