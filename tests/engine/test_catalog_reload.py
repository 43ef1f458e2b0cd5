"""Catalog hot reload in the engine: a request keeps the catalog it was admitted with to the
end, a request admitted after the swap takes the new one, and each one's beams equal those
of a fresh engine serving that catalog alone. The catalogs split level 0 (codes < 32 and
>= 32), so every SID tells which catalog it came from."""

from __future__ import annotations

import numpy as np
import pytest

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine
from flashrec.engine.loop import EngineLoop
from flashrec.engine.request import ReloadBusyError
from flashrec.sid.version import catalog_hash
from flashrec.synth import synth_catalog, write_catalog_json

K = 64  # the tiny preset's codebook


def split_catalogs(tmp_path, num: int = 3000) -> tuple[str, str, np.ndarray, np.ndarray]:
    """Two catalogs with no level-0 code in common (A: < 32, B: >= 32)."""
    codes = synth_catalog(num, K, 3, seed=7)
    a, b = codes[codes[:, 0] < 32], codes[codes[:, 0] >= 32]
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    write_catalog_json(a, pa)
    write_catalog_json(b, pb)
    return str(pa), str(pb), a, b


def make_engine(model, catalog: str, **kw) -> Engine:
    cfg = EngineConfig(
        model_path=str(model), sid_vocab_file=catalog, batch_slots=64, beam_width=8, **kw
    )
    return Engine(cfg)


def sids(engine: Engine, result) -> set[tuple[int, ...]]:
    """The beams' SIDs as code tuples (the end token dropped)."""
    layout = engine.layout
    return {
        tuple(layout.token_to_code(t)[1] for t in ids[: engine.depth])
        for ids in result.beams.token_ids
    }


def beams(result) -> list:
    return [list(map(int, ids)) for ids in result.beams.token_ids]


@pytest.mark.parametrize("step_graph", [False, True], ids=["eager", "static-step"])
def test_swap_between_steps(tiny_model, tmp_path, step_graph):
    pa, pb, a, b = split_catalogs(tmp_path)
    eng = make_engine(tiny_model, pa, enable_step_graph=step_graph)
    prompt = eng.build_prompt(messages=[{"role": "user", "content": "before the swap"}])
    prompt2 = eng.build_prompt(messages=[{"role": "user", "content": "after the swap"}])
    old = eng.new_request(prompt, n=8, rid="old")
    eng.scheduler.add(old)
    out = eng.scheduler.step()  # admitted (catalog A) and prefilled: one level decoded
    assert not out and eng.scheduler.running[0].catalog.hash == catalog_hash(a)

    version = eng.build_catalog(pb)
    assert (version.hash, version.size, version.depth) == (catalog_hash(b), len(b), 3)
    eng.swap_catalog(version)
    assert eng.server_info()["catalog"]["hash"] == catalog_hash(b)
    new = eng.new_request(prompt2, n=8, rid="new")
    eng.scheduler.add(new)
    assert len(eng.scheduler.live_catalogs()) == 2  # the old request still holds A
    done = {}
    while eng.scheduler.has_work():
        for req, res in eng.scheduler.step():
            assert not isinstance(res, Exception), res
            done[req.rid] = res
    # A outlives its last request as the version a rollback returns to
    assert [c.hash for c in eng.scheduler.live_catalogs()] == [catalog_hash(b), catalog_hash(a)]
    assert done["old"].catalog_hash == catalog_hash(a)
    assert done["new"].catalog_hash == catalog_hash(b)
    set_a, set_b = set(map(tuple, a.tolist())), set(map(tuple, b.tolist()))
    assert sids(eng, done["old"]) <= set_a and len(done["old"].beams.token_ids) == 8
    assert sids(eng, done["new"]) <= set_b and len(done["new"].beams.token_ids) == 8
    # the same beams as fresh engines on each catalog alone
    fresh_a = make_engine(tiny_model, pa, enable_step_graph=step_graph)
    fresh_b = make_engine(tiny_model, pb, enable_step_graph=step_graph)
    (ra,) = fresh_a.generate([fresh_a.new_request(prompt, n=8, rid="a")])
    (rb,) = fresh_b.generate([fresh_b.new_request(prompt2, n=8, rid="b")])
    assert beams(done["old"]) == beams(ra)
    assert beams(done["new"]) == beams(rb)
    np.testing.assert_allclose(done["old"].beams.cum_logprobs, ra.beams.cum_logprobs, rtol=1e-5)
    np.testing.assert_allclose(done["new"].beams.cum_logprobs, rb.beams.cum_logprobs, rtol=1e-5)
    if step_graph:  # rebuilt for B on CPU; the old request's steps after the swap went eager
        assert eng.runner.step_catalog is version
        assert eng.scheduler.stats.other_catalog_steps_total >= 1
    eng.swap_catalog(eng.build_catalog(pb))  # the next swap drops A
    assert [c.hash for c in eng.scheduler.live_catalogs()] == [catalog_hash(b)] * 2


def test_invalid_files_refused_old_catalog_serves(tiny_model, tmp_path, bad_catalogs):
    pa, _, a, _ = split_catalogs(tmp_path)
    eng = make_engine(tiny_model, pa)
    loop = EngineLoop(eng)
    loop.start()
    try:
        for name, path in bad_catalogs.items():
            with pytest.raises(ValueError) as err:
                loop.reload_catalog(path)
            assert path in str(err.value), (name, err.value)
        stats = loop.stats()
        assert stats["catalog_reloads_rejected_total"] == 6
        assert stats["catalog_reloads_ok_total"] == 0
        assert stats["catalog_hash"] == catalog_hash(a)
        prompt = eng.build_prompt(messages=[{"role": "user", "content": "still A"}])
        res = loop.submit(eng.new_request(prompt, rid="x")).result(timeout=60)
        assert res.catalog_hash == catalog_hash(a)
        assert sids(eng, res) <= set(map(tuple, a.tolist()))
    finally:
        loop.stop()


def test_second_reload_while_one_runs_is_busy(tiny_model, tmp_path):
    pa, pb, _, b = split_catalogs(tmp_path)
    eng = make_engine(tiny_model, pa)
    loop = EngineLoop(eng)
    loop.start()
    try:
        held = loop.reloader.guard._lock  # a reload in progress holds it
        held.acquire()
        try:
            with pytest.raises(ReloadBusyError):
                loop.reload_catalog(pb)
        finally:
            held.release()
        assert loop.stats()["catalog_reloads_busy_total"] == 1
        info = loop.reload_catalog(pb)  # free again: it goes through
        assert info["catalog_hash"] == catalog_hash(b) and info["sids"] == len(b)
        assert loop.catalog_info()["hash"] == catalog_hash(b)
    finally:
        loop.stop()


def test_hash_ignores_order_and_duplicates():
    codes = synth_catalog(50, K, 3, seed=1)
    shuffled = np.concatenate([codes[::-1], codes[:5]])
    assert catalog_hash(shuffled) == catalog_hash(codes)
    assert catalog_hash(codes[1:]) != catalog_hash(codes)


def test_start_reads_the_catalog_once_as_a_reload_does(tiny_model, tmp_path, monkeypatch):
    """At start the catalog is read once, under the layout, like a hot reload: a file whose
    SIDs carry a trailing end code (one code past the layout's levels) serves the same SIDs,
    hash and beams as the plain file, and a file deeper than that is refused."""
    import flashrec.sid.catalog as catalog_mod
    from harness.servers.hf_reference import HFReference

    codes = synth_catalog(500, K, 3, seed=3)
    plain, ended, deep = tmp_path / "plain.json", tmp_path / "ended.json", tmp_path / "deep.json"
    write_catalog_json(codes, plain)
    end_col = np.zeros((len(codes), 1), dtype=codes.dtype)
    write_catalog_json(np.hstack([codes, end_col]), ended)
    write_catalog_json(np.hstack([codes, end_col, end_col]), deep)
    reads = []
    real_read = catalog_mod._read
    monkeypatch.setattr(
        catalog_mod, "_read", lambda *a, **k: reads.append(a[0]) or real_read(*a, **k)
    )
    a, b = make_engine(tiny_model, str(plain)), make_engine(tiny_model, str(ended))
    assert [str(p) for p in reads] == [str(plain), str(ended)]  # one read per engine
    assert (b.depth, b.catalog_version.size) == (3, len(np.unique(codes, axis=0)))
    assert b.catalog_version.hash == a.catalog_version.hash == catalog_hash(codes)
    assert b.build_catalog(str(ended)).hash == a.catalog_version.hash  # as a reload reads it
    prompt = a.build_prompt(messages=[{"role": "user", "content": "one read"}])
    ra, rb = (e.generate([e.new_request(prompt, n=8)])[0] for e in (a, b))
    assert beams(ra) == beams(rb) and beams(ra)
    with pytest.raises(ValueError, match="5 codes, more than the layout's 3 levels"):
        make_engine(tiny_model, str(deep))
    # the HF reference reads it the same way (one read, the same depth and SIDs)
    reads.clear()
    ref = HFReference(str(tiny_model), str(ended))
    assert len(reads) == 1 and ref.depth == 3
    assert len(ref.prefixes[()]) == len(np.unique(codes[:, 0]))
