"""Engine vs HF transformers beam search (float32, CPU): identical ranked sequences and
|score difference| <= 1e-4 for every logprob scope, several model shapes, n in {1,4,16,64},
with a catalog, a catalog smaller than n, and no catalog."""

from __future__ import annotations

import pytest

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine
from harness.servers.hf_reference import HFReference

PROMPTS = [
    [{"role": "user", "content": "history: watched 12, clicked 7, bought 301"}],
    [
        {"role": "system", "content": "You recommend items."},
        {"role": "user", "content": "User likes sci-fi, owns item 4451; recent: 88, 91, 1337."},
    ],
    [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "part one; "},
                {"type": "text", "text": "part two"},
            ],
        }
    ],
]
NS = [1, 4, 16, 64]

SHAPES = {
    "tiny": {},
    "gqa4-hd32-untied": {"num_key_value_heads": 1, "head_dim": 32, "tie_word_embeddings": False},
    "mha-hd8": {
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "hidden_size": 48,
    },
}


def _compare(engine: Engine, ref: HFReference, prompts=PROMPTS, ns=NS, max_tokens=None):
    reqs, keys = [], []
    for p in prompts:
        ids = engine.build_prompt(messages=p)
        assert ids == ref.build_prompt(messages=p)
        for n in ns:
            reqs.append(engine.new_request(ids, n=n, max_tokens=max_tokens))
            keys.append((ids, n))
    results = engine.generate(reqs)  # all in one continuously batched run
    checked = 0
    for (ids, n), res in zip(keys, results):
        want = ref.generate(ids, n, max_tokens=max_tokens)
        got = [(b.token_ids, b.sequence_score) for b in res.beams]
        assert [g[0] for g in got] == [w.token_ids for w in want], f"n={n}: ranked sequences differ"
        assert len(got) <= n
        for (_, s1), w in zip(got, want):
            assert abs(s1 - w.sequence_score) <= 1e-4
        checked += len(got)
    assert checked > 0


@pytest.mark.parametrize("scope", ["level", "sid", "full"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_parity_with_catalog(synth_model, scope, shape):
    path = synth_model("tiny", catalog_size=2000, **SHAPES[shape])
    cat = str(path / "catalog.json")
    engine = Engine(
        EngineConfig(model_path=str(path), sid_vocab_file=cat, logprob_scope=scope, batch_slots=512)
    )
    _compare(engine, HFReference(str(path), cat, logprob_scope=scope))


@pytest.mark.parametrize("scope", ["level", "sid", "full"])
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_parity_other_backbones(synth_model, preset, scope):
    """Llama (no q/k norm, untied) and Qwen2 (q/k/v biases) through the same registry/engine."""
    path = synth_model(preset, catalog_size=2000)
    cat = str(path / "catalog.json")
    engine = Engine(
        EngineConfig(model_path=str(path), sid_vocab_file=cat, logprob_scope=scope, batch_slots=512)
    )
    arch = {"tiny-llama": "LlamaForCausalLM", "tiny-qwen2": "Qwen2ForCausalLM"}[preset]
    assert engine.model_config.architecture == arch
    _compare(engine, HFReference(str(path), cat, logprob_scope=scope), prompts=PROMPTS[:2])


@pytest.mark.parametrize("scope", ["level", "sid", "full"])
def test_parity_catalog_smaller_than_n(synth_model, scope):
    path = synth_model("tiny", catalog_size=40, seed=1)
    cat = str(path / "catalog.json")
    engine = Engine(
        EngineConfig(model_path=str(path), sid_vocab_file=cat, logprob_scope=scope, batch_slots=512)
    )
    ref = HFReference(str(path), cat, logprob_scope=scope)
    _compare(engine, ref, prompts=PROMPTS[:2])
    res = engine.generate([engine.new_request(engine.build_prompt(messages=PROMPTS[0]), n=64)])[0]
    assert len(res.beams) == 40  # every catalog SID, never padding


@pytest.mark.parametrize("scope", ["level", "sid", "full"])
def test_parity_without_catalog(synth_model, scope):
    path = synth_model("tiny")
    engine = Engine(EngineConfig(model_path=str(path), logprob_scope=scope, batch_slots=512))
    _compare(engine, HFReference(str(path), None, logprob_scope=scope), prompts=PROMPTS[:2])


def test_parity_length_cap_and_penalty(synth_model):
    path = synth_model("tiny", catalog_size=2000)
    cat = str(path / "catalog.json")
    engine = Engine(
        EngineConfig(
            model_path=str(path), sid_vocab_file=cat, length_penalty=0.5, logprob_scope="sid"
        )
    )
    ref = HFReference(str(path), cat, logprob_scope="sid", length_penalty=0.5)
    _compare(engine, ref, prompts=PROMPTS[:1], ns=[4, 16], max_tokens=2)
    res = engine.generate(
        [engine.new_request(engine.build_prompt(messages=PROMPTS[0]), n=4, max_tokens=2)]
    )[0]
    assert all(b.finish_reason == "length" and len(b.token_ids) == 2 for b in res.beams)


def test_reference_prefill_in_chunks_matches_the_whole_prompt(synth_model):
    """The HF reference's chunked prefill (the default for float32 on CUDA) answers as the
    whole-prompt prefill does, and so as the engine: a prompt of several chunks, n=16."""
    import torch

    from harness.servers.hf_reference import resolve_prefill_chunk

    path = synth_model("tiny", catalog_size=2000)
    cat = str(path / "catalog.json")
    whole = HFReference(str(path), cat)
    chunked = HFReference(str(path), cat, prefill_chunk=64)
    assert (whole.prefill_chunk, chunked.prefill_chunk) == (0, 64)
    msgs = [{"role": "user", "content": "watched " + ", ".join(str(i) for i in range(150))}]
    ids = whole.build_prompt(messages=msgs)
    assert len(ids) > 4 * 64
    seen = []  # token rows per forward of the chunked reference: chunks of 64, then one per step
    hook = chunked.model.get_input_embeddings().register_forward_hook(
        lambda _m, inp, _o: seen.append(inp[0].shape[-1])
    )
    want, got = whole.generate(ids, 16), chunked.generate(ids, 16)
    hook.remove()
    assert seen[: len(ids) // 64] == [64] * (len(ids) // 64) and sum(seen) >= len(ids)
    assert [b.token_ids for b in got] == [b.token_ids for b in want] and len(got) == 16
    assert max(abs(a.sequence_score - b.sequence_score) for a, b in zip(got, want)) <= 1e-5
    engine = Engine(EngineConfig(model_path=str(path), sid_vocab_file=cat))
    _compare(engine, chunked, prompts=[msgs], ns=[16])
    assert resolve_prefill_chunk(None, "cuda", torch.float32) == 512
    assert resolve_prefill_chunk(None, "cuda", torch.bfloat16) == 0
    assert resolve_prefill_chunk(None, "cpu", torch.float32) == 0
    with pytest.raises(ValueError, match=">= 0"):
        resolve_prefill_chunk(-1, "cpu", torch.float32)


def _same_up_to_ties(got, want, tol: float) -> None:
    """Equal ranked beams, except that beams whose scores are within ``tol`` of each other may
    swap places or trade the last places (two float32 reduction orders on a near-flat model)."""
    assert got and len(got) == len(want)
    assert max(abs(a.sequence_score - b.sequence_score) for a, b in zip(got, want)) <= tol
    for mine, other in ((got, want), (want, got)):
        theirs, floor = {tuple(b.token_ids) for b in other}, other[-1].sequence_score
        for b in mine:
            assert tuple(b.token_ids) in theirs or b.sequence_score <= floor + tol, b
    for a, b in zip(got, want):
        if a.token_ids != b.token_ids:
            assert abs(a.sequence_score - b.sequence_score) <= tol


SEARCH_PROMPTS = [
    *PROMPTS[:2],
    [{"role": "user", "content": "saw " + ", ".join(map(str, range(90)))}],
]


@pytest.mark.parametrize("scope", ["level", "sid", "full"])
@pytest.mark.parametrize("catalog", ["2000", "40", "none"])
def test_shared_search_is_hf_beam_search(synth_model, monkeypatch, scope, catalog):
    """The shared-prompt search (one prefill, beams over its cache) ranks the same beams with
    the same scores as HF generate: every scope, a catalog, one smaller than n, none, n up to
    256, a length cap with a length penalty, and decode forwards split into several chunks."""
    import harness.servers.hf_reference as hf_reference

    size = {"2000": 2000, "40": 40, "none": None}[catalog]
    path = synth_model("tiny", **({"catalog_size": size, "seed": 1} if size else {}))
    cat = str(path / "catalog.json") if size else None
    kw = {"logprob_scope": scope, "length_penalty": 0.5}
    hf = HFReference(str(path), cat, search="generate", **kw)
    shared = HFReference(str(path), cat, search="shared", prefill_chunk=32, **kw)
    # 160 cache rows per decode forward: a 90-number prompt's beams go in chunks of one or two
    monkeypatch.setattr(hf_reference, "_SHARED_KV_ROWS", 160)
    forwards = []
    hook = shared.model.get_input_embeddings().register_forward_hook(
        lambda _m, inp, _o: forwards.append(tuple(inp[0].shape))
    )
    for msgs in SEARCH_PROMPTS:
        ids = hf.build_prompt(messages=msgs)
        for n, cap in ((1, None), (16, None), (256, None), (16, 2)):
            forwards.clear()
            want, got = hf.generate(ids, n, max_tokens=cap), shared.generate(ids, n, max_tokens=cap)
            assert [b.token_ids for b in got] == [b.token_ids for b in want], (n, cap)
            assert max(abs(a.sequence_score - b.sequence_score) for a, b in zip(got, want)) <= 1e-4
            assert len(got) == min(n, size or n)
            # the prompt goes through the model once, in chunks of 32, one row each
            chunks = -(-len(ids) // 32)
            assert forwards[:chunks] == [(1, min(32, len(ids) - 32 * i)) for i in range(chunks)]
            assert all(rows * (len(ids) + 4) <= 160 or rows == 1 for rows, _ in forwards[chunks:])
            assert all(cols == 1 for _, cols in forwards[chunks:])
    hook.remove()


def test_search_resolution():
    import torch

    from harness.servers.hf_reference import resolve_search

    assert resolve_search(None, "cuda", torch.float32) == "shared"
    assert resolve_search(None, "cuda", torch.bfloat16) == "generate"
    assert resolve_search(None, "cpu", torch.float32) == "generate"
    assert resolve_search("shared", "cpu", torch.float32) == "shared"
    with pytest.raises(ValueError, match="generate, shared"):
        resolve_search("beam", "cpu", torch.float32)


@pytest.mark.gpu
def test_gpu_float32_reference_chunked_shared_agrees(synth_model):
    """On CUDA in float32 the reference defaults to the shared search over a prompt prefilled
    in 512-token chunks; it ranks HF generate's beams over the whole prompt, up to near-ties
    (float32 reduction orders differ between the two; the tiny model's scores are near-flat)."""
    import torch

    path = synth_model("tiny", catalog_size=2000)
    cat = str(path / "catalog.json")
    shared = HFReference(str(path), cat, device="cuda", dtype=torch.float32)
    hf = HFReference(
        str(path), cat, device="cuda", dtype=torch.float32, prefill_chunk=0, search="generate"
    )
    assert (shared.prefill_chunk, shared.search, hf.prefill_chunk) == (512, "shared", 0)
    msgs = [{"role": "user", "content": "watched " + ", ".join(str(i) for i in range(400))}]
    ids = shared.build_prompt(messages=msgs)
    assert len(ids) > 3 * 512
    for n in (1, 64, 256):
        _same_up_to_ties(shared.generate(ids, n), hf.generate(ids, n), 1e-4)
