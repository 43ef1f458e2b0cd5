"""The server on CUDA (tiny checkpoint): warm-up, answers, and a profile with GPU activity."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from server_helpers import process_server, real_server

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("engine_process", [False, True])
def test_gpu_server_answers_and_profiles(
    tiny_checkpoint: Path, profiler_dir: Path, engine_process: bool
) -> None:
    """Both serving modes (engine thread in the server process, engine process): answers,
    repeatable beams, a profile with the engine's spans and GPU kernels."""
    body = {"messages": [{"role": "user", "content": "gpu"}], "n": 16}
    make = process_server if engine_process else real_server
    with make(tiny_checkpoint, device="cuda", warmup=True) as srv:
        first = srv.post("/v1/chat/completions", body)
        assert first.status_code == 200, first.text
        assert len(first.json()["choices"]) == 16
        assert srv.post("/start_profile", {"output_dir": "gpu"}).status_code == 200
        again = srv.post("/v1/chat/completions", body).json()
        (path,) = srv.post("/stop_profile").json()["files"]
        ids = [c["sglext"]["token_ids"] for c in first.json()["choices"]]
        assert [c["sglext"]["token_ids"] for c in again["choices"]] == ids
        m = srv.metrics()
        assert m["flashrec_slots_used"] == 0 and m["flashrec_kv_tokens_used"] == 0
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert "flashrec.schedule" in names and "flashrec.beam" in names
    assert any(e.get("cat") == "kernel" for e in events), "no GPU kernels in the trace"
