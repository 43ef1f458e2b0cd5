"""Test doubles for the engine.

``FakeEngine`` + ``FakeScheduler``, driven by the real ``flashrec.engine.loop.EngineLoop`` (the
server's ``ServedEngine`` in one process): ``FakeEngine`` has the ``Engine`` surface the loop
uses (byte prompts without a tokenizer, a real ``SidLayout``, deterministic beams that depend
only on the request, a toy prefix cache), so the HTTP layer can be tested fast and with
injected faults: slow steps (``step_delay_s``) and failing batches (a prompt containing
``FAIL_MARKER``).

``StubEngine``: the whole ``ServedEngine`` with nothing behind it, for the unit tests of
``Backend`` (each overrides what it exercises).
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from flashrec.engine.request import BeamResult, EngineError, GenRequest, GenResult
from flashrec.server.engine_api import PromptBuilder
from flashrec.sid.layout import SidLayout

FAIL_MARKER = "FAIL_BATCH"
BYTE_VOCAB = 256


def _has_marker(ids: list[int]) -> bool:
    """Prompts containing ``FAIL_MARKER`` fail their whole batch."""
    return FAIL_MARKER.encode() in bytes(t for t in ids if t < BYTE_VOCAB)


def _unit(*parts: Any) -> float:
    h = hashlib.sha256(repr(parts).encode()).digest()
    return struct.unpack("<Q", h[:8])[0] / 2**64


@dataclass
class _Running:
    req: GenRequest
    steps_left: int
    cached: int


@dataclass
class FakeScheduler:
    """Admits under a row budget; each request takes ``num_levels + 1`` steps."""

    engine: FakeEngine
    waiting: list[GenRequest] = field(default_factory=list)
    running: list[_Running] = field(default_factory=list)
    cache: set[tuple[int, ...]] = field(default_factory=set)
    stats: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(
            steps_total=0, prompt_tokens_total=0, prefix_hit_tokens_total=0, batch_failures_total=0
        )
    )
    # no model forwards: the decode counters stay at 0
    runner: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(decode_forwards={"graph": 0, "eager": 0})
    )
    radix: None = None
    step_delay_s: float = 0.0
    kv_reserved_tokens: int = 0  # no prefill graphs: nothing reserved

    @property
    def kv(self) -> SimpleNamespace:
        return SimpleNamespace(
            rows=SimpleNamespace(size=self.engine.max_beam_rows), pool_tokens=1 << 20
        )

    def add(self, req: GenRequest) -> None:
        self.waiting.append(req)

    def cancel(self, rid: str) -> bool:
        for r in list(self.waiting):
            if r.rid == rid:
                self.waiting.remove(r)
                return True
        for r in list(self.running):
            if r.req.rid == rid:
                self.running.remove(r)
                return True
        return False

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def flush_cache(self) -> int:
        n = len(self.cache)
        self.cache.clear()
        return n

    @property
    def used_rows(self) -> int:
        return sum(r.req.n for r in self.running)

    @property
    def kv_used_tokens(self) -> int:
        return sum(r.req.prompt_len for r in self.running)

    def _cached(self, ids: list[int]) -> int:
        best = 0
        for k in range(len(ids) - 1, 0, -1):
            if tuple(ids[:k]) in self.cache:
                best = k
                break
        return best

    def step(self) -> list[tuple[GenRequest, GenResult | Exception]]:
        eng = self.engine
        out: list[tuple[GenRequest, GenResult | Exception]] = []
        admitted = []
        for req in list(self.waiting):
            if self.used_rows + sum(r.req.n for r in admitted) + req.n > eng.max_beam_rows:
                break
            self.waiting.remove(req)
            admitted.append(_Running(req, eng.layout.num_levels + 1, self._cached(req.input_ids)))
        if any(_has_marker(r.req.input_ids) for r in admitted):
            self.stats.batch_failures_total += 1
            out.extend((r.req, EngineError("injected failure")) for r in admitted)
            admitted = []
        for r in admitted:
            ids = r.req.input_ids
            for k in range(1, len(ids)):
                self.cache.add(tuple(ids[:k]))
            self.stats.prompt_tokens_total += r.req.prompt_len
            self.stats.prefix_hit_tokens_total += r.cached
        self.running.extend(admitted)
        for r in list(self.running):
            r.steps_left -= 1
            if r.steps_left <= 0:
                self.running.remove(r)
                out.append((r.req, eng.result_for(r.req, r.cached)))
        self.stats.steps_total += 1
        delay = max(self.step_delay_s, eng.step_delay_s)
        if delay:
            time.sleep(delay)
        return out


class FakeEngine:
    """Deterministic stand-in for ``flashrec.engine.engine.Engine``."""

    def __init__(self, config: Any, step_delay_s: float = 0.0, codebook_size: int = 16) -> None:
        self.config = config
        self.step_delay_s = step_delay_s
        levels = 3
        self.layout = SidLayout(
            code_start=BYTE_VOCAB,
            codebook_size=codebook_size,
            num_levels=levels,
            sid_begin=BYTE_VOCAB + levels * codebook_size,
            sid_end=BYTE_VOCAB + levels * codebook_size + 1,
        )
        self.vocab_size = self.layout.sid_end + 1
        self.scheduler = FakeScheduler(self)

    tokenizer = None  # byte prompts: no length guard, no word cache, no SID text table

    @property
    def max_beam_rows(self) -> int:
        return self.config.resolved_batch_slots

    def build_prompt(self, messages=None, text=None, input_ids=None, chat_template_kwargs=None):
        if input_ids is not None:
            ids = [int(t) for t in input_ids]
        elif text is not None:
            ids = list(text.encode())
        elif messages is not None:
            kw = chat_template_kwargs or {}
            if not all(isinstance(k, str) for k in kw):
                raise TypeError("chat_template_kwargs keys must be strings")
            parts = []
            for m in messages:
                c = m["content"]
                if isinstance(c, list):
                    c = "".join(p["text"] for p in c)
                parts.append(f"<{m['role']}>{c}\n")
            ids = list("".join(parts).encode())
        else:
            raise ValueError("one of messages, text or input_ids is required")
        if not ids or ids[-1] != self.layout.sid_begin:
            ids.append(self.layout.sid_begin)
        return ids

    def prompt_builders(self, count: int) -> list[PromptBuilder]:
        return [self.build_prompt] * count  # no tokenizer: safe on any number of threads

    def sid_text_table(self) -> dict[int, str]:
        return {}

    def new_request(
        self,
        input_ids: list[int],
        n: int | None = None,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
        rid: str | None = None,
    ) -> GenRequest:
        return GenRequest(
            rid or "fake",
            input_ids,
            n or self.config.beam_width,
            max_tokens or self.layout.num_levels + 1,
            temperature,
            seed,
        )

    def check_request(self, req: GenRequest) -> None:
        if not 1 <= req.n <= self.max_beam_rows:
            raise ValueError(f"n={req.n} out of range")

    def result_for(self, req: GenRequest, cached: int) -> GenResult:
        """Beams depend on prompt, n, temperature, seed, max_tokens only."""
        lay = self.layout
        key = (tuple(req.input_ids), req.temperature, req.seed)
        beams = []
        for i in range(req.n):
            codes = [int(_unit(key, i, lv) * lay.codebook_size) for lv in range(lay.num_levels)]
            toks = [lay.code_start + lv * lay.codebook_size + c for lv, c in enumerate(codes)]
            toks = (toks + [lay.sid_end])[: req.max_tokens]
            cum = -(i + 1) * 0.5 - _unit(key, i) * 0.1
            text = "".join(
                f"<s_{'abc'[lv]}_{t - lay.code_start - lv * lay.codebook_size}>"
                for lv, t in enumerate(toks[: lay.num_levels])
            ) + ("<|sid_end|>" if toks[-1] == lay.sid_end else "")
            reason = "stop" if toks[-1] == lay.sid_end else "length"
            beams.append(BeamResult(toks, cum, cum / len(toks), reason, text))
        return GenResult(req.rid, beams, req.prompt_len, cached)

    def server_info(self) -> dict[str, Any]:
        return {"engine": "fake", "sid": self.layout.to_arg()}


class StubEngine:
    """A ``ServedEngine`` that serves nothing: byte-less prompts (``[1]``), futures nobody
    resolves, inert controls. Unit tests override the members they exercise."""

    layout = SidLayout(code_start=4, codebook_size=4, num_levels=3, sid_begin=16, sid_end=17)
    vocab_size = 100
    max_beam_rows = 8
    tokenizer: Any = None
    profiler: Any = SimpleNamespace(state="idle")

    def server_info(self) -> dict[str, Any]:
        return {}

    def build_prompt(self, **kwargs: Any) -> list[int]:
        return [1]

    def prompt_builders(self, count: int) -> list[PromptBuilder]:
        return [self.build_prompt] * count

    def sid_text_table(self) -> dict[int, str]:
        return {}

    def submit(self, req: GenRequest) -> Future:
        return Future()

    def cancel(self, rid: str) -> None:
        pass

    def start(self) -> None:
        pass

    def warmup(self) -> None:
        pass

    def freeze_gc(self) -> int:
        return 0

    def add_step_hook(self, fn: Callable[[int], None]) -> None:
        pass

    def drain(self, timeout_s: float) -> bool:
        return True

    def stop(self) -> None:
        pass

    def flush_cache(self) -> int:
        return 0

    def reload_catalog(
        self, path: str, packed_base: int | None = None, name: str | None = None
    ) -> dict[str, Any]:
        raise ValueError("this engine cannot reload its catalog")

    def rollback_catalog(self, name: str | None = None) -> dict[str, Any]:
        raise ValueError("this engine holds no previous catalog")

    def update_weights(self, model_path: str, label: str | None = None) -> dict[str, Any]:
        raise ValueError("this engine cannot update its weights")

    def metrics_snapshot(self) -> tuple[dict[str, int], str, None]:
        return {}, "idle", None
