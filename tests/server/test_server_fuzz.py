"""Hypothesis-built requests against the real server: never a 5xx, always healthy after.

Bodies are drawn from four families: valid requests with small beams, valid requests with
one field replaced by an arbitrary JSON value, arbitrary JSON documents, and raw bytes. Each
body goes to one of the two generation endpoints (or the profiler's start endpoint).

``test_fuzz_wire`` sends them from raw sockets with the headers around them drawn too
(``Content-Encoding`` true, false or unknown, ``Content-Type``, ``Transfer-Encoding``,
``Content-Length``, sizes around ``--max-body-bytes``, compression bombs) and asserts every
request an answer, no 5xx, the same answer to a fixed request before and after, and no slot
or KV token held after. ``FLASHREC_FUZZ_REQUESTS=5000`` makes it a long run (default 600).
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raw_http import exchange, request_bytes
from server_helpers import ServerThread, real_server

EXAMPLES = 1000
WIRE_EXAMPLES = int(os.environ.get("FLASHREC_FUZZ_REQUESTS", "600"))
WIRE_LIMIT = 1 << 16  # --max-body-bytes of the wire fuzz's server: oversized bodies stay cheap
TOKEN_LIMIT = 600  # the tiny model's vocabulary is ~455 ids

leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
any_json = st.recursive(
    leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)
text = st.text(max_size=40) | st.sampled_from(
    ["<s_a_1><s_b_2>", "<|sid_begin|>", "<|im_end|>", "\ud800", "x" * 3000]
)
content = text | st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": text}),
    max_size=3,
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "x", ""]),
        "content": content,
    },
)
template_kwargs = st.dictionaries(
    st.sampled_from(["enable_thinking", "tools", "documents", "chat_template", "tokenize", "foo"]),
    leaf,
    max_size=2,
)
chat_fields = {
    "n": st.integers(-2, 6),
    "max_tokens": st.integers(-1, 6),
    "max_completion_tokens": st.integers(0, 6),
    "temperature": st.floats(-1, 3),
    "seed": st.integers(-5, 2**64),
    "stream": st.booleans(),
    "model": st.text(max_size=8),
    "chat_template_kwargs": template_kwargs,
    "top_p": any_json,
    "stop": any_json,
}
loose_chat = st.fixed_dictionaries(
    {"messages": st.lists(message, min_size=0, max_size=3)}, optional=chat_fields
)
good_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant"]),
        "content": st.text(max_size=30)
        | st.lists(
            st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}),
            min_size=1,
            max_size=2,
        ),
    }
)
valid_chat = st.fixed_dictionaries(
    {"messages": st.lists(good_message, min_size=1, max_size=3)},
    optional={
        "n": st.integers(1, 6),
        "max_tokens": st.integers(1, 6),
        "temperature": st.floats(0, 3),
        "seed": st.integers(0, 2**63 - 1),
        "stream": st.booleans(),
        "model": st.text(max_size=8),
        "unknown": any_json,
    },
)
token_ids = st.lists(st.integers(-3, TOKEN_LIMIT), min_size=0, max_size=30)
sampling = st.fixed_dictionaries(
    {},
    optional={
        "n": st.integers(-1, 6),
        "beam_width": st.integers(-1, 6),
        "max_new_tokens": st.integers(-1, 6),
        "temperature": st.floats(-1, 3),
        "seed": st.integers(-3, 2**63),
        "sampling_seed": st.integers(0, 10),
    },
)
loose_generate = st.fixed_dictionaries(
    {"sampling_params": sampling},
    optional={
        "text": text | st.lists(text, max_size=3),
        "input_ids": token_ids | st.lists(token_ids, max_size=3),
        "stream": st.booleans(),
        "rid": any_json,
    },
)
good_sampling = st.fixed_dictionaries(
    {},
    optional={
        "n": st.integers(1, 6),
        "beam_width": st.integers(1, 6),
        "max_new_tokens": st.integers(1, 6),
        "temperature": st.floats(0, 3),
        "seed": st.integers(0, 100),
    },
)
valid_generate = st.one_of(
    st.fixed_dictionaries(
        {"text": st.text(min_size=1, max_size=30), "sampling_params": good_sampling}
    ),
    st.fixed_dictionaries(
        {
            "input_ids": st.lists(st.integers(0, 400), min_size=1, max_size=20),
            "sampling_params": good_sampling,
        }
    ),
)


def mutate(base: st.SearchStrategy, keys: list[str]) -> st.SearchStrategy:
    return st.tuples(base, st.sampled_from(keys), any_json).map(lambda t: {**t[0], t[1]: t[2]})


chat_body = st.one_of(
    valid_chat, loose_chat, mutate(valid_chat, ["messages", *chat_fields]), any_json
)
generate_body = st.one_of(
    valid_generate,
    loose_generate,
    mutate(valid_generate, ["text", "input_ids", "sampling_params"]),
    any_json,
)
raw = st.binary(max_size=48)

request_case = st.one_of(
    st.tuples(st.just("/v1/chat/completions"), chat_body.map(json.dumps)),
    st.tuples(st.just("/generate"), generate_body.map(json.dumps)),
    st.tuples(st.sampled_from(["/v1/chat/completions", "/generate", "/start_profile"]), raw),
)


def test_fuzz_no_5xx_and_healthy_after(real: ServerThread) -> None:
    session = requests.Session()
    seen: dict[int, int] = {}

    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=request_case)
    def run(case: tuple[str, Any]) -> None:
        path, data = case
        resp = session.post(
            real.url + path, data=data, timeout=60, headers={"Content-Type": "application/json"}
        )
        seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
        assert resp.status_code < 500, (path, data, resp.text)
        body = (
            resp.json()
            if resp.headers.get("Content-Type", "").startswith("application/json")
            else None
        )
        if resp.status_code >= 400:
            assert body is not None and set(body["error"]) == {"message", "type", "param", "code"}
        if path == "/start_profile" and resp.status_code == 200:
            assert session.post(real.url + "/stop_profile", timeout=60).status_code == 200

    run()
    print("statuses", seen)
    assert sum(seen.values()) >= EXAMPLES
    assert seen.get(200, 0) > 200 and seen.get(400, 0) > 200, seen
    assert real.get("/health").json() == {"status": "ok"}
    m = real.metrics()
    assert m["flashrec_slots_used"] == 0 and m["flashrec_kv_tokens_used"] == 0
    ok = real.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200


# -- the wire: headers and framing around the bodies ----------------------------------------

FIXED = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "fixed"}], "n": 4},
    "/generate": {"text": "fixed", "sampling_params": {"n": 4}},
}
VOLATILE = {"id", "created", "e2e_latency", "cached_tokens", "prompt_tokens_details"}
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=24)


def stable(value: Any) -> Any:
    """``value`` without the fields that change between two equal requests."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def encode(data: bytes, chain: list[str]) -> bytes:
    for coding in chain:
        data = gzip.compress(data) if coding == "gzip" else zlib.compress(data)
    return data


@st.composite
def wire_case(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], bool]:
    """(path, the bytes of the body as sent, headers, whether to add Content-Length)."""
    path = draw(st.sampled_from(sorted(FIXED)))
    body = draw(
        st.one_of(
            (chat_body if path == "/v1/chat/completions" else generate_body).map(json.dumps),
            st.just(json.dumps(FIXED[path])),
        ).map(str.encode)
        | raw
    )
    size = draw(
        st.sampled_from([None, None, None, WIRE_LIMIT - 64, WIRE_LIMIT + 1, 3 * WIRE_LIMIT])
    )
    if size is not None and size > len(body):
        body += b" " * (size - len(body))  # trailing spaces keep JSON valid
    headers: dict[str, str] = {}
    chain = draw(
        st.sampled_from([[], [], ["gzip"], ["deflate"], ["deflate", "gzip"], ["gzip"] * 5])
    )
    how = draw(st.sampled_from(["true", "true", "plain", "truncated", "bomb", "unknown"]))
    if how == "bomb":
        body, chain = gzip.compress(b" " * (4 * WIRE_LIMIT)), ["gzip"]
    elif chain and how != "plain":
        body = encode(body, chain)
        if how == "truncated":
            body = body[: len(body) // 2]
    if how == "unknown":
        chain = [draw(st.sampled_from(["br", "zstd", "compress", "identity", "*"]) | header_text)]
    if chain:
        headers["Content-Encoding"] = ", ".join(chain)
    ctype = draw(
        st.sampled_from(
            [None, "application/json", "text/plain", "application/json; charset=utf-16"]
        )
        | header_text
    )
    if ctype is not None:
        headers["Content-Type"] = ctype
    framing = draw(st.sampled_from(["length", "length", "chunked", "te", "short", "none", "empty"]))
    if framing == "chunked":
        headers["Transfer-Encoding"] = "chunked"
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
    elif framing == "te":
        headers["Transfer-Encoding"] = draw(
            st.sampled_from(["gzip", "chunked, gzip", "identity", "foo, chunked", "gzip, chunked"])
            | header_text
        )
    elif framing == "short":
        headers["Content-Length"] = str(len(body) // 2)
    elif framing == "empty":
        headers["Content-Length"] = ""
    if draw(st.booleans()):
        headers[draw(st.sampled_from(["Expect", "X-Fuzz", "Accept-Encoding", "Host"]))] = draw(
            st.sampled_from(["100-continue", "gzip"]) | header_text
        )
    return path, body, headers, framing != "none"


@pytest.fixture(scope="module")
def wire_server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    """The real engine behind a small body limit and read timeouts of a few seconds."""
    with real_server(
        tiny_checkpoint, max_body_bytes=WIRE_LIMIT, header_timeout_s=5.0, body_timeout_s=3.0
    ) as srv:
        yield srv


def test_fuzz_wire(wire_server: ServerThread) -> None:
    srv = wire_server
    port = srv.server.port
    fixed_before = {p: stable(srv.post(p, b).json()) for p, b in FIXED.items()}
    statuses: collections.Counter[int] = collections.Counter()
    drops: list[tuple] = []

    @settings(
        max_examples=WIRE_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=wire_case())
    def run(case: tuple[str, bytes, dict[str, str], bool]) -> None:
        path, body, headers, length = case
        ans = exchange(port, request_bytes(path, body, headers, length=length), timeout=60)
        statuses[ans.status] += 1
        if ans.dropped:
            drops.append((path, headers, len(body), ans.error))
        assert not ans.dropped, (path, headers, body[:200], ans.error)
        assert ans.status < 500, (path, headers, body[:200], ans.body)
        if ans.status >= 400:
            err = ans.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["code"] == ans.status

    run()
    m = srv.wait_engine_idle()
    fixed_after = {p: stable(srv.post(p, b).json()) for p, b in FIXED.items()}
    five = {k: v for k, v in m.items() if k.startswith("flashrec_http_errors_total") and '"5' in k}
    errors = sum(
        v for k, v in m.items() if k.startswith("flashrec_requests_total") and "error" in k
    )
    summary = {
        "requests": sum(statuses.values()),
        "statuses": dict(sorted(statuses.items())),
        "5xx": sum(n for s, n in statuses.items() if s >= 500),
        "drops": len(drops),
        "answers_unchanged": fixed_after == fixed_before,
        "slots_used": m["flashrec_slots_used"],
        "kv_tokens_used": m["flashrec_kv_tokens_used"],
        "metrics_5xx": five,
        "metrics_outcome_error": errors,
    }
    print("FUZZ_SUMMARY " + json.dumps(summary))
    assert summary["requests"] >= WIRE_EXAMPLES
    assert fixed_after == fixed_before
    assert m["flashrec_slots_used"] == 0 and m["flashrec_kv_tokens_used"] == 0
    assert not five and errors == 0
    # every family was reached: answers, bad input, coding and size refusals
    assert statuses[200] and statuses[400] and statuses[413] and statuses[415], statuses
