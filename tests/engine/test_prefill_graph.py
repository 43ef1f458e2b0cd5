"""--prefill-graph-max-tokens: one prompt without a cached prefix is padded to a 128-token
bucket (padding writes to reserved scratch slots) and run as one static forward (a CUDA graph
on GPU; the same padded forward eagerly on CPU). Results equal the unpadded prefill. Also the
prompt-KV accounting around it: reserved padding slots, short radix matches, a flush while a
request runs."""

from __future__ import annotations

import pytest
from knob_helpers import import_with
from prefill_helpers import make_engine, make_prompts

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine


def _engine(model_dir, **kw) -> Engine:
    return make_engine(model_dir, **kw)


def _prompts(eng: Engine) -> list[list[int]]:
    return make_prompts(eng)


def test_padded_prefill_equals_plain_prefill(tiny_model):
    plain = _engine(tiny_model, enable_prefix_cache=False)
    padded = _engine(tiny_model, enable_prefix_cache=False, prefill_graph_max_tokens=256)
    pg = padded.runner.prefill_graphs
    assert pg is not None and pg.sizes == [128, 256]
    used = []
    orig = pg.run
    pg.run = lambda ids, meta: used.append(meta.new_lens[0]) or orig(ids, meta)
    prompts = _prompts(plain)
    assert max(len(p) for p in prompts) > 256 >= min(len(p) for p in prompts)
    for p in prompts:  # one at a time: every prefill batch holds one prompt
        a = plain.generate([plain.new_request(p, n=8)])[0]
        b = padded.generate([padded.new_request(p, n=8)])[0]
        assert [x.token_ids for x in a.beams] == [y.token_ids for y in b.beams]
        for x, y in zip(a.beams, b.beams):
            assert abs(x.cum_logprob - y.cum_logprob) <= 1e-4
    assert sorted(used) == sorted(len(p) for p in prompts if len(p) <= 256)
    # the scratch slots stay reserved; every request's slots came back
    assert padded.runner.kv.tokens.num_used == len(pg.pad_slots)


def test_batches_and_cached_prefixes_take_the_eager_prefill(tiny_model):
    eng = _engine(tiny_model, prefill_graph_max_tokens=512)
    pg = eng.runner.prefill_graphs
    used = []
    orig = pg.run
    pg.run = lambda ids, meta: used.append(1) or orig(ids, meta)
    p = _prompts(eng)[1]
    eng.generate([eng.new_request(p, n=4), eng.new_request(p + [p[-1]], n=4)])  # one batch
    assert not used
    eng.generate([eng.new_request(p, n=4)])  # radix hit: a cached prefix
    assert not used
    eng.scheduler.flush_cache()
    eng.generate([eng.new_request(p, n=4)])  # cold, alone: the padded forward
    assert used == [1]


@pytest.mark.parametrize("bad", [-1, 70000])
def test_prefill_graph_max_tokens_is_validated(tiny_model, bad):
    with pytest.raises(ValueError, match="prefill-graph-max-tokens"):
        EngineConfig(model_path=str(tiny_model), prefill_graph_max_tokens=bad)


def test_padding_never_writes_into_cached_prompts(tiny_model):
    """Padding tokens write only to the reserved scratch slots: a long prompt's KV, cached in
    the radix tree, survives a shorter prompt's padded prefill (a radix hit on it afterwards
    gives the same beams as its cold run)."""
    eng = _engine(tiny_model, prefill_graph_max_tokens=256)
    short, long_, _, _ = _prompts(eng)
    assert len(short) < 128 < len(long_) <= 256
    cold = eng.generate([eng.new_request(long_, n=8)])[0]
    eng.generate([eng.new_request(short, n=8)])
    warm = eng.generate([eng.new_request(long_, n=8)])[0]
    assert warm.cached_tokens > 0
    assert [x.token_ids for x in cold.beams] == [y.token_ids for y in warm.beams]
    for x, y in zip(cold.beams, warm.beams):
        assert abs(x.cum_logprob - y.cum_logprob) <= 1e-4


def test_short_radix_matches_are_recomputed(tiny_model):
    """--prefix-cache-min-match: a match shorter than the threshold (two prompts sharing only
    the chat template's first tokens) is not used; a long shared prefix still is."""
    eng = _engine(tiny_model, prefix_cache_min_match=32)
    a, b, c, _ = _prompts(eng)
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert 0 < shared < 32  # the template's first tokens
    eng.generate([eng.new_request(a, n=4)])
    assert eng.generate([eng.new_request(b, n=4)])[0].cached_tokens == 0
    assert eng.generate([eng.new_request(c, n=4)])[0].cached_tokens == 0
    hit = eng.generate([eng.new_request(c, n=4)])[0]  # the same prompt again: a long match
    assert hit.cached_tokens == len(c) - 1
    low = _engine(tiny_model, prefix_cache_min_match=1)
    low.generate([low.new_request(a, n=4)])
    assert low.generate([low.new_request(b, n=4)])[0].cached_tokens == shared


def test_only_a_prompt_prefilled_while_nothing_runs_replays_the_graph(tiny_model):
    """Under load the unpadded prefill is kept: a lone prompt admitted while another request
    is still decoding takes the eager path; the reserved padding slots are not counted as
    used KV (the server's flashrec_kv_tokens_used reads this)."""
    eng = _engine(tiny_model, enable_prefix_cache=False, prefill_graph_max_tokens=256)
    pg = eng.runner.prefill_graphs
    used = []
    orig = pg.run
    pg.run = lambda ids, meta: used.append(meta.new_lens[0]) or orig(ids, meta)
    a, b, _, _ = _prompts(eng)
    sched = eng.scheduler
    sched.add(eng.new_request(a, n=4))
    sched.step()  # nothing else runs: the padded forward
    assert used == [len(a)] and sched.running
    sched.add(eng.new_request(b, n=4))
    sched.step()  # the first request is still decoding: eager
    assert used == [len(a)]
    while sched.has_work():
        sched.step()
    assert sched.kv_used_tokens == 0
    assert eng.runner.kv.tokens.num_used == sched.kv_reserved_tokens == len(pg.pad_slots) > 0


def test_prefill_graphs_default_off_on_cpu(tiny_model):
    eng = _engine(tiny_model)
    assert eng.config.resolved_prefill_graph_max_tokens == 0
    assert eng.runner.prefill_graphs is None and eng.scheduler.kv_reserved_tokens == 0
    on_gpu = EngineConfig(model_path=str(tiny_model), device="cuda")
    assert on_gpu.resolved_prefill_graph_max_tokens == 2048
    eager = EngineConfig(model_path=str(tiny_model), device="cuda", disable_cuda_graph=True)
    assert eager.resolved_prefill_graph_max_tokens == 0


def test_flush_while_a_request_runs_keeps_its_prompt_kv(tiny_model):
    """POST /flush_cache never fails (docs/api.md): the running request's prompt is referenced,
    not cached, so a flush between its steps frees only unreferenced tokens, and the request
    ends with the beams of an undisturbed run."""
    eng = _engine(tiny_model)
    a, b, _, _ = _prompts(eng)
    eng.generate([eng.new_request(b, n=4)])  # b is cached, unreferenced
    want = eng.generate([eng.new_request(a, n=8)])[0]
    eng.scheduler.flush_cache()
    sched = eng.scheduler
    eng.generate([eng.new_request(b, n=4)])
    sched.add(eng.new_request(a, n=8))
    sched.step()  # a is prefilled (cold: the flush dropped it) and decoding
    used = sched.kv_used_tokens
    assert sched.running and used >= len(a)
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)  # the template's start
    freed = sched.flush_cache()
    assert freed == len(b) - shared  # only the finished prompt's own, unreferenced tokens
    assert sched.kv_used_tokens == used
    done = []
    while sched.has_work():
        done += sched.step()
    ((_, got),) = done
    assert [x.token_ids for x in got.beams] == [y.token_ids for y in want.beams]
    assert sched.kv_used_tokens == 0


def test_a_smaller_bucket_pads_less_and_equals_plain_prefill(tiny_model, monkeypatch):
    import flashrec.engine.prefill_graph as prefill_graph

    monkeypatch.setattr(prefill_graph, "BUCKET", 32)  # FLASHREC_PREFILL_BUCKET=32
    plain = _engine(tiny_model, enable_prefix_cache=False)
    padded = _engine(tiny_model, enable_prefix_cache=False, prefill_graph_max_tokens=256)
    pg = padded.runner.prefill_graphs
    assert pg.sizes == list(range(32, 257, 32))
    buckets = []
    orig = pg.load
    pg.load = lambda ids, meta: buckets.append(orig(ids, meta)) or buckets[-1]
    for p in _prompts(plain):
        if len(p) > 256:
            continue
        a = plain.generate([plain.new_request(p, n=8)])[0]
        b = padded.generate([padded.new_request(p, n=8)])[0]
        assert [x.token_ids for x in a.beams] == [y.token_ids for y in b.beams]
        for x, y in zip(a.beams, b.beams):
            assert abs(x.cum_logprob - y.cum_logprob) <= 1e-4
    assert buckets and all(t - 32 < n <= t and t % 32 == 0 for n, t in buckets)


def test_the_bucket_knob_refuses_other_sizes():
    got = import_with("flashrec.engine.prefill_graph", "BUCKET", "FLASHREC_PREFILL_BUCKET", "100")
    assert got.returncode != 0
    assert "FLASHREC_PREFILL_BUCKET must be 32, 64 or 128, got '100'" in got.stderr
