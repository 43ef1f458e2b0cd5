"""``Engine.server_info()["effective"]``: what the auto knobs resolved to on this device."""

from __future__ import annotations

import json

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine


def _info(model, **kw) -> dict:
    cfg = EngineConfig(
        model_path=str(model), sid_vocab_file=str(model / "catalog.json"), batch_slots=64, **kw
    )
    info = Engine(cfg).server_info()
    json.dumps(info, default=str)  # served as JSON by /get_server_info
    return info["effective"]


def test_cpu_defaults_resolve_to_eager(tiny_model):
    assert _info(tiny_model) == {
        "cuda_graphs": False,
        "decode_graph_sizes": [],
        "step_graph": False,  # auto: off where no decode graphs are captured
        "step_graph_sizes": [],
        "prefill_graph_max_tokens": 0,
        "piecewise_prefill_max_tokens": 0,
        "kv_reorder_positions": 1,  # 3 SID levels, free end token
        "overlap_results": False,  # on with CUDA only: nothing to overlap on CPU
    }


def test_explicit_knobs_show_through(tiny_model):
    eff = _info(
        tiny_model,
        enable_step_graph=True,
        prefill_graph_max_tokens=256,
        piecewise_prefill_max_tokens=512,
        logprob_scope="full",
        overlap_results=True,
    )
    assert eff["step_graph"] is True and eff["step_graph_sizes"] == []  # eager on CPU
    assert eff["prefill_graph_max_tokens"] == 256
    assert eff["piecewise_prefill_max_tokens"] == 512
    assert eff["kv_reorder_positions"] == 2  # the end token's forward reads one more
    assert eff["overlap_results"] is True
