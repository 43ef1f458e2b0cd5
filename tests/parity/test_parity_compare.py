"""harness.parity comparison logic and the reference server's handlers (no model, no
network beyond an in-process test server): runs in the default test selection."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from harness.parity import (
    Beam,
    Case,
    body_for,
    compare_beams,
    detect_protocols,
    diff_table,
    evaluate,
    parity_result,
    parse_beams,
    request_for,
    spearman,
    thresholds_for,
)
from harness.servers.reference_server import create_app


def beams(*pairs) -> list[Beam]:
    return [Beam(tuple(ids), score) for ids, score in pairs]


REF = beams(([1, 2], -1.0), ([1, 3], -1.5), ([2, 2], -2.0), ([4, 4], -3.0))


def test_identical_lists_are_exact():
    m = compare_beams(REF, list(REF))
    assert m["exact"] and m["top1"] and m["overlap"] == 1.0 and m["spearman"] == 1.0
    assert m["max_score_diff"] == 0.0 and m["first_diff_rank"] is None


def test_swapped_ranks_and_score_noise():
    cand = beams(([1, 2], -1.00002), ([2, 2], -1.9), ([1, 3], -1.95), ([4, 4], -3.0))
    m = compare_beams(REF, cand)
    assert not m["exact"] and m["first_diff_rank"] == 1 and m["top1"]
    assert m["overlap"] == 1.0 and m["spearman"] == pytest.approx(0.8)
    assert m["max_score_diff"] == pytest.approx(0.45)


def test_missing_and_extra_beams():
    cand = beams(([1, 2], -1.0), ([9, 9], -1.2))
    m = compare_beams(REF, cand)
    assert m["overlap"] == 0.25 and m["shared"] == 1 and m["spearman"] is None
    assert compare_beams(REF, REF[:3])["first_diff_rank"] == 3


def test_spearman_reversed():
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert spearman([1], [1]) is None


def test_thresholds_and_evaluation():
    th = thresholds_for("float32")
    assert th.exact and th.max_score_diff == 1e-4
    assert thresholds_for("bf16", {"max_score_diff": 0.5}).max_score_diff == 0.5
    with pytest.raises(ValueError, match="known"):
        thresholds_for("int4")
    ok = Case("chat", 0, 4, compare_beams(REF, REF), REF, REF)
    noisy = beams(([1, 2], -1.0003), ([1, 3], -1.5), ([2, 2], -2.0), ([4, 4], -3.0))
    bad = Case("generate", 1, 4, compare_beams(REF, noisy), REF, noisy)
    assert evaluate([ok], th) == []
    fails = evaluate([ok, bad], th)
    assert len(fails) == 1 and "max |score diff|" in fails[0] and "prompt 1 n=4" in fails[0]
    assert evaluate([ok, bad], thresholds_for("bfloat16")) == []
    res = parity_result([ok, bad], th, "float32", ["chat", "generate"])
    assert res["status"] == "fail" and res["by_protocol"]["chat"]["exact"] == 1
    assert len(res["diff_tables"]) == 1 and "~" in res["diff_tables"][0]


def test_nothing_compared_never_passes():
    """No case, a case with no beam on a side, or a NaN score (JSON ``NaN`` parses) fails,
    at any precision: a comparison of nothing is not parity."""
    for precision in ("float32", "bfloat16"):
        th = thresholds_for(precision)
        assert evaluate([], th) == ["no case was compared (no prompt or no beam width ran)"]
        res = parity_result([], th, precision, ["chat"])
        assert res["status"] == "fail" and not res["passed"]
        empty = Case("chat", 0, 4, compare_beams([], []), [], [])
        assert any("no beams to compare (0 reference, 0 candidate)" in f
                   for f in evaluate([empty], th))  # fmt: skip
        half = Case("chat", 1, 4, compare_beams(REF, []), REF, [])
        assert any("no beams" in f for f in evaluate([half], th))
        nan = [Beam(REF[0].key, float("nan")), *REF[1:]]
        bad = Case("chat", 2, 4, compare_beams(REF, nan), REF, nan)
        fails = evaluate([bad], th)
        assert any("not a finite number" in f for f in fails), fails
        assert parity_result([bad], th, precision, ["chat"])["diff_tables"]


def test_diff_table_marks_differences():
    cand = beams(([1, 2], -1.0), ([2, 2], -1.9), ([1, 3], -1.95))
    case = Case("chat", 3, 4, compare_beams(REF, cand), REF, cand)
    table = diff_table(case)
    lines = table.splitlines()
    assert lines[0].startswith("prompt 3 n=4 (chat)")
    assert any(line.startswith("!") and "2,2" in line for line in lines)
    assert lines[-1].startswith("!") and lines[-1].rstrip().endswith("-")  # missing rank 3


def test_parse_both_protocols():
    chat = {
        "choices": [
            {"message": {"content": "a"}, "sglext": {"sequence_score": -1.5, "token_ids": [7, 8]}}
        ]
    }
    # upstream SGLang's beam answer (sglang/srt/beam_search/output.py): output_ids, no token_ids
    beam = {
        "output_ids": [7, 8],
        "text": "a",
        "meta_info": {"finish_reason": {"type": "stop", "matched": 8}, "sequence_score": -1.5},
    }
    gen = {
        "text": "a",
        "output_ids": [7, 8],
        "meta_info": {**beam["meta_info"], "beam_results": [beam]},
    }
    want = [Beam((7, 8), -1.5, "a")]
    assert parse_beams("chat", chat) == parse_beams("generate", gen) == want
    assert parse_beams("generate", [gen])[0].key == (7, 8)
    # FlashRec servers before output_ids named them token_ids
    old = {
        "meta_info": {
            "beam_results": [
                {"text": "a", "token_ids": [7, 8], "meta_info": {"sequence_score": -1.5}}
            ]
        }
    }
    assert parse_beams("generate", old) == want
    # identical beams from an upstream-shaped and a FlashRec-shaped server match exactly
    assert compare_beams(parse_beams("generate", gen), parse_beams("chat", chat))["exact"]


def test_upstream_chat_and_plain_answers():
    """Upstream SGLang's chat answers n samples (no sglext.sequence_score): not beams, with a
    message naming /generate. A beam_width-1 /generate is a plain generation: one beam scored
    by its mean token logprob (output_token_logprobs: (logprob, token id, text) triples)."""
    samples = {
        "choices": [
            {"index": i, "message": {"content": "x"}, "finish_reason": "stop"} for i in range(2)
        ]
    }
    with pytest.raises(ValueError, match="SGLANG_BEAM_PROTOCOL=generate"):
        parse_beams("chat", samples)
    plain = {
        "text": "ab",
        "output_ids": [7, 8],
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 8},
            "output_token_logprobs": [[-1.0, 7, None], [-2.0, 8, None]],
        },
    }
    assert parse_beams("generate", plain) == [Beam((7, 8), -1.5, "ab")]
    del plain["meta_info"]["output_token_logprobs"]
    with pytest.raises(ValueError, match="output_token_logprobs"):
        parse_beams("generate", plain)
    req = request_for([{"role": "user", "content": "x"}], "x", 1, 4)
    path, body = body_for("generate", req)
    assert path == "/generate" and body["return_logprob"] is True
    assert (
        "return_logprob" not in body_for("generate", replace(req, n=4))[1]
    )  # upstream refuses it with beams


def test_protocol_forced_by_env(monkeypatch):
    monkeypatch.setenv("SGLANG_BEAM_PROTOCOL", "generate")

    async def go():
        async with aiohttp.ClientSession() as s:
            return await detect_protocols(s, "http://127.0.0.1:9")

    assert asyncio.run(go()) == ["generate"]


class FakeRef:
    """Stands in for HFReference: two beams, the second one unfinished."""

    layout = SimpleNamespace(sid_end=99)
    depth = 3

    def build_prompt(self, **kw):
        if kw.get("messages") == [{"role": "user", "content": "boom"}]:
            raise ValueError("bad template")
        return [1, 2, 3]

    def generate(self, ids, n, max_tokens):
        return [
            SimpleNamespace(token_ids=[5, 6, 7, 99], sequence_score=-0.5, text="best"),
            SimpleNamespace(token_ids=[5, 6, 8], sequence_score=-0.7, text="next"),
        ][:n]


def test_reference_app_protocols():
    async def go():
        client = TestClient(
            TestServer(
                create_app(FakeRef(), {"engine": "hf-reference", "protocols": ["chat", "generate"]})
            )
        )
        await client.start_server()
        try:
            r = await client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "x"}], "n": 2},
            )
            chat = await r.json()
            r = await client.post(
                "/generate",
                json={"input_ids": [[1, 2], [3]], "sampling_params": {"beam_width": 2, "n": 2}},
            )
            gen = await r.json()
            r = await client.post(
                "/generate", json={"text": "x", "sampling_params": {"temperature": 0.5}}
            )
            hot = (r.status, await r.json())
            r = await client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "boom"}]}
            )
            boom = (r.status, await r.json())
            info = await (await client.get("/get_server_info")).json()
            protocols = await detect_protocols(client.session, str(client.make_url("")))
            return chat, gen, hot, boom, info, protocols
        finally:
            await client.close()

    chat, gen, hot, boom, info, protocols = asyncio.run(go())
    assert [c["finish_reason"] for c in chat["choices"]] == ["stop", "length"]
    assert chat["choices"][0]["sglext"] == {"sequence_score": -0.5, "token_ids": [5, 6, 7, 99]}
    assert chat["usage"]["completion_tokens"] == 7
    assert isinstance(gen, list) and len(gen) == 2
    second = gen[0]["meta_info"]["beam_results"][1]
    assert second["meta_info"] == {
        "finish_reason": {"type": "length", "length": 3},
        "sequence_score": -0.7,
    }
    assert gen[0]["output_ids"] == [5, 6, 7, 99] and second["output_ids"] == [5, 6, 8]
    assert gen[0]["meta_info"]["finish_reason"] == {"type": "stop", "matched": 99}
    assert hot[0] == 400 and hot[1]["error"]["param"] == "temperature"
    assert boom[0] == 400 and "bad template" in boom[1]["error"]["message"]
    assert info["engine"] == "hf-reference" and protocols == ["chat", "generate"]


def test_matrix_stage_adapter(monkeypatch, tmp_path):
    import harness.parity.stage as parity
    from harness.spec.matrix import StageSpec
    from harness.spec.model import ResolvedModel

    seen = {}

    def fake(spec, model_path, catalog, out_dir, resume=False):
        seen.update(
            spec=spec, model_path=model_path, catalog=catalog, out_dir=out_dir, resume=resume
        )
        return {"status": "pass", "passed": True, "cases": [1, 2], "diff_tables": ["t"] * 5}

    monkeypatch.setattr(parity, "run_parity_stage", fake)
    section = StageSpec(ns=[1, 4], precision="bf16")
    ctx = SimpleNamespace(model=ResolvedModel("/m", "/m/c.json", "h", "path", 3), out_dir=tmp_path)
    out = parity.run_stage(section, ctx)
    assert (
        seen["spec"] == {"ns": [1, 4], "precision": "bf16", "device": None}
        and seen["model_path"] == "/m"
        and seen["resume"] is False  # a context without --resume
    )
    parity.run_stage(section, SimpleNamespace(**vars(ctx), resume=True))
    assert seen["resume"] is True  # the run's --resume reaches the stage
    assert "cases" not in out and len(out["diff_tables"]) == 3
    assert out["details"] == str(tmp_path / "parity" / "parity.json")


def test_precision_args():
    from harness.parity import precision_args

    assert precision_args("float32") == (
        {"dtype": "float32", "quantization": "none"},
        {"dtype": "float32"},
    )
    assert precision_args("fp8")[0]["quantization"] == "fp8"


def test_reference_server_flags_offer_what_the_reference_implements():
    """reference_server's --search / --dtype choices are written out (its parser is built
    without importing torch); they must be what HFReference accepts."""
    import argparse

    from harness.cli.reference_server import add_reference_server_args
    from harness.servers import hf_reference
    from harness.servers.reference_server import DTYPES

    parser = argparse.ArgumentParser()
    add_reference_server_args(parser)
    choices = {a.dest: tuple(a.choices) for a in parser._actions if a.choices}
    assert choices["search"] == hf_reference.SEARCHES
    for dtype in DTYPES:  # every dtype the flag offers is one torch has
        assert isinstance(getattr(hf_reference.torch, dtype), hf_reference.torch.dtype)
