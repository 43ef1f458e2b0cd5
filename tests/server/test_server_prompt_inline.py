"""FLASHREC_PROMPT_INLINE=idle (the default): a small prompt arriving while no other request is
handled is built on the event loop (no hand-off to a prompt thread); otherwise, and with
``off``, a thread builds it. Either way a builder is never shared and always given back."""

from __future__ import annotations

import asyncio
import threading

import pytest
from knob_helpers import import_with
from server_fakes import StubEngine

from flashrec.server import backend as backend_mod
from flashrec.server.backend import INLINE_PROMPT_CHARS, Backend
from flashrec.server.protocol import Limits

LIMITS = Limits(max_beam_rows=8, vocab_size=100, max_seq_len=64, default_n=2, default_max_tokens=3)


class RecordingEngine(StubEngine):
    """Builders that record the thread they ran on; "bad" text is a prompt error."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def build_prompt(self, **kwargs):
        self.threads.append(threading.get_ident())
        if kwargs.get("text") == "bad":
            raise ValueError("not a prompt")
        return [1, 2, 3]


def _built_on(mode: str, monkeypatch, text: str = "short", handlers: int = 1,
              workers: int = 2) -> tuple[bool, Backend]:  # fmt: skip
    """Build one prompt with ``handlers`` active; whether it ran on the event loop's thread."""
    monkeypatch.setattr(backend_mod, "PROMPT_INLINE", mode)
    engine = RecordingEngine()
    be = Backend(engine=engine, limits=LIMITS, tokenizer_workers=workers)
    be.active_handlers = handlers

    async def main() -> int:
        assert await be.build_prompt("text", text=text) == [1, 2, 3]
        return threading.get_ident()

    try:
        loop_thread = asyncio.run(main())
    finally:
        be.close()
    (ran_on,) = engine.threads
    assert be._builders.qsize() == workers  # every builder back in the pool
    return ran_on == loop_thread, be


def test_idle_server_builds_a_small_prompt_on_the_event_loop(monkeypatch):
    inline, _ = _built_on("idle", monkeypatch)
    assert inline


def test_idle_is_the_default_and_a_typo_fails_the_import():
    knob = ("flashrec.server.backend", "PROMPT_INLINE", "FLASHREC_PROMPT_INLINE")
    got = import_with(*knob)
    assert got.returncode == 0 and got.stdout.strip() == "idle", got.stderr
    bad = import_with(*knob, "always")
    assert bad.returncode != 0
    assert "FLASHREC_PROMPT_INLINE must be idle or off, got 'always'" in bad.stderr


@pytest.mark.parametrize(
    ("mode", "text", "handlers"),
    [
        ("off", "short", 1),  # off: always a thread
        ("idle", "short", 2),  # another request is being handled: the loop stays free
        ("idle", "short", 0),  # a call from outside a handler
        ("idle", "x" * (INLINE_PROMPT_CHARS + 1), 1),  # too long to hold the loop for
    ],
)
def test_otherwise_a_prompt_thread_builds_it(monkeypatch, mode, text, handlers):
    inline, _ = _built_on(mode, monkeypatch, text=text, handlers=handlers)
    assert not inline


def test_no_free_builder_falls_back_to_a_thread(monkeypatch):
    monkeypatch.setattr(backend_mod, "PROMPT_INLINE", "idle")
    engine = RecordingEngine()
    be = Backend(engine=engine, limits=LIMITS, tokenizer_workers=1)
    be.active_handlers = 1
    held = be._builders.get_nowait()  # a withdrawn request's build still holds the only one

    async def main() -> None:
        task = asyncio.ensure_future(be.build_prompt("text", text="short"))
        await asyncio.sleep(0.2)
        assert not task.done() and engine.threads == []  # the thread waits for a builder
        be._builders.put(held)
        assert await asyncio.wait_for(task, 10) == [1, 2, 3]

    try:
        asyncio.run(main())
    finally:
        be.close()
    assert len(engine.threads) == 1 and engine.threads[0] != threading.get_ident()


def test_a_bad_prompt_built_inline_is_a_400_and_gives_its_builder_back(monkeypatch):
    monkeypatch.setattr(backend_mod, "PROMPT_INLINE", "idle")
    engine = RecordingEngine()
    be = Backend(engine=engine, limits=LIMITS, tokenizer_workers=1)
    be.active_handlers = 1

    async def main() -> int:
        with pytest.raises(Exception) as err:
            await be.build_prompt("messages", text="bad")
        assert getattr(err.value, "status", None) == 400
        assert "not a prompt" in str(err.value)
        return threading.get_ident()

    try:
        loop_thread = asyncio.run(main())
    finally:
        be.close()
    assert engine.threads == [loop_thread]
    assert be._builders.qsize() == 1
