"""The response encoders the handlers send (``responses.*_json``) against the dict builders.

The handlers send the dict builders' bodies written by orjson (compact, UTF-8, NaN and
infinities as ``null``); these tests pin that the text is strict JSON holding exactly the
dict builders' values, that the engine's ``BeamColumns`` give the same body as the beams they
stand for, also over HTTP, and that the single request wait (``Backend.generate`` with one
request) still resolves and withdraws.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
from concurrent.futures import Future
from typing import Any

import pytest
from server_fakes import StubEngine
from server_helpers import fake_server

from flashrec.engine.request import BeamColumns, BeamResult, GenRequest, GenResult
from flashrec.server import responses
from flashrec.server.backend import Backend
from flashrec.server.errors import APIError
from flashrec.server.protocol import Limits, check_prompt

TEXTS = ["<s_a_1><s_b_2><s_c_3><|sid_end|>", "", 'q"uote\\back\nline\ttab\x01', "é中文😀", "%s %d"]
FLOATS = [-1.5, -0.0, 0.1, -1e-300, 1e300, float("inf"), float("-inf"), float("nan"), -3.0]


def random_result(rng: random.Random, n: int, lazy: bool = False) -> GenResult:
    beams = []
    for _ in range(n):
        toks = [rng.randrange(0, 200_000) for _ in range(rng.randrange(0, 6))]
        text: Any = rng.choice(TEXTS)
        if lazy:  # text built on read, as the engine does
            text = lambda ids, t=text: t  # noqa: E731
        beams.append(
            BeamResult(
                toks,
                rng.choice(FLOATS + [rng.uniform(-50, 0)]),
                rng.choice(FLOATS + [rng.uniform(-50, 0)]),
                rng.choice(["stop", "length"]),
                text,
            )
        )
    return GenResult(f"chatcmpl-{rng.randrange(10**9)}", beams, rng.randrange(1, 5000), 7)


def strict(text: str | bytes) -> Any:
    """``text`` parsed as strict JSON: NaN / Infinity tokens fail."""

    def refuse(token: str) -> None:
        raise AssertionError(f"non-strict JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def plain(obj: Any) -> Any:
    """``obj`` with every non-finite float as None (what the wire holds for it)."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def expected_stream_first(result: GenResult, model: str, created: int) -> bytes:
    head = {"id": result.rid, "object": "chat.completion.chunk", "created": created, "model": model}
    return responses.sse({**head, "choices": responses.chat_stream_choices(result)})


@pytest.mark.parametrize("n", [0, 1, 3, 50, 256])
def test_encoders_write_the_dict_builders_as_strict_json(n: int) -> None:
    rng = random.Random(n)
    for trial in range(20):
        res = random_result(rng, n, lazy=trial % 2 == 1)
        model = rng.choice(["m", "模型", 'a"b'])
        text = responses.chat_completion_json(res, model, 1234)
        want = responses.chat_completion(res, model, 1234)
        assert strict(text) == plain(want) and list(strict(text)) == list(want)  # key order
        assert [c["message"]["content"] for c in strict(text)["choices"]] == [
            b.text for b in res.beams
        ]
        latency = rng.choice([0.0123, float("nan"), 5.0])
        text = responses.generate_result_json(res, latency)
        assert strict(text) == plain(responses.generate_result(res, latency))
        events = list(responses.chat_stream(res, model, 99))
        assert events[0] == expected_stream_first(res, model, 99)
        assert strict(events[0].removeprefix(b"data: ")) == plain(
            {
                "id": res.rid, "object": "chat.completion.chunk", "created": 99, "model": model,
                "choices": responses.chat_stream_choices(res),
            }
        )  # fmt: skip
        assert events[1:] == [
            responses.sse(
                {
                    "id": res.rid,
                    "object": "chat.completion.chunk",
                    "created": 99,
                    "model": model,
                    "choices": [],
                    "usage": responses.usage(res),
                }
            ),
            b"data: [DONE]\n\n",
        ]


def test_wire_text_is_compact_utf8_with_null_for_nan() -> None:
    beams = [BeamResult([5, 9], float("nan"), -0.5, "stop", "é中")]
    text = responses.chat_completion_json(GenResult("r", beams, 3), "m", 7)
    assert '"content":"é中"' in text and '"cum_logprob":null' in text
    assert '"sequence_score":-0.5' in text and ": " not in text


@pytest.mark.parametrize("n", [0, 1, 3, 256])
def test_beam_columns_encode_as_the_beams_they_hold(n: int) -> None:
    """The engine's ``BeamColumns`` (no beam objects) give every body the same text as the
    list of ``BeamResult`` they stand for; NaN / infinite scores included."""
    rng = random.Random(100 + n)
    for _ in range(10):
        res = random_result(rng, n)
        beams = res.beams

        def text(ids: list[int]) -> str:
            return TEXTS[sum(ids) % len(TEXTS)]

        cols = BeamColumns(
            [b.token_ids for b in beams], [b.cum_logprob for b in beams],
            [b.sequence_score for b in beams], [b.finish_reason for b in beams], text,
        )  # fmt: skip
        as_cols = GenResult(res.rid, cols, res.prompt_tokens, res.cached_tokens)
        as_list = GenResult(res.rid, list(cols), res.prompt_tokens, res.cached_tokens)
        want_chat = responses.chat_completion_json(as_list, "m", 1)
        assert responses.chat_completion_json(as_cols, "m", 1) == want_chat
        assert [c["message"]["content"] for c in strict(want_chat)["choices"]] == [
            text(b.token_ids) for b in beams
        ]
        want_gen = responses.generate_result_json(as_list, 0.5)
        assert responses.generate_result_json(as_cols, 0.5) == want_gen
        assert list(responses.chat_stream(as_cols, "m", 2)) == list(
            responses.chat_stream(as_list, "m", 2)
        )


def test_generate_answer_has_sglang_beam_shape() -> None:
    """Upstream SGLang's beam answer (sglang/srt/beam_search/output.py): the best beam's
    text, output_ids and meta_info at the top level, every beam in meta_info.beam_results,
    finish reasons as objects; cum_logprob is our addition."""
    beams = [
        BeamResult([5, 6, 9], -1.5, -0.5, "stop", "a"),
        BeamResult([5, 7], -2.0, -1.0, "length", "b"),
    ]
    res = GenResult("rid1", beams, 11, 4)
    request_meta = {
        "id": "rid1", "prompt_tokens": 11, "completion_tokens": 5, "cached_tokens": 4,
        "e2e_latency": 0.25,
    }  # fmt: skip
    best_meta = {
        **request_meta,
        "finish_reason": {"type": "stop", "matched": 9},
        "sequence_score": -0.5,
        "cum_logprob": -1.5,
    }
    results = [
        {"output_ids": [5, 6, 9], "text": "a", "meta_info": best_meta},
        {
            "output_ids": [5, 7],
            "text": "b",
            "meta_info": {
                "finish_reason": {"type": "length", "length": 2},
                "sequence_score": -1.0,
                "cum_logprob": -2.0,
            },
        },
    ]
    want = {
        "text": "a",
        "output_ids": [5, 6, 9],
        "meta_info": {**best_meta, "beam_results": results},
    }
    assert responses.generate_result(res, 0.25) == want
    assert strict(responses.generate_result_json(res, 0.25)) == want
    cols = BeamColumns.from_beams(beams, lambda ids: "ab"[len(ids) % 2 == 0])
    top = responses.returned(GenResult("rid1", cols, 11, 4), 1)
    assert isinstance(top.beams, BeamColumns) and top.completion_tokens == 3
    assert strict(responses.generate_result_json(top, 0.25))["meta_info"]["beam_results"] == [
        {**results[0], "meta_info": {**best_meta, "completion_tokens": 3}}
    ]
    assert responses.returned(res, None) is res and responses.returned(res, 5) is res


class _Score(float):
    pass


@pytest.mark.parametrize(
    ("beam", "ids", "score", "cum", "reason"),
    [
        (BeamResult([1, True, 3], -1.0, -0.5, "stop", "t"), [1, True, 3], -0.5, -1.0, "stop"),
        (BeamResult((1, 2), -1.0, -0.5, "stop", "t"), [1, 2], -0.5, -1.0, "stop"),
        (BeamResult([1, 2], _Score(-1.0), 3, "stop", "t"), [1, 2], 3.0, -1.0, "stop"),
        (BeamResult([1, 2], -1.0, -0.5, None, "t"), [1, 2], -0.5, -1.0, None),  # type: ignore[arg-type]
    ],
)
def test_non_plain_beam_values_are_written_as_json_values(beam, ids, score, cum, reason) -> None:
    """Values of other types than the engine's: a tuple of ids is a list, a float subclass
    or an int score a float (``num``), a bool token ``true``, a missing reason ``null``."""
    plain_beam = BeamResult([7], -2.0, -1.0, "length", "x")
    res = GenResult("r", [plain_beam, beam], 3)
    choice = strict(responses.chat_completion_json(res, "m", 5))["choices"][1]
    assert choice["sglext"] == {"sequence_score": score, "token_ids": ids, "cum_logprob": cum}
    assert choice["finish_reason"] == reason
    assert isinstance(choice["sglext"]["sequence_score"], float)
    gen = strict(responses.generate_result_json(res, 0.5))["meta_info"]["beam_results"][1]
    assert gen["output_ids"] == ids and gen["meta_info"]["sequence_score"] == score
    assert next(responses.chat_stream(res, "m", 5)) == expected_stream_first(res, "m", 5)


def test_unencodable_values_raise_type_error() -> None:
    class Token(int):
        def __repr__(self) -> str:
            return "Token()"

    res = GenResult("r", [BeamResult([Token(3)], -1.0, -1.0, "stop", "x")], 1)
    # int subclasses are written by value
    assert strict(responses.chat_completion_json(res, "m", 1))["choices"][0]["sglext"][
        "token_ids"
    ] == [3]
    bad = GenResult("r", [BeamResult([object()], -1.0, -1.0, "stop", "x")], 1)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        responses.chat_completion_json(bad, "m", 1)
    with pytest.raises(TypeError):
        responses.generate_result_json(bad, 0.5)


class _Capture:
    """Records the engine result of every request a fake server answers."""

    def __init__(self, loop: Any) -> None:
        self.results: dict[str, GenResult] = {}
        submit = loop.submit

        def wrapped(req: GenRequest) -> Future:
            fut = submit(req)
            fut.add_done_callback(lambda f: self.results.__setitem__(req.rid, f.result()))
            return fut

        loop.submit = wrapped


def test_http_bodies_are_the_dict_builders_as_sent() -> None:
    with fake_server() as srv:
        cap = _Capture(srv.served)
        chat = {"messages": [{"role": "user", "content": "hé"}], "n": 40, "model": "m1"}
        r = srv.post("/v1/chat/completions", chat)
        assert r.status_code == 200
        assert r.headers["Content-Type"] == "application/json; charset=utf-8"
        body = r.json()
        res = cap.results[body["id"]]
        want = responses.dumps(responses.chat_completion(res, "m1", body["created"])).encode()
        assert r.content == want and strict(r.content)["choices"][0]["index"] == 0

        for batched in (False, True):
            text = ["abc", "defg"] if batched else "abc"
            r = srv.post("/generate", {"text": text, "sampling_params": {"n": 5}})
            assert r.status_code == 200
            assert r.headers["Content-Type"] == "application/json; charset=utf-8"
            outs = r.json() if batched else [r.json()]
            dicts = [
                responses.generate_result(
                    cap.results[o["meta_info"]["id"]], o["meta_info"]["e2e_latency"]
                )
                for o in outs
            ]
            assert r.content == responses.dumps(dicts if batched else dicts[0]).encode()


class _ThreadEngine(StubEngine):
    """An engine whose futures another thread resolves on demand."""

    def __init__(self) -> None:
        self.futures: dict[str, Future] = {}
        self.cancelled: list[str] = []
        self.submitted = threading.Event()

    def submit(self, req: GenRequest) -> Future:
        fut: Future = Future()
        self.futures[req.rid] = fut
        self.submitted.set()
        return fut

    def cancel(self, rid: str) -> None:
        self.cancelled.append(rid)


LIMITS = Limits(max_beam_rows=8, vocab_size=100, max_seq_len=64, default_n=2, default_max_tokens=4)


def test_single_request_wakes_on_engine_thread_resolve() -> None:
    eng = _ThreadEngine()
    be = Backend(engine=eng, limits=LIMITS)
    req = GenRequest("r1", [1, 2], 2, 4)
    want = GenResult("r1", [], 2)

    def engine_thread() -> None:
        eng.submitted.wait(30)
        eng.futures["r1"].set_result(want)  # resolved off the event eng's thread

    t = threading.Thread(target=engine_thread)
    t.start()
    try:
        assert asyncio.run(asyncio.wait_for(be.generate([req]), 30)) == [want]
    finally:
        t.join()
        be.close()
    assert not be.inflight and eng.cancelled == []


def test_single_request_cancelled_wait_withdraws() -> None:
    eng = _ThreadEngine()
    be = Backend(engine=eng, limits=LIMITS)

    async def main() -> None:
        task = asyncio.ensure_future(be.generate([GenRequest("r2", [1], 2, 4)]))
        while "r2" not in eng.futures:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    be.close()
    assert eng.cancelled == ["r2"] and not be.inflight
    assert not eng.futures["r2"].cancelled()  # left to the engine


def test_single_request_engine_error_is_500() -> None:
    eng = _ThreadEngine()
    be = Backend(engine=eng, limits=LIMITS)

    async def main() -> None:
        task = asyncio.ensure_future(be.generate([GenRequest("r3", [1], 2, 4)]))
        while "r3" not in eng.futures:
            await asyncio.sleep(0)
        eng.futures["r3"].set_result(GenResult("r3", [], 1, error="boom"))
        with pytest.raises(APIError) as info:
            await task
        assert info.value.status == 500

    asyncio.run(main())
    be.close()
    assert not be.inflight


@pytest.mark.parametrize(
    ("ids", "bad"), [([1, 100], 100), ([5, -1, 200], -1), ([99, 0, 150, -3], 150)]
)
def test_check_prompt_names_the_first_bad_token(ids: list[int], bad: int) -> None:
    with pytest.raises(APIError) as info:
        check_prompt(ids, LIMITS, "messages")
    assert f"token id {bad} is outside the vocabulary" in str(info.value.body())
    check_prompt([0, 99], LIMITS, "messages")
    check_prompt([], LIMITS, "messages")


class _SlowPromptEngine(StubEngine):
    """Prompt builders that block (release the GIL, like the Rust tokenizer) and record which
    builder served them: builder 0 (the engine's own), then numbered copies. The first
    ``parallel`` builds wait for each other at a barrier: they can only pass if that many run
    at once (a build that runs alone breaks it after its timeout)."""

    def __init__(self, parallel: int) -> None:
        self.copies = 0
        self.active: set[int] = set()
        self.peak = 0
        self.lock = threading.Lock()
        self.calls = 0
        self.barrier = threading.Barrier(parallel, timeout=30)

    def _run(self, who: int, ids) -> list[int]:
        import time

        with self.lock:
            assert who not in self.active, f"builder {who} used by two threads at once"
            self.active.add(who)
            self.peak = max(self.peak, len(self.active))
            self.calls += 1
            first = self.calls <= self.barrier.parties
        if first:
            self.barrier.wait()
        time.sleep(0.01)
        with self.lock:
            self.active.discard(who)
        return [int(t) for t in ids]

    def prompt_builders(self, count: int):
        return [
            lambda input_ids=None, **_: self._run(0, input_ids),
            *map(self._copy, range(count - 1)),
        ]

    def _copy(self, _: int):
        self.copies += 1
        who = self.copies
        return lambda input_ids=None, **_: self._run(who, input_ids)


@pytest.mark.parametrize("workers", [1, 3])
def test_prompts_build_in_parallel_on_private_builders(workers: int) -> None:
    """``tokenizer_workers`` threads build prompts at once, each borrowing a builder no other
    thread holds (a HF fast tokenizer must not be shared by two threads); the first worker uses
    the engine's own tokenizer, the others and the large-prompt lane a copy each."""
    eng = _SlowPromptEngine(parallel=workers)
    be = Backend(engine=eng, limits=LIMITS, tokenizer_workers=workers)

    async def main() -> list[list[int]]:
        return await asyncio.gather(
            *(be.build_prompt("input_ids", input_ids=[i, 1]) for i in range(6))
        )

    try:
        got = asyncio.run(main())
    finally:
        be.close()
    assert got == [[i, 1] for i in range(6)]
    assert eng.copies == workers
    assert eng.peak == workers


def test_nums_pass_finite_floats_through_and_map_anything_else() -> None:
    """``nums``: the engine's scores (finite floats) go to the body as they are; a list with a
    non-finite value, an int or a numpy float is mapped through ``num`` (null, float)."""
    finite = [-1.5, -0.0, 1e300, -3.0]
    assert responses.nums(finite) is finite
    assert list(responses.nums([-1.5, float("nan"), float("-inf")])) == [-1.5, None, None]
    mapped = list(responses.nums([-3, -1.5]))
    assert mapped == [-3.0, -1.5] and type(mapped[0]) is float
    np = pytest.importorskip("numpy")
    mapped = list(responses.nums([np.float64(-2.5), -1.0]))
    assert mapped == [-2.5, -1.0] and type(mapped[0]) is float
    rows = [[1, 2], [3, 4]]
    assert responses.lists(rows) is rows
    assert list(responses.lists([(1, 2), [3, 4]])) == [[1, 2], [3, 4]]
