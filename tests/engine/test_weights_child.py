"""A weight update built by a child process (``engine/weights_child.py``): the pack of tensors
comes back bit for bit, a checkpoint built there equals one built here (and the engine then
answers as a fresh one on it), a failing child is a ValueError with nothing changed, and a
daemonic process (the server's engine process) may start it."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
from test_weights_swap import _answers
from test_weights_swap import _engine as engine_on

from flashrec.config import EngineConfig
from flashrec.engine import weights_child
from flashrec.engine.engine import Engine
from flashrec.engine.weights import checkpoint_hash, stage_weights
from flashrec.models.loader import model_tensors


def _engine(path, **kw) -> Engine:
    return engine_on(path, path, **kw)


def test_the_pack_comes_back_bit_for_bit(tmp_path) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "fp8": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
        "i64": torch.arange(5),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
        "strided": torch.randn(6, 4, generator=g).t(),  # not contiguous
    }
    weights_child.write_pack(tensors, tmp_path / "t.bin")
    back = weights_child.read_pack(tmp_path / "t.bin")
    assert list(back) == list(tensors)
    for name, t in tensors.items():
        got = back[name]
        assert (got.dtype, got.shape) == (t.dtype, t.shape), name
        raw = got.reshape(-1).view(torch.uint8)  # bytes: NaN-free and FP8 alike
        assert torch.equal(raw, t.contiguous().reshape(-1).view(torch.uint8)), name
        assert got.data_ptr() % max(1, got.element_size()) == 0, name


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_built_in_a_child_equals_built_here(synth_model, tiny_model, quantization) -> None:
    other = synth_model("tiny", seed=1)
    kw = {"quantization": quantization} if quantization else {}
    here = stage_weights(_engine(tiny_model, **kw), str(other), 1, None)
    assert here.built_in == "here"  # auto on the CPU
    eng = _engine(tiny_model, weights_build="child", **kw)
    child = stage_weights(eng, str(other), 1, None)
    assert child.built_in == "child"
    assert child.version.hash == here.version.hash == checkpoint_hash(other)
    assert list(child.tensors) == list(here.tensors)
    for name, t in here.tensors.items():  # FP8 codes and scales included
        assert child.tensors[name].dtype == t.dtype and torch.equal(child.tensors[name], t), name
    before = _answers(eng)
    eng.swap_weights(child)
    fresh = Engine(
        EngineConfig(model_path=str(other), sid_vocab_file=str(tiny_model / "catalog.json"), **kw)
    )
    want = model_tensors(fresh.runner.model)
    for name, t in model_tensors(eng.runner.model).items():
        assert torch.equal(t, want[name]), name
    assert _answers(eng) == _answers(fresh) != before


def test_a_failing_child_refuses_with_nothing_changed(tiny_model, tmp_path, monkeypatch) -> None:
    eng = _engine(tiny_model, weights_build="child")
    served = {k: t.clone() for k, t in model_tensors(eng.runner.model).items()}
    monkeypatch.setattr(weights_child.sys, "executable", "/bin/false")
    with pytest.raises(ValueError, match=r"builder process failed .*--weights-build server"):
        stage_weights(eng, str(tiny_model), 1, None)
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"building it failed \(\w+Error: "):
        weights_child.build_in_child(str(tmp_path / "gone"), torch.float32, False, 1)
    assert eng.weights.version == 0
    for name, t in model_tensors(eng.runner.model).items():
        assert torch.equal(t, served[name]), name


def test_where_each_mode_builds() -> None:
    assert weights_child.builds_in_child("child")
    assert not weights_child.builds_in_child("server")
    assert EngineConfig(model_path="m").weights_build == "server"
    with pytest.raises(ValueError, match="weights"):
        EngineConfig(model_path="m", weights_build="auto")


def _in_a_daemon(path: str, out) -> None:
    tensors, digest, _, _ = weights_child.build_in_child(path, torch.float32, False, 1)
    out.put((digest, sorted(tensors)))


def test_a_daemonic_process_may_build_in_a_child(tiny_model) -> None:
    """The engine process of ``--engine-process on`` is daemonic; a daemonic multiprocessing
    process may not start children of its own: the builder is a plain subprocess."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_in_a_daemon, args=(str(tiny_model), q), daemon=True)
    p.start()
    try:
        digest, names = q.get(timeout=180)
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
    assert digest == checkpoint_hash(tiny_model)
    assert names == sorted(model_tensors(_engine(tiny_model).runner.model))
