"""The official ``openai`` Python client against a real FlashRec server (tiny checkpoint).

An independent client of our ``/v1/chat/completions``: ``n`` is the beam width, FlashRec's own
request fields go through ``extra_body`` and its own answer fields (``sglext``) are read from
the client's objects (``model_extra``, pydantic's store of fields outside OpenAI's schema).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from server_helpers import ServerThread

from harness.load.client import Record, Request, chat_body, send
from harness.load.sids import SidChecker, load_catalog_sids, parse_sid
from harness.load.workload import Prompt

openai = pytest.importorskip("openai", reason="the openai package is not installed (dev extra)")

N = 8
MESSAGES = [
    {"role": "system", "content": "You are a recommender."},
    {"role": "user", "content": "User history: watched item 12 (music); liked item 7 (pets)"},
]


@pytest.fixture(scope="module")
def client(real: ServerThread):
    with openai.OpenAI(base_url=real.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def catalog(tiny_checkpoint: Path) -> set:
    return load_catalog_sids(tiny_checkpoint / "catalog.json")


def _create(client, **kw):
    return client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        n=N,
        max_tokens=4,
        temperature=0,
        # FlashRec's field beyond OpenAI's schema: chat-template variables
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        **kw,
    )


def test_n_beams_are_catalog_sids_ranked_by_our_sequence_score(client, catalog):
    resp = _create(client)
    assert resp.object == "chat.completion" and len(resp.choices) == N
    assert [c.index for c in resp.choices] == list(range(N))
    sids = [parse_sid(c.message.content, 3) for c in resp.choices]
    assert all(s in catalog for s in sids), [c.message.content for c in resp.choices]
    assert len(set(sids)) == N  # beams are distinct SIDs
    ext = [c.model_extra["sglext"] for c in resp.choices]
    scores = [e["sequence_score"] for e in ext]
    assert all(isinstance(s, float) and s < 0 for s in scores)
    assert scores == sorted(scores, reverse=True)  # best first
    assert all(len(e["token_ids"]) == 4 for e in ext)  # 3 levels + <|sid_end|>
    assert {c.finish_reason for c in resp.choices} == {"stop"}
    assert resp.usage.completion_tokens == 4 * N
    assert resp.usage.prompt_tokens > 0


def test_the_openai_client_reads_what_the_harness_client_gets(client, real, catalog):
    """The same request through the harness's body builder (raw JSON) and its ``send`` (the
    record a benchmark keeps): the same beams, in the same order, with the same scores."""
    resp = _create(client)
    req = Request(Prompt(0, MESSAGES), n=N, max_tokens=4, temperature=0.0, model="tiny")
    body = {**chat_body(req), "chat_template_kwargs": {"enable_thinking": False}}

    async def harness_side() -> tuple[dict, Record]:
        async with aiohttp.ClientSession() as s:
            async with s.post(real.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                raw = json.loads(await r.read())
            rec = Record("openai", 0, "measure", 0, 0, 0.0)
            await send(s, real.url, "chat", req, rec, SidChecker(3, catalog), 60.0, [])
        return raw, rec

    raw, rec = asyncio.run(harness_side())
    assert [c.message.content for c in resp.choices] == [
        c["message"]["content"] for c in raw["choices"]
    ]
    ours = [c.model_extra["sglext"]["sequence_score"] for c in resp.choices]
    theirs = [c["sglext"]["sequence_score"] for c in raw["choices"]]
    assert ours == pytest.approx(theirs, abs=1e-6)
    assert rec.ok and rec.beams == N and rec.invalid == 0 and rec.duplicates == 0
    assert rec.top1 == "-".join(map(str, parse_sid(resp.choices[0].message.content, 3)))


def test_streamed_answer_carries_every_beam_in_one_chunk(client, catalog):
    chunks = list(_create(client, stream=True))
    beams = [c for c in chunks if c.choices]
    assert len(beams) == 1 and len(beams[0].choices) == N
    sids = [parse_sid(c.delta.content, 3) for c in beams[0].choices]
    assert all(s in catalog for s in sids)
    scores = [c.model_extra["sglext"]["sequence_score"] for c in beams[0].choices]
    assert scores == sorted(scores, reverse=True)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4 * N


def test_a_bad_beam_width_is_the_clients_bad_request_error(client, real):
    limit = real.get("/get_server_info").json()["limits"]["max_beam_rows"]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, n=limit + 1, max_tokens=4, temperature=0
        )
    assert exc.value.status_code == 400 and "'n' must be in" in str(exc.value)
