"""``--deterministic``: a request's beams, scores and order are bit for bit the same whatever
else shares its batches (other requests, other widths, other SID levels), its radix state
and the decode graph size it lands in; on CPU and (``gpu``) on CUDA in BF16 and FP8 with
both GPU attention backends."""

from __future__ import annotations

import pytest
import torch

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine

WIDTHS = (3, 16, 8, 16, 1, 64, 16, 5, 16, 32)


def _engine(model_dir, device: str, **kw) -> Engine:
    base = dict(beam_width=16, batch_slots=512)
    if device == "cuda":
        base.update(cuda_graph_max_bs=128)
    return Engine(
        EngineConfig(
            model_path=str(model_dir),
            sid_vocab_file=str(model_dir / "catalog.json"),
            device=device,
            **{**base, **kw},
        )
    )


def _prompts(eng: Engine) -> list[list[int]]:
    return [
        eng.build_prompt(
            messages=[
                {"role": "user", "content": " ".join(f"item{i}_{j}" for j in range(3 + 9 * i))}
            ]
        )
        for i in range(len(WIDTHS))
    ]


def _staggered(eng: Engine, order: list[int], per_step: int) -> dict[int, object]:
    """The requests of ``order`` joining ``per_step`` per scheduler step (decode batches mix
    levels and widths); results by request index."""
    prompts = _prompts(eng)
    reqs = {i: eng.new_request(prompts[i], n=WIDTHS[i]) for i in order}
    pending, done, sched = list(order), {}, eng.scheduler
    by_rid = {r.rid: i for i, r in reqs.items()}
    while pending or sched.has_work():
        for _ in range(per_step):
            if pending:
                sched.add(reqs[pending.pop(0)])
        for req, res in sched.step():
            assert not isinstance(res, Exception), res
            done[by_rid[req.rid]] = res
    return done


def _bits(res) -> list[tuple]:
    return [(tuple(b.token_ids), b.sequence_score) for b in res.beams]


def _alone(eng: Engine) -> dict[int, object]:
    prompts = _prompts(eng)
    return {i: eng.generate([eng.new_request(prompts[i], n=n)])[0] for i, n in enumerate(WIDTHS)}


def _gpu_kw(quantization: str, backend: str) -> dict:
    kw = dict(dtype="bfloat16", quantization=quantization, attention_backend=backend)
    if quantization == "fp8":
        kw["kv_cache_dtype"] = "fp8_e4m3"
    return kw


CASES = [
    pytest.param("cpu", {}, id="cpu"),
    *(
        pytest.param("cuda", _gpu_kw(q, b), id=f"cuda-{q}-{b}", marks=pytest.mark.gpu)
        for q, b in (("none", "flashinfer"), ("fp8", "flashinfer"), ("none", "triton"),
                     ("fp8", "triton"))
    ),
]  # fmt: skip


HD128 = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128)


def _model(synth_model, tiny_model, device: str, kw: dict):
    """The tiny model; with head_dim 128 for FlashInfer (which takes 64 / 128 / 256 only)."""
    if device == "cuda" and kw.get("attention_backend") == "flashinfer":
        pytest.importorskip("flashinfer")
        return synth_model("tiny", catalog_size=2000, **HD128)
    return tiny_model


def _check_backend(eng: Engine, kw: dict) -> Engine:
    want = kw.get("attention_backend")
    assert want is None or eng.runner.attention_backend == want  # no silent fallback
    return eng


@pytest.mark.parametrize("device,kw", CASES)
def test_mixed_batches_bit_identical_to_each_request_alone(synth_model, tiny_model, device, kw):
    model = _model(synth_model, tiny_model, device, kw)
    alone = _alone(_check_backend(_engine(model, device, deterministic=True, **kw), kw))
    order = list(range(len(WIDTHS)))
    for per_step, o in ((2, order), (3, order[::-1]), (len(order), order)):
        mixed = _staggered(_engine(model, device, deterministic=True, **kw), o, per_step)
        for i in order:
            assert _bits(mixed[i]) == _bits(alone[i]), (per_step, i, WIDTHS[i])


def test_without_the_mode_a_mixed_batch_changes_scores(tiny_model):
    """The control: the same mixes without ``--deterministic`` do change some scores on CPU
    (few-row GEMMs take another path), so the test above can fail."""
    alone = _alone(_engine(tiny_model, "cpu"))
    mixed = _staggered(_engine(tiny_model, "cpu"), list(range(len(WIDTHS))), 3)
    assert any(_bits(mixed[i]) != _bits(alone[i]) for i in alone)


@pytest.mark.parametrize("device,kw", CASES)
def test_radix_state_and_step_hashes_do_not_change_answers(synth_model, tiny_model, device, kw):
    """The same prompts again (a prefix cache would hit) and with per-step input hashes on
    (the eager decode, not the step graph, on GPU): the same bits; no prefix ever reused."""
    model = _model(synth_model, tiny_model, device, kw)
    eng = _check_backend(_engine(model, device, deterministic=True, **kw), kw)
    first = _alone(eng)
    again = _alone(eng)
    eng.scheduler.debug_hash = True
    hashed = _alone(eng)
    for i in first:
        assert _bits(again[i]) == _bits(first[i]) == _bits(hashed[i]), i
    assert eng.scheduler.radix is None
    assert eng.scheduler.stats.prefix_hit_tokens_total == 0


def test_the_mode_settings():
    cfg = EngineConfig(model_path="m", device="cpu", deterministic=True, decode_max_splits=8)
    assert cfg.resolved_decode_max_splits == 1
    assert not cfg.resolved_enable_prefix_cache
    assert cfg.resolved_prefill_graph_max_tokens == 0
    plain = EngineConfig(model_path="m", device="cpu")
    assert plain.resolved_decode_max_splits == 8 and plain.resolved_enable_prefix_cache
    with pytest.raises(ValueError, match="--prefill-graph-max-tokens"):
        EngineConfig(model_path="m", deterministic=True, prefill_graph_max_tokens=2048)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_mode_keeps_graphs_and_the_step_graph(tiny_model):
    """The mode runs its decode through the captured graphs (its kernels captured in), not
    eagerly: the graph counter moves, the eager one does not."""
    eng = _engine(tiny_model, "cuda", deterministic=True, dtype="bfloat16")
    _staggered(eng, list(range(len(WIDTHS))), 3)
    forwards = eng.runner.decode_forwards
    assert forwards["graph"] > 0
    assert eng.runner.step is not None
