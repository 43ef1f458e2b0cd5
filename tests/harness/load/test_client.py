"""External servers by URL over both protocols (no lifecycle): requests, records, validity."""

from __future__ import annotations

import asyncio

import aiohttp

from harness.load.client import Record, Request, generate_body, send
from harness.load.loop import Target, closed_loop, flush_cache
from harness.load.sids import SidChecker
from harness.load.workload import Prompt, PromptRenderer, builtin_template

MESSAGES = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]


async def one(url: str, protocol: str, n: int = 4, text: str | None = None) -> Record:
    req = Request(
        Prompt(0, MESSAGES, truth=((1, 2, 3),)), n=n, max_tokens=4, temperature=0.0, text=text
    )
    rec = Record("c", 0, "measure", 0, 0, 0.0)
    async with aiohttp.ClientSession() as s:
        return await send(s, url, protocol, req, rec, SidChecker(3), 10.0, [1, 10])


def test_chat_protocol(fake_url):
    r = asyncio.run(one(fake_url, "chat", n=8))
    assert r.ok and r.http_status == 200 and r.beams == 8
    assert r.invalid == 0 and r.duplicates == 0
    assert r.prompt_tokens > 0 and r.cached_tokens == 0
    assert r.t_send < r.t_first_byte <= r.t_end
    assert set(r.quality) >= {"hit@1", "recall@10", "ndcg@10", "mrr@10"}


def test_generate_protocol(fake_url):
    text = PromptRenderer(None).render(MESSAGES)
    assert text == builtin_template(MESSAGES) + "<|sid_begin|>"
    assert text.startswith("<|im_start|>system\nsys<|im_end|>")
    r = asyncio.run(one(fake_url, "generate", n=5, text=text))
    assert r.ok and r.beams == 5 and r.invalid == 0
    body = generate_body(Request(Prompt(0, MESSAGES), 5, 4, 0.0, text=text))
    assert body["sampling_params"] == {
        "beam_width": 5,
        "n": 5,
        "max_new_tokens": 4,
        "temperature": 0.0,
    }


def test_http_errors_are_recorded_not_raised(fake_url):
    r = asyncio.run(one(fake_url, "generate", text="no sid_begin at the end"))
    assert r.status == "http_error" and r.http_status == 400 and "sid_begin" in r.error
    r = asyncio.run(one("http://127.0.0.1:1", "chat"))
    assert r.status == "error" and r.error


def test_closed_loop_and_radix_over_both_protocols(fake_url):
    renderer = PromptRenderer(None)

    async def run(protocol: str) -> list[Record]:
        prompts = [Prompt(i, [MESSAGES[0], {"role": "user", "content": f"u{i}"}]) for i in range(6)]
        reqs = [Request(p, 4, 4, 0.0, text=renderer.render(p.messages)) for p in prompts]
        target = Target(fake_url, protocol, SidChecker(3), 10.0, [1])
        async with aiohttp.ClientSession() as s:
            ok, _ = await flush_cache(s, fake_url)
            assert ok
            return await closed_loop(s, target, reqs, 3, ("c", 0, "measure"))

    for protocol in ("chat", "generate"):
        recs = asyncio.run(run(protocol))
        assert [r.index for r in recs] == list(range(6))
        assert all(r.ok for r in recs)
        # after a flush the first request is cold; later ones hit the shared system prompt
        assert recs[0].cached_tokens == 0 or any(r.cached_tokens for r in recs[1:])


class SlowChecker(SidChecker):
    """A SID check that costs the client ``cost_s`` of blocking CPU time per response."""

    def __init__(self, cost_s: float) -> None:
        super().__init__(3)
        self.cost_s = cost_s
        self.calls = 0
        self.started: list[float] = []  # when each check began, on the client's clock

    def check(self, texts):
        import time

        from harness.load.client import now

        self.calls += 1
        self.started.append(now())
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:  # busy: holds the event loop like json + set look-ups
            pass
        return super().check(texts)


def test_response_checks_never_delay_other_requests(fake_url):
    """Parsing and SID checks run after the load: with a check costing 60 ms of client CPU per
    response, no check starts before the last of 8 requests (concurrency 4) has its answer
    (inline, each latency would absorb the checks of the responses read before it, and the
    closed loop would send late). Every record is still parsed and checked."""
    import time

    checker = SlowChecker(0.06)
    prompts = [Prompt(i, [MESSAGES[0], {"role": "user", "content": f"q{i}"}]) for i in range(8)]
    reqs = [Request(p, 4, 4, 0.0) for p in prompts]

    async def run() -> tuple[list[Record], float]:
        target = Target(fake_url, "chat", checker, 10.0, [1])
        async with aiohttp.ClientSession() as s:
            await closed_loop(s, target, reqs[:2], 2, ("c", -1, "warmup"))  # connections up
            checker.calls, checker.started = 0, []
            t0 = time.perf_counter()
            recs = await closed_loop(s, target, reqs, 4, ("c", 0, "measure"))
            return recs, time.perf_counter() - t0

    recs, wall = asyncio.run(run())
    assert checker.calls == 8 and all(r.ok and r.beams == 4 for r in recs)
    assert wall >= 8 * 0.06  # the checks did run
    last_end = max(r.t_end for r in recs)
    assert min(checker.started) >= last_end, "a check ran while requests were in flight"


def test_pending_bodies_past_the_limit_are_finished_at_once(fake_url):
    from harness.load.client import Pending

    checker = SidChecker(3)
    pending = Pending("chat", checker, [1], limit_bytes=0)
    req = Request(Prompt(0, MESSAGES), 4, 4, 0.0)
    rec = Record("c", 0, "measure", 0, 0, 0.0)

    async def run() -> None:
        async with aiohttp.ClientSession() as s:
            await send(s, fake_url, "chat", req, rec, checker, 10.0, [1], pending)

    asyncio.run(run())
    assert rec.beams == 4 and not pending.items and pending.held_bytes == 0
    bad = Record("c", 0, "measure", 1, 0, 0.0)
    pending.add(bad, req, b"not json")
    assert bad.status == "error" and "JSONDecodeError" in bad.error


def test_client_gc_is_off_during_a_round_only(fake_url):
    """The harness's own garbage collector never runs inside a measured round (a full
    collection would stall its event loop and read as server latency); it is back on once
    the round is over."""
    import gc

    from harness.load.loop import run_load
    from harness.spec.cells import ClientSettings

    seen: list[bool] = []
    reqs = [Request(Prompt(i, MESSAGES), 4, 4, 0.0) for i in range(4)]

    async def run() -> list[Record]:
        target = Target(fake_url, "chat", SidChecker(3), 10.0, [1])
        async with aiohttp.ClientSession() as s:
            return await run_load(
                s,
                target,
                reqs,
                ClientSettings(
                    mode="closed",
                    concurrency=2,
                    rate=None,
                    duration_s=None,
                    requests=4,
                    warmup_requests=0,
                    beam_width=4,
                    max_tokens=4,
                    temperature=0.0,
                    seed=None,
                    radix="warm",
                    request_timeout_s=10.0,
                    median_tokens=16,
                    spread=0.0,
                    system_prompt_tokens=0,
                ),
                ("c", 0, "measure"),
                0,
                on_done=lambda rec: seen.append(gc.isenabled()),
            )

    assert gc.isenabled()
    recs = asyncio.run(run())
    assert len(recs) == 4 and all(r.ok for r in recs)
    assert seen == [False] * 4
    assert gc.isenabled()


def test_burst_load_sends_each_burst_after_the_previous_one_is_answered(fake_url):
    """``burst``: ``size`` requests sent together; the next burst only once all are answered;
    indices continue across bursts; makespans per complete burst are round metrics."""
    from harness.load.loop import burst_loop
    from harness.metrics.rounds import burst_extra, round_metrics

    prompts = [Prompt(i, [{"role": "user", "content": f"b{i}"}]) for i in range(7)]
    reqs = [Request(p, 4, 4, 0.0) for p in prompts]
    target = Target(fake_url, "chat", SidChecker(3), 10.0, [1])

    async def run() -> list[Record]:
        async with aiohttp.ClientSession() as s:
            return await burst_loop(s, target, reqs, 3, ("c", 0, "measure"))

    recs = asyncio.run(run())
    assert [r.index for r in recs] == list(range(7))
    assert all(r.ok and r.beams == 4 for r in recs)  # parsed (after the last burst)
    bursts = [recs[0:3], recs[3:6], recs[6:7]]
    for before, after in zip(bursts, bursts[1:]):
        assert min(r.t_send for r in after) >= max(r.t_end for r in before)
    # within a burst every request was sent before any answer came back
    for b in bursts[:2]:
        assert max(r.t_send for r in b) <= min(r.t_end for r in b)
    m = round_metrics(recs, burst_extra(3))
    spans = [(max(r.t_end for r in b) - min(r.t_send for r in b)) * 1000 for b in bursts[:2]]
    assert abs(m["burst_ms_mean"] - sum(spans) / 2) < 1e-9  # the partial last burst is left out
    assert abs(m["burst_ms_max"] - max(spans)) < 1e-9
    assert "burst_ms_mean" not in round_metrics(recs)  # other load modes: no burst metrics


def test_an_answer_without_beams_is_an_error_not_a_success():
    """A 200 answer that lists no beam (OpenAI ``choices: []``, SGLang ``beam_results: []``)
    recommends nothing: the record is an error (counted by error_rate), never a request that
    passed the validity and error gates with nothing checked."""
    import json

    from harness.load.client import fill_record

    sid = "<|sid_begin|><s_a_1><s_b_2><s_c_3><|sid_end|>"
    usage = {"prompt_tokens": 9, "completion_tokens": 5}
    bodies = {
        "chat": (
            {"choices": [], "usage": usage},
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": sid}}],
             "usage": usage},
        ),
        "generate": (
            {"text": "", "meta_info": {"prompt_tokens": 9, "beam_results": []}},
            {"text": sid, "meta_info": {"prompt_tokens": 9, "beam_results": [{"text": sid}]}},
        ),
    }  # fmt: skip
    req = Request(Prompt(0, MESSAGES), n=1, max_tokens=4, temperature=0.0)
    for protocol, (empty, one_beam) in bodies.items():
        rec = fill_record(Record("c", 0, "measure", 0, 0, 0.0), req, json.dumps(empty).encode(),
                          protocol, SidChecker(3), [1])  # fmt: skip
        assert rec.status == "error" and "no beams" in rec.error and not rec.ok, protocol
        rec = fill_record(Record("c", 0, "measure", 0, 0, 0.0), req, json.dumps(one_beam).encode(),
                          protocol, SidChecker(3), [1])  # fmt: skip
        assert rec.ok and rec.beams == 1 and rec.invalid == 0, (protocol, rec)
