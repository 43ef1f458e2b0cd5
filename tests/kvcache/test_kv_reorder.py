"""KVCache.reorder: the decode rows follow their parents over the positions a later forward
reads, moved as 8-byte words where a head's row allows, bit for bit."""

from __future__ import annotations

import pytest
import torch

from flashrec.config import ModelConfig
from flashrec.kvcache.pool import KVCache


def _kv(dtype: torch.dtype, head_dim: int, depth: int = 3) -> KVCache:
    cfg = ModelConfig("Qwen3ForCausalLM", 64, 2, 4, 2, head_dim, 128, 100, 1e-6, 1e6, 4096, True)
    kv = KVCache(cfg, pool_tokens=16, row_slots=6, depth=depth, dtype=dtype, device="cpu")
    g = torch.Generator().manual_seed(0)
    kv.dkv.copy_(torch.randn(kv.dkv.shape, generator=g).to(dtype))
    return kv


@pytest.mark.parametrize(
    "dtype,head_dim,words",
    [
        (torch.float32, 16, True),
        (torch.bfloat16, 16, True),
        (torch.float8_e4m3fn, 16, True),
        (torch.bfloat16, 6, False),  # 12-byte rows: moved in the buffer's own dtype
    ],
)
@pytest.mark.parametrize("positions", [None, 0, 1, 2, 3])
def test_reorder_moves_the_live_positions_bit_for_bit(dtype, head_dim, words, positions):
    kv = _kv(dtype, head_dim)
    assert (kv._words.dtype == torch.int64) is words
    before = kv.dkv.view(torch.uint8).clone()  # bytes: FP8 has no comparison ops on CPU
    kv.reorder_positions = positions
    rows = torch.tensor([0, 1, 2, 3])
    src = torch.tensor([2, 2, 0, 1])  # a beam may be the parent of several
    kv.reorder(rows, src)
    after = kv.dkv.view(torch.uint8)
    p = kv.depth if positions is None else positions
    for r, s in zip(rows.tolist(), src.tolist()):
        assert torch.equal(after[:, r, :p], before[:, s, :p])  # parents' KV, read before writes
        assert torch.equal(after[:, r, p:], before[:, r, p:])  # the rest untouched
    assert torch.equal(after[:, 4:], before[:, 4:])  # other rows and the scratch row


def test_reorder_of_nothing_is_a_no_op():
    kv = _kv(torch.bfloat16, 16)
    before = kv.dkv.clone()
    kv.reorder(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long))
    kv.reorder_positions = 0
    kv.reorder(torch.tensor([0]), torch.tensor([1]))
    assert torch.equal(kv.dkv, before)


@pytest.mark.parametrize("scope,expected", [("level", 1), ("sid", 2), ("full", 2)])
def test_engine_reorders_what_the_next_forward_reads(tiny_model, scope, expected):
    """3 SID levels: decode forwards for levels 1 and 2, plus the end token's unless its
    logprob is free (level scope); a reorder carries the positions written before the last
    forward."""
    from flashrec.config import EngineConfig
    from flashrec.engine.engine import Engine

    eng = Engine(
        EngineConfig(
            model_path=str(tiny_model),
            sid_vocab_file=str(tiny_model / "catalog.json"),
            logprob_scope=scope,
            batch_slots=64,
        )
    )
    assert eng.runner.depth == 3
    assert eng.runner.kv.reorder_positions == expected


def test_reorder_probe_script_runs_both_forms(tmp_path):
    """scripts/probes/reorder_probe.py (the device A/B of both reorder forms), CPU smoke size."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "scripts/probes/reorder_probe.py", "--device", "cpu", "--repeats", "1",
         "--layers", "1", "--scale", "8"],
        cwd=root, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["cell"] for r in rows] == ["n512_c8_fp8", "n50_c32_fp8", "p1000_n256_c1_bf16"]
    for r in rows:
        assert r["all_positions_ms"] > 0 and r["live_words_ms"] > 0 and r["speedup"] > 0
