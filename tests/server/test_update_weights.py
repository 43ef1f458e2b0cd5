"""``POST /update_weights_from_disk``: new weights without a restart, in one process and with
the engine in a process of its own; refused checkpoints (another architecture, another size,
another SID layout, a missing directory) leave the served weights alone; and the load test:
c=16 closed loop with a swap between two checkpoints every few seconds, every answer equal to
a fresh server's on the checkpoint its ``X-FlashRec-Weights-Hash`` names, no error, no leak.

The two checkpoints are the tiny preset at seeds 0 and 1 (same shapes, other values); every
server serves the seed-0 checkpoint's catalog."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from server_helpers import ServerThread, server_config

from flashrec.engine.engine import Engine
from flashrec.engine.loop import EngineLoop
from flashrec.engine.weights import checkpoint_hash

PROMPTS = [f"user {i} watched item {i * 7}" for i in range(6)]
LOAD_S = float(os.environ.get("FLASHREC_WEIGHTS_LOAD_S", "24"))  # the load test's length
SWAP_GAP_S = 3.0
HEADER = "X-FlashRec-Weights-Hash"


@pytest.fixture(scope="module")
def ckpts(synth_model, tiny_checkpoint) -> dict[str, Path]:
    """a, b: the two checkpoints to swap between; and the bad ones."""
    a = tiny_checkpoint
    vocab = json.loads((a / "config.json").read_text())["vocab_size"]
    return {
        "a": a,
        "b": synth_model("tiny", seed=1),
        # another architecture (Llama: no q/k norm, untied LM head)
        "llama": synth_model("tiny-llama"),
        # another size: a wider MLP
        "wider": synth_model("tiny", intermediate_size=256),
        # every tensor of the served shapes, but a tokenizer with 48 codes a level
        "sid48": synth_model("tiny", codebook_size=48, vocab_size=vocab),
    }


def config(ckpt: Path, catalog: Path, **kw):
    return server_config(str(ckpt), sid_vocab_file=str(catalog / "catalog.json"), **kw)


def in_process(ckpt: Path, catalog: Path, **kw) -> ServerThread:
    cfg = config(ckpt, catalog, **kw)
    return ServerThread(EngineLoop(Engine(cfg)), cfg)


def engine_process(ckpt: Path, catalog: Path, **kw) -> ServerThread:
    from flashrec.server.engine_process import start_engine_process

    cfg = config(ckpt, catalog, engine_process="on", **kw)
    remote = start_engine_process(cfg)
    return ServerThread(remote, cfg, process=remote.proc)


def ask(session, url: str, text: str) -> tuple[tuple, str | None]:
    """A /generate answer's beams as (output ids, sequence score) pairs, and its weights
    header."""
    r = session.post(
        url + "/generate", json={"text": text, "sampling_params": {"n": 4}}, timeout=120
    )
    assert r.status_code == 200, r.text
    beams = tuple(
        (tuple(b["output_ids"]), b["meta_info"]["sequence_score"])
        for b in r.json()["meta_info"]["beam_results"]
    )
    return beams, r.headers.get(HEADER)


def answers(srv: ServerThread) -> dict[str, tuple]:
    with requests.Session() as s:
        return {p: ask(s, srv.url, p)[0] for p in PROMPTS}


def fresh_answers(ckpts: dict[str, Path], **kw) -> dict[str, dict[str, tuple]]:
    """hash -> prompt -> beams of a fresh server on each of a and b, one prompt at a time."""
    out = {}
    for name in ("a", "b"):
        with in_process(ckpts[name], ckpts["a"], **kw) as srv:
            out[checkpoint_hash(ckpts[name])] = answers(srv)
    assert len(out) == 2 and list(out.values())[0] != list(out.values())[1]
    return out


@pytest.fixture(scope="module")
def fresh(ckpts) -> dict[str, dict[str, tuple]]:
    """``fresh_answers`` of the default servers (radix cache on)."""
    return fresh_answers(ckpts)


@pytest.fixture(scope="module")
def fresh_det(ckpts) -> dict[str, dict[str, tuple]]:
    """``fresh_answers`` of deterministic servers: an answer under load (any batch) is
    comparable with them bit for bit."""
    return fresh_answers(ckpts, deterministic=True)


@pytest.fixture(params=["in-process", "engine-process"])
def server(request, ckpts) -> Iterator[ServerThread]:
    make = in_process if request.param == "in-process" else engine_process
    with make(ckpts["a"], ckpts["a"]) as srv:
        yield srv


def refused(srv: ServerThread, body: dict, status: int = 400) -> str:
    r = srv.post("/update_weights_from_disk", body)
    assert r.status_code == status, r.text
    got = r.json()
    assert got["success"] is False and isinstance(got["message"], str), got
    return got["message"]


def test_update_weights_endpoint(server: ServerThread, ckpts, fresh, tmp_path) -> None:
    ha, hb = checkpoint_hash(ckpts["a"]), checkpoint_hash(ckpts["b"])
    assert answers(server) == fresh[ha]  # the radix cache now holds a's KV of PROMPTS
    missing = str(tmp_path / "nowhere")
    assert missing in refused(server, {"model_path": missing})
    assert "architecture" in refused(server, {"model_path": str(ckpts["llama"])})
    assert "intermediate_size" in refused(server, {"model_path": str(ckpts["wider"])})
    assert "SID layout" in refused(server, {"model_path": str(ckpts["sid48"])})
    no_weights = tmp_path / "no-weights"  # a's config and tokenizer, no safetensors
    shutil.copytree(ckpts["a"], no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    refused(server, {"model_path": str(no_weights)})
    refused(server, {})
    refused(server, {"model_path": str(ckpts["b"]), "load_format": "gguf"})
    refused(server, {"model_path": str(ckpts["b"]), "flush_cache": False})
    refused(server, {"model_path": str(ckpts["b"]), "abort_all_requests": True})
    refused(server, {"model_path": str(ckpts["b"]), "recapture_cuda_graph": True})
    with requests.Session() as s:
        assert ask(s, server.url, PROMPTS[0])[1] == ha  # nothing changed
    assert server.metrics()["flashrec_kv_tokens_cached"] > 0

    r = server.post(
        "/update_weights_from_disk",
        {"model_path": str(ckpts["b"]), "load_format": "auto", "weight_version": "day-2"},
    )
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["success"] is True and info["message"]
    assert (info["weights_hash"], info["model_path"], info["weights_version"]) == (
        hb,
        str(ckpts["b"]),
        1,
    )
    assert info["weight_version"] == "day-2"
    assert {"load_ms", "hash_ms", "swap_ms", "swap_wait_ms", "release_ms"} <= set(info)
    assert 0 <= info["copy_ms"] <= info["load_ms"]  # the copy is the last part of the load
    assert info["staged_on"] == "cpu"  # a CPU server: the built tensors are the staging
    print(f"\nswap on CPU (tiny): {info['swap_ms']:.2f} ms; staged in {info['load_ms']:.1f} ms")
    assert server.metrics()["flashrec_kv_tokens_cached"] == 0  # a's KV flushed
    # the same prompts, cold again (a's KV flushed): as a fresh server on b answers them
    assert answers(server) == fresh[hb]
    with requests.Session() as s:
        assert ask(s, server.url, PROMPTS[1])[1] == hb
    weights = server.get("/get_server_info").json()["engine"]["weights"]
    assert (weights["hash"], weights["path"], weights["version"]) == (hb, str(ckpts["b"]), 1)
    assert weights["weight_version"] == "day-2" and "sha256" in weights["hash_method"]
    m = server.metrics()
    assert m[f'flashrec_weights_info{{path="{ckpts["b"]}",hash="{hb}"}}'] == 1
    assert m["flashrec_weights_version"] == 1
    assert m["flashrec_weight_updates_ok_total"] == 1
    assert m["flashrec_weight_updates_rejected_total"] == 5  # the checkpoints refused
    r = server.post("/update_weights_from_disk", {"model_path": str(ckpts["a"])})
    assert r.status_code == 200 and r.json()["weights_hash"] == ha
    assert answers(server) == fresh[ha]


def test_update_weights_under_load(ckpts, fresh_det) -> None:
    """c=16 closed loop for LOAD_S seconds, a swap between a and b every SWAP_GAP_S: every
    answer equals a fresh server's on the checkpoint its header names, and that checkpoint is
    one served while the request ran."""
    paths = [ckpts["a"], ckpts["b"]]
    hashes = [checkpoint_hash(p) for p in paths]
    swaps: list[tuple[float, float, str, float]] = []  # (sent, answered, hash, swap ms)
    results: list[tuple[float, float, str, tuple, str | None]] = []
    errors: list[str] = []
    stop = threading.Event()
    with in_process(ckpts["a"], ckpts["a"], deterministic=True) as srv:

        def client(i: int) -> None:
            with requests.Session() as s:
                j = 0
                while not stop.is_set():
                    prompt = PROMPTS[(i + j) % len(PROMPTS)]
                    t0 = time.monotonic()
                    try:
                        beams, h = ask(s, srv.url, prompt)
                    except (AssertionError, requests.RequestException) as exc:
                        errors.append(repr(exc)[:200])
                        continue
                    results.append((t0, time.monotonic(), prompt, beams, h))
                    j += 1

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(16)]
        for t in threads:
            t.start()
        end = time.monotonic() + LOAD_S
        k = 0
        while time.monotonic() < end:
            time.sleep(SWAP_GAP_S)
            k += 1
            t0 = time.monotonic()
            r = srv.post("/update_weights_from_disk", {"model_path": str(paths[k % 2])})
            if r.status_code != 200:
                errors.append(f"swap {r.status_code} {r.text[:200]}")
            else:
                swaps.append((t0, time.monotonic(), r.json()["weights_hash"], r.json()["swap_ms"]))
        stop.set()
        for t in threads:
            t.join(timeout=180)
        idle = srv.wait_engine_idle()

    assert not errors, errors[:5]
    assert len(swaps) >= 4 and [s[2] for s in swaps] == [
        hashes[(i + 1) % 2] for i in range(len(swaps))
    ]
    seen = dict.fromkeys(hashes, 0)
    for sent, answered, prompt, beams, h in results:
        assert h in fresh_det, h
        assert beams == fresh_det[h][prompt], (prompt, h)
        before = [s[2] for s in swaps if s[1] <= sent]
        allowed = {before[-1] if before else hashes[0]}
        allowed |= {s[2] for s in swaps if s[0] < answered and s[1] > sent}
        assert h in allowed, (sent, answered, h, allowed)
        seen[h] += 1
    assert all(n > 0 for n in seen.values()), seen
    assert idle["flashrec_slots_used"] == 0 and idle["flashrec_kv_tokens_used"] == 0
    assert idle["flashrec_running_requests"] == 0 and idle["flashrec_queue_length"] == 0
    assert idle["flashrec_weight_updates_ok_total"] == len(swaps)
    ms = sorted(s[3] for s in swaps)
    print(
        f"\n{len(results)} answers, {len(swaps)} swaps under c=16; swap ms median "
        f"{ms[len(ms) // 2]:.2f}, max {ms[-1]:.2f}"
    )


def test_update_weights_built_in_a_child(ckpts, fresh) -> None:
    """``--weights-build child`` in an engine process (daemonic: the builder is a plain
    subprocess): the checkpoint is hashed and built by a child, and the server then answers
    exactly as a fresh one on it; a bad one is still refused with nothing changed."""
    ha, hb = checkpoint_hash(ckpts["a"]), checkpoint_hash(ckpts["b"])
    with engine_process(ckpts["a"], ckpts["a"], weights_build="child") as srv:
        assert "intermediate_size" in refused(srv, {"model_path": str(ckpts["wider"])})
        assert answers(srv) == fresh[ha]
        r = srv.post("/update_weights_from_disk", {"model_path": str(ckpts["b"])})
        assert r.status_code == 200, r.text
        assert r.json()["weights_hash"] == hb
        assert answers(srv) == fresh[hb]
