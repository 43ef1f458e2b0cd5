"""``FLASHREC_DECODE_GEMM``: the decode step's GEMMs through the Triton GEMM of
``--deterministic`` (``triton``) or, per weight shape and decode graph size, whichever of the
library and a few Triton tiles is faster on the GPU (``tuned``, ``kernels/gemm_choice.py``);
the library's elsewhere; a bad value fails at import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from flashrec.config import EngineConfig
from flashrec.engine import runner
from flashrec.engine.engine import Engine
from flashrec.kernels import gemm_choice
from flashrec.layers.linear import Linear


def _engine(model_dir, device: str, **kw) -> Engine:
    extra = {"cuda_graph_max_bs": 64, "attention_backend": "triton"} if device == "cuda" else {}
    return Engine(
        EngineConfig(
            model_path=str(model_dir), sid_vocab_file=str(model_dir / "catalog.json"),
            device=device, beam_width=16, batch_slots=256, **{**extra, **kw},
        )
    )  # fmt: skip


def test_a_bad_value_fails_at_import_with_the_choices() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import flashrec.engine.runner"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "FLASHREC_DECODE_GEMM": "cutlass"},
    )  # fmt: skip
    assert out.returncode != 0
    assert "FLASHREC_DECODE_GEMM must be library, triton or tuned, got 'cutlass'" in out.stderr


@pytest.mark.parametrize("mode", ["triton", "tuned"])
def test_the_cpu_keeps_the_library(tiny_model, monkeypatch, mode) -> None:
    monkeypatch.setattr(runner, "DECODE_GEMM", mode)
    gemm_choice.clear()
    eng = _engine(tiny_model, "cpu")
    assert eng.runner.invariant_decode is False  # the chunked CPU path is no speed knob
    assert gemm_choice.chosen() == {}  # nothing timed, nothing chosen
    assert _engine(tiny_model, "cpu", deterministic=True).runner.invariant_decode is True


def test_choices_are_per_shape_and_rows_and_tune_leaves_the_cpu_alone() -> None:
    gemm_choice.clear()
    w = torch.randn(64, 32)
    gemm_choice.tune([(w, None)], 16)  # CPU weights: nothing to time
    assert gemm_choice.chosen() == {}
    tile = gemm_choice.TILES[0]
    gemm_choice._table[(16, 64, 32, torch.float32)] = tile
    try:
        assert gemm_choice.choice(16, 64, 32, torch.float32) == tile
        assert gemm_choice.choice(32, 64, 32, torch.float32) is None  # other rows
        assert gemm_choice.choice(16, 64, 32, torch.bfloat16) is None  # other dtype
        lin = Linear(32, 64)
        lin.load(w)
        assert lin._tile(torch.zeros(16, 32), torch.float32) == tile
        assert lin._tile(torch.zeros(8, 32), torch.float32) is None
    finally:
        gemm_choice.clear()
    assert gemm_choice.chosen() == {}


def test_tune_skips_rows_past_the_limit() -> None:
    gemm_choice.clear()
    w = torch.randn(64, 32)
    gemm_choice.tune([(w, None)], gemm_choice.MAX_ROWS + 1)
    gemm_choice.tune([(w, None)], 0)
    assert gemm_choice.chosen() == {}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_gpu_triton_linear_equals_the_library_at_every_tile(dtype) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from flashrec.kernels import fp8 as fp8k

    torch.manual_seed(0)
    for m, n, k in ((256, 2048, 2048), (100, 4096, 2048), (7, 384, 640)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        if dtype == "fp8":
            wq, ws = fp8k.quantize_weight_per_channel(w.float())
            xq, xs = fp8k.per_token_quant_fp8(x)
            ref = fp8k.fp8_linear(xq, xs, wq, ws, None, torch.bfloat16).float()
        else:
            ref = torch.nn.functional.linear(x, w).float()
        for tile in gemm_choice.TILES:
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            if dtype == "fp8":
                got = gemm_choice.triton_linear(xq, wq, tile, xs.float(), ws, out=out)
            else:
                got = gemm_choice.triton_linear(x, w, tile, out=out)
            assert got is out
            err = (got.float() - ref).abs().max().item() / ref.abs().max().item()
            assert err < 1e-2, (m, n, k, tile, err)


@pytest.mark.gpu
@pytest.mark.parametrize("quantization", ["bf16", "fp8"])
@pytest.mark.parametrize("mode", ["triton", "tuned"])
def test_gpu_decode_gemms_give_the_library_answer(tiny_model, monkeypatch, quantization, mode):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    answers = {}
    for which in ("library", mode):
        monkeypatch.setattr(runner, "DECODE_GEMM", which)
        gemm_choice.clear()
        eng = _engine(tiny_model, "cuda", quantization=quantization)
        assert eng.runner.invariant_decode is (which == "triton")
        if which == "tuned":  # every linear layer's shape timed at every decode graph size
            shapes = {(m.out_features, m.in_features) for m in eng.runner.model.modules()
                      if isinstance(m, Linear)}  # fmt: skip
            sizes = {s for s in eng.runner.graphs.sizes if s <= gemm_choice.MAX_ROWS}
            keys = gemm_choice.chosen()
            assert sizes and {key[0] for key in keys} == sizes
            assert {key[1:3] for key in keys} == shapes
        prompt = eng.build_prompt(messages=[{"role": "user", "content": "item1 item2 item3"}])
        answers[which] = eng.generate([eng.new_request(prompt, n=16)])[0]
        del eng
        torch.cuda.empty_cache()
    gemm_choice.clear()
    lib, other = answers["library"], answers[mode]
    top = [tuple(b.token_ids) for b in lib.beams][:4]
    assert top == [tuple(b.token_ids) for b in other.beams][:4]
    for a, b in zip(lib.beams, other.beams):
        if tuple(a.token_ids) == tuple(b.token_ids):
            assert abs(a.sequence_score - b.sequence_score) < 0.05
