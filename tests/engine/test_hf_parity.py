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


@pytest.mark.gpu
def test_gpu_float32_reference_prefills_in_chunks_and_agrees(synth_model):
    """On CUDA in float32 the reference prefills in 512-token chunks by default (the H200's
    transformers takes ``prefill_chunk_size``); its beams are those of the whole-prompt prefill."""
    import torch

    path = synth_model("tiny", catalog_size=2000)
    cat = str(path / "catalog.json")
    chunked = HFReference(str(path), cat, device="cuda", dtype=torch.float32)
    whole = HFReference(str(path), cat, device="cuda", dtype=torch.float32, prefill_chunk=0)
    assert (chunked.prefill_chunk, whole.prefill_chunk) == (512, 0)
    msgs = [{"role": "user", "content": "watched " + ", ".join(str(i) for i in range(400))}]
    ids = chunked.build_prompt(messages=msgs)
    assert len(ids) > 3 * 512
    for n in (1, 64, 256):
        got, want = chunked.generate(ids, n), whole.generate(ids, n)
        assert [b.token_ids for b in got] == [b.token_ids for b in want] and got
        assert max(abs(a.sequence_score - b.sequence_score) for a, b in zip(got, want)) <= 1e-4
