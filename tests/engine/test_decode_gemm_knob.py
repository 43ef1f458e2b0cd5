"""``FLASHREC_DECODE_GEMM``: the decode step's GEMMs and LM head through the Triton GEMM of
``--deterministic`` on CUDA (an A/B knob), the library's elsewhere; a bad value fails at import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flashrec.config import EngineConfig
from flashrec.engine import runner
from flashrec.engine.engine import Engine


def _engine(model_dir, device: str, **kw) -> Engine:
    extra = {"cuda_graph_max_bs": 64} if device == "cuda" else {}
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
    assert "FLASHREC_DECODE_GEMM must be library or triton, got 'cutlass'" in out.stderr


def test_triton_asks_nothing_of_the_cpu_and_deterministic_always_takes_it(
    tiny_model, monkeypatch
) -> None:
    monkeypatch.setattr(runner, "DECODE_GEMM", "triton")
    assert _engine(tiny_model, "cpu").runner.invariant_decode is False  # chunked: no speed knob
    assert _engine(tiny_model, "cpu", deterministic=True).runner.invariant_decode is True


@pytest.mark.gpu
@pytest.mark.parametrize("quantization", ["bf16", "fp8"])
def test_gpu_triton_decode_gemms_give_the_library_answer(tiny_model, monkeypatch, quantization):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    answers = {}
    for mode in ("library", "triton"):
        monkeypatch.setattr(runner, "DECODE_GEMM", mode)
        eng = _engine(tiny_model, "cuda", quantization=quantization)
        assert eng.runner.invariant_decode is (mode == "triton")
        prompt = eng.build_prompt(messages=[{"role": "user", "content": "item1 item2 item3"}])
        answers[mode] = eng.generate([eng.new_request(prompt, n=16)])[0]
        del eng
        torch.cuda.empty_cache()
    lib, tri = answers["library"], answers["triton"]
    assert [tuple(b.token_ids) for b in lib.beams][:4] == [tuple(b.token_ids) for b in tri.beams][
        :4
    ]
    for a, b in zip(lib.beams, tri.beams):
        if tuple(a.token_ids) == tuple(b.token_ids):
            assert abs(a.sequence_score - b.sequence_score) < 0.05
