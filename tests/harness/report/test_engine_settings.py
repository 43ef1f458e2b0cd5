"""REPORT.md's engine-settings table, read from each FlashRec server's /get_server_info."""

from __future__ import annotations

from harness.report.render_sections import engine_settings_table, extra_tables


def _cell(cid: str, engine: dict | None) -> dict:
    info = {"engine": engine} if engine is not None else {}
    return {"id": cid, "status": "ok", "metrics": {}, "server": {"info": info}}


GPU = {
    "device": "cuda",
    "dtype": "torch.bfloat16",
    "fp8": True,
    "kv_cache_dtype": "torch.float8_e4m3fn",
    "attention_backend": "flashinfer",
    "engine_process_pid": 1234,
    "effective": {
        "cuda_graphs": True,
        "decode_graph_sizes": [50, 100, 150, 200],
        "step_graph": True,
        "step_graph_sizes": [50, 100, 150, 200],
        "prefill_graph_max_tokens": 2048,
        "piecewise_prefill_max_tokens": 8192,
        "kv_reorder_positions": 1,
        "overlap_results": True,
    },
}
CPU = {
    "device": "cpu",
    "dtype": "torch.float32",
    "fp8": False,
    "kv_cache_dtype": "torch.float32",
    "attention_backend": "torch",
    "effective": {
        "cuda_graphs": False,
        "decode_graph_sizes": [],
        "step_graph": True,
        "step_graph_sizes": [],
        "prefill_graph_max_tokens": 0,
        "piecewise_prefill_max_tokens": 0,
        "kv_reorder_positions": 1,
    },  # a server from before --overlap-results: "-"
}


def test_rows_say_what_each_server_ran_with():
    gpu = _cell("gpu", GPU)
    gpu["server"]["startup_s"] = 31.46  # launched by the run
    report = {
        "cells": [
            gpu,
            _cell("cpu", CPU),
            _cell("sglang", {"version": "x"}),  # another engine: no effective block
            _cell("fake", None),
        ]
    }
    head, rows = engine_settings_table(report)
    assert head[0] == "cell" and head[-2:] == ["engine process", "server start s"]
    assert rows == [
        ["gpu", "cuda, bfloat16", "yes", "float8_e4m3fn", "flashinfer", "4 sizes, 50..200 rows",
         "on (4 sizes, 50..200 rows)", "2048", "8192", "on", "on", "31.5"],
        ["cpu", "cpu, float32", "no", "float32", "torch", "eager", "on (eager)", "0", "0", "-",
         "off", "-"],
    ]  # fmt: skip
    titles = [t for t, _, _ in extra_tables({**report, "targets": {}})]
    assert "Engine settings (from /get_server_info)" in titles
    # the decode's prompt part through FlashInfer (--decode-prompt-attention) is named
    bf16 = {**GPU, "kv_cache_dtype": "torch.bfloat16", "decode_prompt_attention": "flashinfer"}
    tri = {**GPU, "decode_prompt_attention": "triton"}
    _, rows = engine_settings_table({"cells": [_cell("bf16", bf16), _cell("fp8", tri)]})
    assert [r[4] for r in rows] == ["flashinfer (decode prompt: flashinfer)", "flashinfer"]


def test_no_flashrec_server_no_table():
    assert engine_settings_table({"cells": [_cell("fake", None)]}) is None
    off = {**CPU, "effective": {**CPU["effective"], "step_graph": False}}
    _, rows = engine_settings_table({"cells": [_cell("c", off)]})
    assert rows[0][6] == "off"
