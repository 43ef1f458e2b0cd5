"""Weight update on the GPU: the checkpoint is staged in device memory (off the engine thread,
never page-locked host memory), the swap copies it into the served buffers under the captured
graphs, and the engine then answers exactly as a fresh engine on the new checkpoint; with no
room on the device the staging waits on the host, and built in a child process or in this one,
the answers are the same."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import PROMPTS, make_engine

from flashrec.engine import weights
from flashrec.engine.weights import stage_weights
from flashrec.models.loader import model_tensors

pytestmark = pytest.mark.gpu


def _answers(eng) -> list:
    reqs = [eng.new_request(eng.build_prompt(messages=p), n=16) for p in PROMPTS]
    return [[(b.token_ids, b.sequence_score) for b in r.beams] for r in eng.generate(reqs)]


@pytest.mark.parametrize("build", ["child", "server"])
@pytest.mark.parametrize("room", ["device", "host"])
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_gpu_weight_swap_equals_a_fresh_engine(synth_model, quantization, room, build, monkeypatch):
    a, b = synth_model("tiny", catalog_size=2000), synth_model("tiny", catalog_size=2000, seed=1)
    kw = dict(dtype="bfloat16", quantization=quantization or "none", deterministic=True)
    eng = make_engine(a, weights_build=build, **kw)
    before = _answers(eng)
    if room == "host":  # as on a device without room for a second copy
        monkeypatch.setattr(weights, "stages_on_device", lambda need, free: False)
    staged = stage_weights(eng, str(b), 1, None)
    assert (staged.staged_on, staged.built_in) == (room, "child" if build == "child" else "here")
    where = {t.device.type for t in staged.tensors.values()}
    assert where == ({"cuda"} if room == "device" else {"cpu"})
    assert not any(t.is_pinned() for t in staged.tensors.values())
    assert _answers(eng) == before  # staging changes nothing served
    eng.swap_weights(staged)
    # the served catalog: a weight update leaves the catalog as it was (b's own differs)
    fresh = make_engine(b, sid_vocab_file=str(a / "catalog.json"), **kw)
    want = model_tensors(fresh.runner.model)
    for name, t in model_tensors(eng.runner.model).items():
        assert torch.equal(t, want[name]), name
    assert _answers(eng) == _answers(fresh) != before


@pytest.mark.parametrize("copy", ["paced", "pinned", "whole"])
def test_gpu_staging_copies_every_byte(copy, monkeypatch):
    """Staging copies a tensor in pieces (here 1,000 bytes, which splits elements of every
    width at odd places): every byte arrives, for each dtype and shape the models hold."""
    monkeypatch.setattr(weights, "STAGE_CHUNK_BYTES", 1000)
    monkeypatch.setattr(weights, "STAGE_COPY", copy)
    g = torch.Generator().manual_seed(0)
    tensors = {
        "bf16": torch.randn(37, 129, generator=g).to(torch.bfloat16),
        "f32": torch.randn(4099, generator=g),
        "fp8": torch.randn(64, 65, generator=g).to(torch.float8_e4m3fn),
        "f32_t": torch.randn(33, 70, generator=g).t(),  # not contiguous
        "small": torch.randn(3, generator=g),
        "scalar": torch.tensor(2.5),
    }
    need = sum(t.numel() * t.element_size() for t in tensors.values())
    placed, where = weights._place(tensors, torch.device("cuda"), need)
    assert where == "device"
    for name, t in tensors.items():
        got = placed[name]
        assert got.is_cuda and got.shape == t.shape and got.dtype == t.dtype, name
        a, b = got.cpu().reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)
        assert torch.equal(a, b), name


@pytest.mark.parametrize("room", ["device", "host"])
def test_gpu_batched_copy_equals_the_per_tensor_copy(synth_model, room, monkeypatch):
    """The swap's copy batched (one ``_foreach_copy_`` over the device-staged tensors, the
    host-staged ones one by one) writes what the per-tensor copy writes, into the same storage."""
    a, b = synth_model("tiny", catalog_size=2000), synth_model("tiny", catalog_size=2000, seed=1)
    eng = make_engine(a, dtype="bfloat16", quantization="fp8", deterministic=True)
    if room == "host":
        monkeypatch.setattr(weights, "stages_on_device", lambda need, free: False)
    staged = stage_weights(eng, str(b), 1, None)
    served = model_tensors(eng.runner.model)
    ptrs = {k: t.data_ptr() for k, t in served.items()}
    weights.copy_weights(eng.runner.model, staged, batched=True)
    assert {k: t.data_ptr() for k, t in served.items()} == ptrs
    for name, t in served.items():
        assert torch.equal(t.cpu(), staged.tensors[name].cpu()), name
