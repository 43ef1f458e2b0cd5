"""Weight update on the engine (``engine/weights.py``): the staged checkpoint is copied into
the served tensors' own storage, the engine then answers as a fresh engine on the new
checkpoint (BF16 and ``--quantization fp8``: the new weights quantized as the loader does),
and a checkpoint that differs in anything but its values is refused before anything changes."""

from __future__ import annotations

import pytest
import torch

from flashrec.config import EngineConfig
from flashrec.engine import weights
from flashrec.engine.engine import Engine
from flashrec.engine.weights import checkpoint_hash, stage_weights
from flashrec.models.loader import model_tensors


def _engine(path, catalog, **kw) -> Engine:
    return Engine(
        EngineConfig(model_path=str(path), sid_vocab_file=str(catalog / "catalog.json"), **kw)
    )


def _answers(eng: Engine) -> list:
    reqs = [
        eng.new_request(eng.build_prompt(text=f"user {i} likes item {i * 7}"), n=8)
        for i in range(3)
    ]
    return [[(b.token_ids, b.sequence_score) for b in r.beams] for r in eng.generate(reqs)]


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_swap_equals_a_fresh_engine(synth_model, tiny_model, quantization) -> None:
    other = synth_model("tiny", seed=1)
    kw = {"quantization": quantization} if quantization else {}
    eng = _engine(tiny_model, tiny_model, **kw)
    before = _answers(eng)
    ptrs = {k: t.data_ptr() for k, t in model_tensors(eng.runner.model).items()}
    staged = stage_weights(eng, str(other), 1, "v1")
    assert _answers(eng) == before  # staging changes nothing served
    eng.swap_weights(staged)
    assert {k: t.data_ptr() for k, t in model_tensors(eng.runner.model).items()} == ptrs
    assert eng.weights.hash == checkpoint_hash(other) and eng.weights.version == 1
    fresh = _engine(other, tiny_model, **kw)
    want = model_tensors(fresh.runner.model)
    for name, t in model_tensors(eng.runner.model).items():  # FP8 codes and scales included
        assert t.dtype == want[name].dtype and torch.equal(t, want[name]), name
    assert _answers(eng) == _answers(fresh) != before


def test_batched_copy_writes_what_the_per_tensor_copy_writes(synth_model, tiny_model) -> None:
    other = synth_model("tiny", seed=1)
    eng = _engine(tiny_model, tiny_model, quantization="fp8")
    served = model_tensors(eng.runner.model)
    ptrs = {k: t.data_ptr() for k, t in served.items()}
    before = {k: t.clone() for k, t in served.items()}
    staged = stage_weights(eng, str(other), 1, "v1")
    weights.copy_weights(eng.runner.model, staged, batched=True)
    assert {k: t.data_ptr() for k, t in served.items()} == ptrs  # into the same storage
    assert any(not torch.equal(t, before[k]) for k, t in served.items())
    for name, t in served.items():  # FP8 codes and scales included
        assert torch.equal(t, staged.tensors[name]), name


def test_refused_before_anything_changes(synth_model, tiny_model, tmp_path) -> None:
    eng = _engine(tiny_model, tiny_model)
    served = {k: t.clone() for k, t in model_tensors(eng.runner.model).items()}
    for path, words in (
        (tmp_path / "none", "no such directory"),
        (synth_model("tiny", num_hidden_layers=3), "num_hidden_layers"),
        (synth_model("tiny", dtype="bf16"), "dtype BF16"),
    ):
        with pytest.raises(ValueError, match=words):
            stage_weights(eng, str(path), 1, None)
    assert eng.weights.version == 0 and eng.weights.hash == checkpoint_hash(tiny_model)
    for name, t in model_tensors(eng.runner.model).items():
        assert torch.equal(t, served[name]), name


def test_the_served_tokenizer_files_are_not_loaded_again(
    synth_model, tiny_model, tmp_path, monkeypatch
) -> None:
    """A checkpoint whose tokenizer files are the served ones' (a retrained model of the same
    tokenizer) skips the tokenizer load (it holds the interpreter lock beside the engine
    thread); one whose files differ in any byte loads and checks its tokenizer."""
    import shutil

    eng = _engine(tiny_model, tiny_model)
    other = synth_model("tiny", seed=1)  # the same synthetic tokenizer, other weights
    loads = []
    real = weights.load_tokenizer
    monkeypatch.setattr(weights, "load_tokenizer", lambda p: loads.append(p) or real(p))
    assert weights.tokenizer_files_digest(other) == eng.tokenizer_files
    stage_weights(eng, str(other), 1, None)
    assert loads == []
    edited = tmp_path / "edited"
    shutil.copytree(other, edited)
    cfg = edited / "tokenizer_config.json"
    cfg.write_text(cfg.read_text() + " ")  # one byte more: another file
    assert weights.tokenizer_files_digest(edited) != eng.tokenizer_files
    stage_weights(eng, str(edited), 1, None)
    assert loads == [str(edited)]


def test_staging_on_the_device_needs_room_beside_the_served_model() -> None:
    """Staged weights go to device memory only with a tenth of their size, and at least
    1 GiB, still free beside them; else they wait on the host and the swap copies them."""
    from flashrec.engine.weights import stages_on_device

    gib = 1 << 30
    assert stages_on_device(4 * gib, 60 * gib)
    assert stages_on_device(4 * gib, 5 * gib)  # 1 GiB left: the floor
    assert not stages_on_device(4 * gib, 5 * gib - 1)
    assert stages_on_device(20 * gib, 22 * gib)  # 2 GiB left: a tenth
    assert not stages_on_device(20 * gib, 22 * gib - 1)
    assert not stages_on_device(4 * gib, 3 * gib)  # does not fit at all


def test_device_room_counts_the_unused_blocks_torch_holds(monkeypatch) -> None:
    """A staging kept in torch's cache after the last swap is room for the next one: the
    driver's free memory plus what torch reserved and does not use."""
    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (2 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 30 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 26 * gib)
    assert weights.device_room(torch.device("cuda")) == 6 * gib
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 31 * gib)  # read apart
    assert weights.device_room(torch.device("cuda")) == 2 * gib  # never below the driver's


@pytest.mark.parametrize(("release", "emptied"), [("free", 1), ("keep", 0)])
def test_release_frees_or_keeps_a_device_staging(monkeypatch, release, emptied) -> None:
    """After the swap a device staging's blocks go back to the driver ("free") or stay in
    torch's cache for the next update ("keep"); the staged tensors are dropped either way,
    and a host or CPU staging never empties the device cache."""
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(weights, "STAGE_RELEASE", release)
    staged = weights.StagedWeights(None, {"w": torch.zeros(2)}, 0.0, 0.0, staged_on="device")
    weights.release_staged(staged)
    assert staged.tensors == {} and len(calls) == emptied
    host = weights.StagedWeights(None, {"w": torch.zeros(2)}, 0.0, 0.0, staged_on="host")
    weights.release_staged(host)
    assert host.tensors == {} and len(calls) == emptied


def test_cpu_staging_is_the_built_model(tiny_model) -> None:
    eng = _engine(tiny_model, tiny_model)
    staged = stage_weights(eng, str(tiny_model), 1, None)
    assert staged.staged_on == "cpu"
    assert all(t.device.type == "cpu" and not t.is_pinned() for t in staged.tensors.values())
