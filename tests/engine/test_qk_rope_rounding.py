"""--qk-rope-rounding: how the fused q/k norm + RoPE + KV-write kernel rounds (GPU). The
kernels themselves are checked in tests/kernels (the hardware form only on a GPU)."""

from __future__ import annotations

import pytest
from prefill_helpers import make_engine, make_prompts

from flashrec.engine.meta import make_prefill_meta


def test_qk_rope_rounding_is_checked_and_reaches_the_fused_kernel(tiny_model, monkeypatch):
    """--qk-rope-rounding: a bad value is refused; the engine's fused q/k norm + RoPE call
    (GPU only, called here directly on CPU, where the reference runs) asks for the hardware
    rounding exactly when the knob says so."""
    import flashrec.kernels.qk_rope_kv as qk

    with pytest.raises(ValueError, match="--qk-rope-rounding must be emulated or hardware"):
        make_engine(tiny_model, qk_rope_rounding="fast")
    seen: list[bool] = []
    real = qk.qk_norm_rope_store

    def spy(*args, hw_round=False, **kw):
        seen.append(hw_round)
        return real(*args, hw_round=hw_round, **kw)

    monkeypatch.setattr(qk, "qk_norm_rope_store", spy)
    for mode in ("emulated", "hardware"):
        eng = make_engine(tiny_model, qk_rope_rounding=mode)
        run = eng.runner
        attn = run.model.layers[0].self_attn
        ids = make_prompts(eng, (3,))[0]  # one short prompt's prefill metadata
        slots = run.kv.tokens.alloc(len(ids))
        meta = make_prefill_meta([(0, slots, slots)], run.device, ids)
        x = run.model.embed_tokens(meta.input_ids)
        qkv = attn.qkv_proj(run.model.layers[0].input_layernorm(x))
        run._fused_qk_rope_kv(attn, qkv, meta.positions, meta)  # noqa: SLF001
        assert seen[-1] is (mode == "hardware")
