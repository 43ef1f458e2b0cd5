"""Hypothesis-built request bodies against the real server: never a 5xx, always healthy after.

Bodies are drawn from four families: valid requests with small beams, valid requests with
one field replaced by an arbitrary JSON value, arbitrary JSON documents, and raw bytes. Each
body goes to one of the two generation endpoints (or the profiler's start endpoint).
"""

from __future__ import annotations

import json
from typing import Any

import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import ServerThread

EXAMPLES = 1000
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
