"""--piecewise-prefill-max-tokens: a prefill batch (several prompts, cached prefixes allowed)
is padded to a token bucket and run as L+1 static pieces cut at attention, attention eager on
the real tokens between them (CUDA graphs on GPU; the same padded pieces eagerly on CPU).
Results equal the plain eager prefill; padding writes only to the reserved scratch slots."""

from __future__ import annotations

import pytest
from prefill_helpers import make_engine, make_prompts, same_results

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine
from flashrec.engine.piecewise import MAX_SEQS, bucket_sizes


def _engine(model_dir, **kw) -> Engine:
    return make_engine(model_dir, **kw)


def _prompts(eng: Engine) -> list[list[int]]:
    return make_prompts(eng, (3, 20, 40, 90, 7))


def _spy(eng: Engine) -> list[list[int]]:
    pw = eng.runner.piecewise
    used: list[list[int]] = []
    orig = pw.run
    pw.run = lambda ids, meta: used.append(list(meta.new_lens)) or orig(ids, meta)
    return used


def test_bucket_sizes():
    assert bucket_sizes(0) == []
    assert bucket_sizes(600) == [256, 512, 600]
    s = bucket_sizes(16384)
    assert s[:8] == [256 * k for k in range(1, 9)]
    assert s[8] == 2560 and 8192 in s and s[-1] == 16384
    steps = {b - a for a, b in zip(s, s[1:])}
    assert steps == {256, 512, 1024}


def test_batched_padded_pieces_equal_the_plain_prefill(tiny_model):
    plain = _engine(tiny_model, enable_prefix_cache=False)
    pieced = _engine(tiny_model, enable_prefix_cache=False, piecewise_prefill_max_tokens=1024)
    used = _spy(pieced)
    prompts = _prompts(plain)
    batch = prompts[:4]  # one prefill batch of four prompts, ~1,500 tokens: over the top bucket
    assert sum(len(p) for p in batch) > 1024 >= sum(len(p) for p in prompts[:3])
    for group in (prompts[:3], batch, prompts[4:], prompts[1:2]):
        a = plain.generate([plain.new_request(p, n=8) for p in group])
        b = pieced.generate([pieced.new_request(p, n=8) for p in group])
        same_results(a, b)
    # the batches within the top bucket went through the pieces, the larger one did not
    assert used == [[len(p) for p in prompts[:3]], [len(prompts[4])], [len(prompts[1])]]
    assert pieced.runner.kv.tokens.num_used == pieced.scheduler.kv_reserved_tokens == 1024


def test_the_layers_write_the_static_buffers_in_place(tiny_model):
    """The QKV GEMM writes the static q/k/v rows and each norm its residual over the static
    one: the only copies left on CPU are the embeddings into the residual (once) and the
    rotated q and k of every layer (the unfused RoPE makes new tensors; v stays in place)."""
    eng = _engine(tiny_model, enable_prefix_cache=False, piecewise_prefill_max_tokens=1024)
    pw = eng.runner.piecewise
    used = _spy(eng)
    pw.copies = -1  # the forward's first piece starts the count afresh
    eng.generate([eng.new_request(p, n=4) for p in _prompts(eng)[:2]])
    assert len(used) == 1  # one pieced forward
    assert pw.copies == 1 + 2 * len(pw.layers)


def test_cached_prefixes_go_through_the_pieces(tiny_model):
    """Radix hits: attention (eager, between the pieces) reads the cached prefix from the
    pool; the beams equal the plain engine's warm run; padding never overwrites cached KV."""
    plain = _engine(tiny_model)
    pieced = _engine(tiny_model, piecewise_prefill_max_tokens=512)
    used = _spy(pieced)
    short, mid, long_, _, tiny = _prompts(plain)
    for eng in (plain, pieced):
        eng.generate([eng.new_request(long_, n=8)])
    ext = long_ + mid[-5:]
    res = []
    for eng in (plain, pieced):
        res.append(eng.generate([eng.new_request(ext, n=8), eng.new_request(short, n=8)]))
        res.append(eng.generate([eng.new_request(long_, n=8)]))  # full hit, after padding
    same_results(res[0], res[2])
    same_results(res[1], res[3])
    assert res[2][0].cached_tokens >= len(long_) - 1 and res[3][0].cached_tokens > 0
    assert [len(ext) - res[2][0].cached_tokens, len(short)] in used


def test_default_off_on_cpu_and_capped_on_gpu(tiny_model):
    eng = _engine(tiny_model)
    assert eng.config.resolved_piecewise_prefill_max_tokens == 0
    assert eng.runner.piecewise is None and eng.scheduler.kv_reserved_tokens == 0
    on_gpu = EngineConfig(model_path=str(tiny_model), device="cuda")
    assert on_gpu.resolved_piecewise_prefill_max_tokens == 8192
    capped = EngineConfig(model_path=str(tiny_model), device="cuda", max_prefill_tokens=4096)
    assert capped.resolved_piecewise_prefill_max_tokens == 4096
    eager = EngineConfig(model_path=str(tiny_model), device="cuda", disable_cuda_graph=True)
    assert eager.resolved_piecewise_prefill_max_tokens == 0


def test_shares_padding_slots_with_the_prefill_graph(tiny_model):
    eng = _engine(
        tiny_model, enable_prefix_cache=False, prefill_graph_max_tokens=256,
        piecewise_prefill_max_tokens=512,
    )  # fmt: skip
    run = eng.runner
    assert run.prefill_graphs.pad_slots.data_ptr() == run.piecewise.pad_slots.data_ptr()
    assert eng.scheduler.kv_reserved_tokens == 512 == run.kv.tokens.num_used
    used = _spy(eng)
    a, b, c, _, _ = _prompts(eng)
    assert len(b) <= 256
    eng.generate([eng.new_request(b, n=4)])  # alone, short: the whole-forward graph
    eng.generate([eng.new_request(a, n=4), eng.new_request(b, n=4)])  # a batch: the pieces
    assert used == [[len(a), len(b)]]
    assert run.kv.tokens.num_used == 512


@pytest.mark.parametrize("bad", [-1, 70000])
def test_piecewise_prefill_max_tokens_is_validated(tiny_model, bad):
    with pytest.raises(ValueError, match="piecewise-prefill-max-tokens"):
        EngineConfig(model_path=str(tiny_model), piecewise_prefill_max_tokens=bad)


def test_batches_over_max_seqs_run_eagerly(tiny_model):
    eng = _engine(tiny_model, enable_prefix_cache=False, piecewise_prefill_max_tokens=512)
    from flashrec.layers.attention import PrefillMeta

    pw = eng.runner.piecewise
    meta = PrefillMeta(None, None, [], [1] * (MAX_SEQS + 1), [0] * (MAX_SEQS + 1), None)
    assert not pw.fits(meta)
    meta = PrefillMeta(None, None, [], [1] * MAX_SEQS, [0] * MAX_SEQS, None)
    assert pw.fits(meta)


def test_padding_reservation_fits_the_pool(tiny_model):
    """The padding slots may take at most a quarter of the KV pool: the default shrinks to a
    bucket that fits (cuda defaults on a small pool would otherwise fail at start-up); an
    explicit value that does not fit is refused with the knobs that fix it."""
    from flashrec.engine.runner import ModelRunner

    eng = _engine(tiny_model, kv_pool_tokens=4096, piecewise_prefill_max_tokens=1024)
    assert eng.runner.piecewise.sizes[-1] == 1024
    with pytest.raises(ValueError, match="kv-pool-tokens"):
        _engine(tiny_model, kv_pool_tokens=4096, piecewise_prefill_max_tokens=2048)
    # the default (here forced as on a GPU) shrinks instead
    runner = eng.runner
    object.__setattr__(runner.config, "piecewise_prefill_max_tokens", None)
    assert ModelRunner._fit_piecewise(runner, 8192, 0) == 1024
    assert ModelRunner._fit_piecewise(runner, 8192, 2048) == 2048  # reserved for the whole graph
    assert ModelRunner._fit_piecewise(runner, 512, 0) == 512
