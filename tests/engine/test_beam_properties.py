"""Property tests of the constrained beam search on random catalogs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine

K = 64  # tiny preset codebook size


@pytest.fixture(scope="module")
def model_dir(synth_model):
    return synth_model("tiny")


def _engine(model_dir, tmp_path, codes, **kw) -> Engine:
    path = tmp_path / "cat.json"
    path.write_text(json.dumps({",".join(map(str, c)): {} for c in codes}))
    return Engine(
        EngineConfig(model_path=str(model_dir), sid_vocab_file=str(path), batch_slots=256, **kw)
    )


catalogs = st.lists(
    st.tuples(st.integers(0, K - 1), st.integers(0, K - 1), st.integers(0, K - 1)),
    min_size=1,
    max_size=60,
    unique=True,
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(codes=catalogs, n=st.integers(1, 40), temperature=st.sampled_from([0.0, 0.7]))
def test_results_valid_unique_sorted(model_dir, tmp_path, codes, n, temperature):
    eng = _engine(model_dir, tmp_path, codes)
    ids = eng.build_prompt(messages=[{"role": "user", "content": "u"}])
    res = eng.generate([eng.new_request(ids, n=n, temperature=temperature, seed=1)])[0]
    lay = eng.layout
    sids = [tuple(lay.token_to_code(t)[1] for t in b.token_ids[:-1]) for b in res.beams]
    assert set(sids) <= set(codes)
    assert len(sids) == len(set(sids)) == min(n, len(codes))
    assert all(b.token_ids[-1] == lay.sid_end and b.finish_reason == "stop" for b in res.beams)
    scores = [b.sequence_score for b in res.beams]
    assert scores == sorted(scores, reverse=True)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(codes=catalogs, scope=st.sampled_from(["level", "sid", "full"]))
def test_exhaustive_enumeration_agrees(model_dir, tmp_path, codes, scope):
    """With n >= |catalog| beam search returns every SID with its exact teacher-forced score."""
    from transformers import AutoModelForCausalLM

    eng = _engine(model_dir, tmp_path, codes, logprob_scope=scope)
    ids = eng.build_prompt(messages=[{"role": "user", "content": "enumerate"}])
    res = eng.generate([eng.new_request(ids, n=len(codes) + 3)])[0]
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    lay = eng.layout
    seqs = [[lay.code_to_token(i, c) for i, c in enumerate(sid)] + [lay.sid_end] for sid in codes]
    batch = torch.tensor([ids + s for s in seqs])
    with torch.no_grad():
        logits = hf(batch).logits.float()
    want = {}
    for r, s in enumerate(seqs):
        total = 0.0
        for j, tok in enumerate(s):
            row = logits[r, len(ids) - 1 + j]
            if j < 3:
                lo, hi = lay.level_range(j)
            else:
                lo, hi = lay.sid_end, lay.sid_end + 1
            if scope == "level":
                lp = torch.log_softmax(row[lo:hi], -1)[tok - lo]
            elif scope == "sid":
                a, b = lay.sid_range
                lp = torch.log_softmax(row[a:b], -1)[tok - a]
            else:
                lp = torch.log_softmax(row, -1)[tok]
            total += float(lp)
        want[tuple(s)] = total / len(s)
    got = {tuple(b.token_ids): b.sequence_score for b in res.beams}
    assert set(got) == set(want)
    for k, v in want.items():
        assert abs(got[k] - v) <= 1e-4
    ranked = sorted(want, key=lambda k: -want[k])
    assert np.allclose([got[k] for k in ranked], sorted(got.values(), reverse=True), atol=1e-4)


def test_beam_text_is_built_on_read_not_on_the_engine_thread(tiny_model):
    """Retiring a request stores the detokenizer, not the text; reading ``text`` builds it
    once (the HTTP handler's thread pays for it) and it equals the tokenizer's decode."""
    from flashrec.config import EngineConfig
    from flashrec.engine.engine import Engine

    eng = Engine(
        EngineConfig(model_path=str(tiny_model), sid_vocab_file=str(tiny_model / "catalog.json"))
    )
    res = eng.generate(
        [eng.new_request(eng.build_prompt(messages=[{"role": "user", "content": "hi"}]), n=4)]
    )[0]
    calls = []
    for b in res.beams:
        assert callable(b.text_source)
        src = b.text_source
        object.__setattr__(b, "text_source", lambda ids, src=src: calls.append(1) or src(ids))
        want = eng.tokenizer.decode(b.token_ids, skip_special_tokens=False)
        assert b.text == want and b.text == want  # built once, then cached
    assert len(calls) == len(res.beams)
