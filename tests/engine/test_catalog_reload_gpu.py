"""The catalog hot-reload times on a GPU for a 1.5M-SID catalog (the number docs/baselines.md
records). Run on the device::

    python -m pytest -m gpu -s tests/engine/test_catalog_reload_gpu.py

It prints one ``CATALOG_RELOAD {...}`` JSON line per swap: load, build (trie on the CPU,
then moved to the GPU), the engine thread's swap and how long the reload waited for it,
measured while 16 requests keep the engine busy."""

from __future__ import annotations

import json
import os

import pytest
import torch

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine
from flashrec.engine.loop import EngineLoop
from flashrec.synth import build_checkpoint, synth_catalog, write_catalog_json

SIDS = int(os.environ.get("FLASHREC_RELOAD_SIDS", "1500000"))
K = 8192  # OneRec's codebook
DEVICE = os.environ.get("FLASHREC_RELOAD_DEVICE", "cuda")  # "cpu": a dry run of this script


@pytest.mark.gpu
def test_reload_swap_time_1_5m(tmp_path):
    assert DEVICE == "cpu" or torch.cuda.is_available()
    # head_dim 128: the CUDA default attention backend (FlashInfer) takes 64 / 128 / 256 only
    ckpt = build_checkpoint(
        tmp_path / "model", "tiny", codebook_size=K, catalog_size=1000, hidden_size=256,
        num_attention_heads=2, num_key_value_heads=1, head_dim=128,
    )  # fmt: skip
    paths = []
    for seed in (1, 2):
        codes = synth_catalog(SIDS, K, 3, seed=seed)
        paths.append(str(write_catalog_json(codes, tmp_path / f"catalog{seed}.json")))
    engine = Engine(
        EngineConfig(model_path=str(ckpt), sid_vocab_file=paths[0], device=DEVICE, beam_width=32)
    )
    loop = EngineLoop(engine)
    loop.start()
    try:
        prompt = engine.build_prompt(messages=[{"role": "user", "content": "reload"}])
        for i, path in enumerate([paths[1], paths[0], paths[1]]):
            futs = [loop.submit(engine.new_request(prompt, rid=f"r{i}-{j}")) for j in range(16)]
            info = loop.reload_catalog(path)  # while those run
            for f in futs:
                f.result(timeout=300)
            print("CATALOG_RELOAD", json.dumps({**info, "device": _device_name()}))
            assert info["sids"] == SIDS and info["depth"] == 3
        stats = loop.stats()
        print(
            "CATALOG_RELOAD_STATS", json.dumps({k: v for k, v in stats.items() if "catalog" in k})
        )
        assert stats["catalog_reloads_ok_total"] == 3
    finally:
        loop.stop()


def _device_name() -> str:
    return torch.cuda.get_device_name(0) if DEVICE != "cpu" else "cpu"
