"""HTTP surface over the fake engine: shapes, every bad-input case, 413, 503, 500, SSE."""

from __future__ import annotations

import json
import socket

import pytest
from server_fakes import FAIL_MARKER
from server_helpers import ServerThread, fake_server

CHAT = {"messages": [{"role": "user", "content": "hello"}], "n": 3}


def assert_error(resp, status: int, param: str | None = "<any>") -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["message"]
    if status == 400:
        assert err["type"] == "invalid_request_error"
    if param != "<any>":
        assert err["param"] == param
    return err


def test_health_models_info(fake: ServerThread) -> None:
    assert fake.get("/health").json() == {"status": "ok"}
    models = fake.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "fake-model"
    info = fake.get("/get_server_info").json()
    assert info["config"]["beam_width"] == 4
    assert info["sid_layout"]["num_levels"] == 3
    assert info["limits"]["max_beam_rows"] == 256
    assert {"flashrec", "torch", "aiohttp", "python"} <= set(info["versions"])


def test_chat_shape(fake: ServerThread) -> None:
    body = fake.post("/v1/chat/completions", {**CHAT, "model": "m1", "extra_field": [1]}).json()
    assert body["object"] == "chat.completion" and body["model"] == "m1"
    assert body["id"].startswith("chatcmpl-")
    choices = body["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    scores = [c["sglext"]["sequence_score"] for c in choices]
    assert scores == sorted(scores, reverse=True)
    for c in choices:
        assert c["message"]["role"] == "assistant"
        assert c["message"]["content"].endswith("<|sid_end|>")
        assert c["finish_reason"] == "stop"
        assert len(c["sglext"]["token_ids"]) == 4
        assert isinstance(c["sglext"]["cum_logprob"], float)
    usage = body["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12
    assert "cached_tokens" in usage["prompt_tokens_details"]


def test_chat_defaults_and_text_parts(fake: ServerThread) -> None:
    parts = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}],
            }
        ]
    }
    a = fake.post("/v1/chat/completions", parts).json()
    assert len(a["choices"]) == 4  # --beam-width
    assert a["model"] == "fake-model"
    b = fake.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hello"}],
            "max_completion_tokens": 2,
            "max_tokens": 9,
        },
    ).json()
    assert all(len(c["sglext"]["token_ids"]) == 2 for c in b["choices"])
    assert b["choices"][0]["finish_reason"] == "length"


def test_chat_stream(fake: ServerThread) -> None:
    resp = fake.post("/v1/chat/completions", {**CHAT, "stream": True}, stream=True)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = [ln for ln in resp.text.split("\n\n") if ln]
    assert len(events) == 3 and events[-1] == "data: [DONE]"
    first = json.loads(events[0].removeprefix("data: "))
    usage = json.loads(events[1].removeprefix("data: "))
    plain = fake.post("/v1/chat/completions", CHAT).json()
    assert first["object"] == "chat.completion.chunk"
    assert [c["delta"]["content"] for c in first["choices"]] == [
        c["message"]["content"] for c in plain["choices"]
    ]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12


def test_generate_shapes(fake: ServerThread) -> None:
    one = fake.post(
        "/generate", {"text": "hello", "sampling_params": {"n": 2, "beam_width": 3}}
    ).json()
    meta = one["meta_info"]
    assert len(meta["beam_results"]) == 2  # 3 beams searched, the best n = 2 returned
    best = meta["beam_results"][0]
    assert [one["text"], one["output_ids"]] == [best["text"], best["output_ids"]]
    for k in ("id", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency"):
        assert k in meta and k in best["meta_info"]  # upstream: the best beam's meta_info
    assert meta["completion_tokens"] == sum(len(b["output_ids"]) for b in meta["beam_results"])
    other = meta["beam_results"][1]
    assert set(other) == {"output_ids", "text", "meta_info"}
    assert set(other["meta_info"]) == {"sequence_score", "cum_logprob", "finish_reason"}
    assert other["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    alone = fake.post("/generate", {"text": "hello", "sampling_params": {"beam_width": 3}})
    assert len(alone.json()["meta_info"]["beam_results"]) == 1  # upstream's default n = 1
    ids = fake.post(
        "/generate", {"input_ids": [104, 105], "sampling_params": {"n": 1, "max_new_tokens": 1}}
    )
    assert len(ids.json()["meta_info"]["beam_results"][0]["output_ids"]) == 1
    assert ids.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 1}
    too_many = fake.post("/generate", {"text": "a", "sampling_params": {"n": 4, "beam_width": 3}})
    assert too_many.status_code == 400
    assert too_many.json()["error"]["param"] == "sampling_params.n"
    batch = fake.post("/generate", {"text": ["a", "b"], "sampling_params": {"n": 2}}).json()
    assert isinstance(batch, list) and len(batch) == 2
    stream = fake.post("/generate", {"text": "a", "stream": True}).text.split("\n\n")
    assert stream[1] == "data: [DONE]"
    assert "beam_results" in json.loads(stream[0].removeprefix("data: "))["meta_info"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [3]}, "messages[0]"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
        ({**CHAT, "n": 0}, "n"),
        ({**CHAT, "n": -3}, "n"),
        ({**CHAT, "n": 257}, "n"),
        ({**CHAT, "n": "3"}, "n"),
        ({**CHAT, "n": True}, "n"),
        ({**CHAT, "n": 2.0}, "n"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "max_completion_tokens": -1}, "max_completion_tokens"),
        ({**CHAT, "temperature": -0.1}, "temperature"),
        ({**CHAT, "temperature": "hot"}, "temperature"),
        ({**CHAT, "seed": -1}, "seed"),
        ({**CHAT, "seed": 1.5}, "seed"),
        ({**CHAT, "stream": "yes"}, "stream"),
        ({**CHAT, "model": 7}, "model"),
        ({**CHAT, "chat_template_kwargs": [1]}, "chat_template_kwargs"),
        ([CHAT], None),
        ("hello", None),
        (None, None),
    ],
)
def test_chat_bad_input(fake: ServerThread, body, param) -> None:
    assert_error(fake.post("/v1/chat/completions", data=json.dumps(body)), 400, param)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_temperature_not_finite(fake: ServerThread, literal: str) -> None:
    raw = '{"messages": [{"role": "user", "content": "x"}], "temperature": ' + literal + "}"
    assert_error(fake.post("/v1/chat/completions", data=raw), 400, "temperature")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "text"),
        ({"text": "a", "input_ids": [1]}, "text"),
        ({"text": 5}, "text"),
        ({"text": ""}, "text"),
        ({"text": []}, "text"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [1, "2"]}, "input_ids"),
        ({"input_ids": [1, 10**6]}, "input_ids"),
        ({"input_ids": [-1]}, "input_ids"),
        ({"input_ids": [[1], 2]}, "input_ids[1]"),
        ({"text": "a", "sampling_params": [1]}, None),
        ({"text": "a", "sampling_params": {"n": 0}}, "sampling_params.n"),
        ({"text": "a", "sampling_params": {"beam_width": 1000}}, "sampling_params.beam_width"),
        ({"text": "a", "sampling_params": {"max_new_tokens": 0}}, "sampling_params.max_new_tokens"),
        ({"text": "a", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ],
)
def test_generate_bad_input(fake: ServerThread, body, param) -> None:
    assert_error(fake.post("/generate", body), 400, param)


def test_malformed_json_and_empty_body(fake: ServerThread) -> None:
    for raw in ['{"messages": [', "", "   ", "\xff\xfe", "[" * 100000]:
        assert_error(fake.post("/v1/chat/completions", data=raw.encode("latin-1")), 400)
        assert_error(fake.post("/generate", data=raw.encode("latin-1")), 400)


def test_prompt_too_long(fake: ServerThread) -> None:
    long = {"messages": [{"role": "user", "content": "x" * 5000}]}
    assert_error(fake.post("/v1/chat/completions", long), 400, "messages")
    assert_error(fake.post("/generate", {"input_ids": [1] * 4097}), 400, "input_ids")


def test_unknown_route_and_method(fake: ServerThread) -> None:
    err = assert_error(fake.get("/nope"), 404)
    assert err["type"] == "not_found_error"
    assert_error(fake.get("/v1/chat/completions"), 405)


def test_body_too_large() -> None:
    with fake_server(max_body_bytes=2048) as srv:
        big = {"messages": [{"role": "user", "content": "x" * 4096}]}
        assert_error(srv.post("/v1/chat/completions", big), 413)
        assert_error(srv.post("/generate", {"text": "y" * 4096}), 413)
        assert srv.get("/health").status_code == 200
        m = srv.metrics()
        assert m['flashrec_requests_total{endpoint="chat",outcome="too_large"}'] == 1


def test_batch_failure_is_500_and_counted(fake: ServerThread) -> None:
    bad = {"messages": [{"role": "user", "content": FAIL_MARKER}]}
    err = assert_error(fake.post("/v1/chat/completions", bad), 500)
    assert "injected failure" in err["message"] and err["type"] == "internal_error"
    assert fake.post("/v1/chat/completions", CHAT).status_code == 200
    m = fake.metrics()
    assert m["flashrec_batch_failures_total"] >= 1
    assert m['flashrec_requests_total{endpoint="chat",outcome="error"}'] >= 1


def test_queue_full_is_503_with_retry_after() -> None:
    import concurrent.futures as cf

    import requests

    with fake_server(step_delay_s=0.05, max_queue_len=2, batch_slots=4) as srv:
        body = {"messages": [{"role": "user", "content": "slow"}], "n": 4}
        with cf.ThreadPoolExecutor(12) as pool:
            futs = [
                pool.submit(requests.post, srv.url + "/v1/chat/completions", json=body, timeout=60)
                for _ in range(12)
            ]
            resps = [f.result() for f in futs]
        codes = sorted(r.status_code for r in resps)
        assert 200 in codes and 503 in codes and set(codes) <= {200, 503}
        busy = next(r for r in resps if r.status_code == 503)
        assert busy.headers["Retry-After"] == "1"
        assert busy.json()["error"]["type"] == "server_busy"
        m = srv.metrics()
        assert m['flashrec_requests_total{endpoint="chat",outcome="rejected"}'] == codes.count(503)
        assert srv.get("/health").status_code == 200


def test_flush_cache_and_cached_tokens(fake: ServerThread) -> None:
    system = {"role": "system", "content": "s" * 300}
    a = {"messages": [system, {"role": "user", "content": "first"}], "n": 2}
    b = {"messages": [system, {"role": "user", "content": "second"}], "n": 2}
    assert fake.post("/flush_cache").json()["success"] is True
    cold = fake.post("/v1/chat/completions", b).json()
    assert fake.get("/flush_cache").status_code == 200
    fake.post("/v1/chat/completions", a)
    warm = fake.post("/v1/chat/completions", b).json()
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 300
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["choices"] == cold["choices"]


def test_metrics_text(fake: ServerThread) -> None:
    fake.post("/v1/chat/completions", CHAT)
    resp = fake.get("/metrics")
    assert resp.headers["Content-Type"].startswith("text/plain")
    m = fake.metrics()
    for name in (
        "flashrec_queue_length",
        "flashrec_running_requests",
        "flashrec_slots_used",
        "flashrec_slots_total",
        "flashrec_kv_tokens_used",
        "flashrec_kv_tokens_total",
        "flashrec_prefix_cache_hit_tokens_total",
        "flashrec_ready",
    ):
        assert name in m, name
    assert m["flashrec_slots_total"] == 256
    assert m['flashrec_requests_total{endpoint="chat",outcome="success"}'] >= 1
    count = m['flashrec_request_latency_seconds_count{endpoint="chat"}']
    assert m['flashrec_request_latency_seconds_bucket{endpoint="chat",le="+Inf"}'] == count
    assert "# TYPE flashrec_request_latency_seconds histogram" in resp.text


def test_raw_socket_garbage_keeps_serving(fake: ServerThread) -> None:
    host, port = "127.0.0.1", fake.server.port
    for payload in (b"GARBAGE\r\n\r\n", b"POST /generate HTTP/1.1\r\nContent-Length: 99\r\n\r\n{"):
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            s.recv(4096)
    assert fake.get("/health").status_code == 200


def test_metrics_do_not_walk_the_frozen_generation(monkeypatch) -> None:
    """A scrape must not count the permanent generation: ``gc.get_freeze_count`` walks every
    frozen object (tens of ms holding the GIL for a serving process's ~800k), which would
    stall the server, or the engine thread, at every Prometheus scrape. The freeze's own full
    collection is not counted as a pause."""
    from flashrec.server import gcwatch

    watch = gcwatch.GcWatch(slow_s=0.0).install()  # every counted pause would be "slow"
    gcwatch.gc.disable()  # no automatic collection in between: only the freeze's own runs
    try:
        assert gcwatch.freeze_startup_objects(watch) == watch.frozen > 1000
        # the freeze's own full collection is deliberate: not counted, not slow
        assert watch.slow == 0 and watch.collections == [0, 0, 0]
        gcwatch.gc.enable()
        calls = []
        monkeypatch.setattr(gcwatch.gc, "get_freeze_count", lambda: calls.append(1) or 0)
        for _ in range(3):
            assert watch.metrics()["frozen"] == watch.frozen
        assert calls == []
    finally:
        gcwatch.gc.enable()
        monkeypatch.undo()
        watch.uninstall()
        import gc

        gc.unfreeze()


def test_gc_freeze_and_pause_metrics() -> None:
    """``--gc-freeze``: once ready, the start-up objects sit in the permanent generation (a
    full collection no longer walks them) and ``/metrics`` counts collections and pauses;
    shutdown unfreezes them (an in-process server leaves the process as it found it)."""
    import gc

    assert gc.get_freeze_count() == 0
    with fake_server(gc_freeze=True) as srv:
        frozen = gc.get_freeze_count()
        assert frozen > 1000
        gc.collect(2)  # one full collection, timed by the server's watch
        m = srv.metrics()
        # the count taken at the freeze (frozen objects freed since have left the generation)
        assert m["flashrec_gc_frozen_objects"] >= frozen
        assert m['flashrec_gc_collections_total{generation="2"}'] >= 1
        assert m['flashrec_gc_pause_seconds_total{generation="2"}'] > 0
        assert m["flashrec_gc_pause_max_seconds"] > 0
        assert "flashrec_gc_slow_pauses_total" in m
    assert gc.get_freeze_count() == 0
    with fake_server() as srv:  # the helper's default: no freeze
        assert gc.get_freeze_count() == 0 and srv.metrics()["flashrec_gc_frozen_objects"] == 0


def test_gc_gen0_threshold_is_set_while_serving_and_restored_after() -> None:
    """``--gc-gen0-threshold N``: the collector runs a generation-0 collection every N
    allocations while the server runs (``/metrics`` says so), the older generations' settings
    kept; an in-process server restores the threshold it found. 0 (the default) changes
    nothing; a negative value is refused."""
    import gc

    from flashrec.config import ServerConfig

    before = gc.get_threshold()
    with fake_server(gc_gen0_threshold=50_000) as srv:
        assert gc.get_threshold() == (50_000, *before[1:])
        assert srv.metrics()["flashrec_gc_gen0_threshold"] == 50_000

        def collections() -> float:  # any generation: a due older one takes gen 0's turn
            m = srv.metrics()
            return sum(m[f'flashrec_gc_collections_total{{generation="{g}"}}'] for g in range(3))

        gc.collect(0)  # the allocation count from zero
        seen = collections()
        junk = [[i] for i in range(20_000)]  # 20k container allocations: under the threshold
        assert collections() == seen
        junk += [[i] for i in range(40_000)]  # past it: one collection at least
        assert collections() > seen
        del junk
    assert gc.get_threshold() == before
    with fake_server() as srv:
        assert gc.get_threshold() == before
        assert srv.metrics()["flashrec_gc_gen0_threshold"] == before[0]
    with pytest.raises(ValueError, match="--gc-gen0-threshold"):
        ServerConfig(model_path="x", gc_gen0_threshold=-1)
