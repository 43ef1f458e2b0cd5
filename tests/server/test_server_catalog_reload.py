"""``POST /update_catalog``: catalog hot reload over HTTP, in one process and with the engine
in a process of its own, and the load test: c=16 closed loop with a swap every half second,
every answer's beams valid in the catalog its request started with, no error, no slot leak.

The two catalogs split level 0 (codes < 32 and >= 32): a beam of one is never valid in the
other, so a request decoded with the wrong trie cannot pass."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from server_helpers import ServerThread, server_config

from flashrec.engine.engine import Engine
from flashrec.engine.loop import EngineLoop
from flashrec.sid.version import catalog_hash
from flashrec.synth import synth_catalog, write_catalog_json

K, CODE_START, DEPTH = 64, 261, 3  # the tiny preset's SID layout
# the load test's swaps, one every SWAP_GAP_S under load (a count, not a rate: any machine)
SWAPS = int(os.environ.get("FLASHREC_RELOAD_SWAPS", "24"))
SWAP_GAP_S = 0.5


@pytest.fixture(scope="module")
def catalogs(tmp_path_factory) -> dict[str, tuple[str, set]]:
    """hash -> (path, SIDs) of the two catalogs A and B."""
    d = tmp_path_factory.mktemp("catalogs")
    codes = synth_catalog(3000, K, DEPTH, seed=11)
    out = {}
    for name, part in (("a", codes[codes[:, 0] < 32]), ("b", codes[codes[:, 0] >= 32])):
        path = write_catalog_json(part, d / f"{name}.json")
        out[catalog_hash(part)] = (str(path), set(map(tuple, part.tolist())))
    return out


def path_of(catalogs: dict, i: int) -> tuple[str, str]:
    """(hash, path) of catalog A (i even) or B (i odd)."""
    h = list(catalogs)[i % 2]
    return h, catalogs[h][0]


def in_process(ckpt: Path, catalog: str, **kw) -> ServerThread:
    config = server_config(str(ckpt), sid_vocab_file=catalog, **kw)
    engine = Engine(config)
    return ServerThread(EngineLoop(engine), config)


def engine_process(ckpt: Path, catalog: str, **kw) -> ServerThread:
    from flashrec.server.engine_process import start_engine_process

    config = server_config(str(ckpt), sid_vocab_file=catalog, engine_process="on", **kw)
    remote = start_engine_process(config)
    return ServerThread(remote, config, process=remote.proc)


def beam_sids(body: dict) -> list[tuple[int, ...]]:
    """The SIDs of a /generate answer's beams (codes, the end token dropped)."""
    out = []
    for beam in body["meta_info"]["beam_results"]:
        ids = beam["output_ids"][:DEPTH]
        out.append(tuple((t - CODE_START) - level * K for level, t in enumerate(ids)))
    return out


def generate(session, url: str, text: str) -> dict:
    r = session.post(
        url + "/generate", json={"text": text, "sampling_params": {"n": 4}}, timeout=120
    )
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(params=["in-process", "engine-process"])
def server(request, tiny_checkpoint, catalogs) -> Iterator[ServerThread]:
    make = in_process if request.param == "in-process" else engine_process
    with make(tiny_checkpoint, path_of(catalogs, 0)[1]) as srv:
        yield srv


def test_update_catalog_endpoint(server: ServerThread, catalogs, bad_catalogs) -> None:
    ha, _ = path_of(catalogs, 0)
    hb, pb = path_of(catalogs, 1)
    with requests.Session() as s:
        assert generate(s, server.url, "one")["meta_info"]["catalog_hash"] == ha
        for name, path in bad_catalogs.items():  # refused; A keeps serving
            r = server.post("/update_catalog", {"path": path})
            assert r.status_code == 400, (name, r.text)
            assert path in r.json()["error"]["message"], name
        assert server.post("/update_catalog", {}).status_code == 400  # no path
        body = generate(s, server.url, "two")
        assert body["meta_info"]["catalog_hash"] == ha
        assert set(beam_sids(body)) <= catalogs[ha][1]

        r = server.post("/update_catalog", {"path": pb})
        assert r.status_code == 200, r.text
        info = r.json()
        assert (info["catalog_hash"], info["sids"], info["depth"]) == (hb, len(catalogs[hb][1]), 3)
        assert {"load_ms", "build_ms", "swap_ms", "swap_wait_ms"} <= set(info)
        body = generate(s, server.url, "three")
        assert body["meta_info"]["catalog_hash"] == hb
        assert set(beam_sids(body)) <= catalogs[hb][1]
        chat = s.post(
            server.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "n": 2},
            timeout=120,
        ).json()
        assert chat["catalog_hash"] == hb
    cat = server.get("/get_server_info").json()["engine"]["catalog"]
    assert (cat["hash"], cat["path"], cat["sids"], cat["depth"]) == (
        hb,
        pb,
        len(catalogs[hb][1]),
        3,
    )
    m = server.metrics()
    assert m[f'flashrec_catalog_info{{hash="{hb}"}}'] == 1
    assert m["flashrec_catalog_reloads_ok_total"] == 1
    assert m["flashrec_catalog_reloads_rejected_total"] == 6  # every bad_catalogs file
    assert m["flashrec_catalog_sids"] == len(catalogs[hb][1])


def test_reload_under_load(tiny_checkpoint, catalogs) -> None:
    """c=16 closed loop through SWAPS swaps alternating A and B, SWAP_GAP_S apart (static
    step on: batches mixing catalogs take the eager expansion). A request may start on either
    side of a swap that overlaps it: the catalog it reports must be the one active when it
    was sent or one swapped in while it ran, and every beam must be valid in that catalog."""
    h0, p0 = path_of(catalogs, 0)
    reloads: list[tuple[float, float, str]] = []  # (sent, answered, hash) of each swap
    results: list[tuple[float, float, dict]] = []  # (sent, answered, body) of each request
    errors: list[str] = []
    stop = threading.Event()
    with in_process(tiny_checkpoint, p0, enable_step_graph=True) as srv:

        def client(i: int) -> None:
            with requests.Session() as s:
                j = 0
                while not stop.is_set():
                    t0 = time.monotonic()
                    try:
                        r = s.post(
                            srv.url + "/generate",
                            json={"text": f"user {i} event {j}", "sampling_params": {"n": 4}},
                            timeout=120,
                        )
                    except requests.RequestException as exc:
                        errors.append(repr(exc))
                        continue
                    if r.status_code != 200:
                        errors.append(f"{r.status_code} {r.text[:200]}")
                    else:
                        results.append((t0, time.monotonic(), r.json()))
                    j += 1

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(16)]
        for t in threads:
            t.start()
        for i in range(1, SWAPS + 1):
            time.sleep(SWAP_GAP_S)
            h, path = path_of(catalogs, i)
            t0 = time.monotonic()
            r = srv.post("/update_catalog", {"path": path})
            if r.status_code != 200:
                errors.append(f"reload {r.status_code} {r.text[:200]}")
            else:
                assert r.json()["catalog_hash"] == h
                reloads.append((t0, time.monotonic(), h))
        stop.set()
        for t in threads:
            t.join(timeout=180)
        idle = srv.wait_engine_idle()
        info = srv.get("/get_server_info").json()["engine"]["catalog"]

    assert not errors, errors[:5]
    assert len(reloads) == SWAPS
    seen = {h: 0 for h in catalogs}
    for sent, answered, body in results:
        h = body["meta_info"]["catalog_hash"]
        before = [x[2] for x in reloads if x[1] <= sent]
        allowed = {before[-1] if before else h0}
        allowed |= {x[2] for x in reloads if x[0] < answered and x[1] > sent}
        assert h in allowed, (sent, answered, h, allowed)
        sids = beam_sids(body)
        assert len(sids) == 4 and set(sids) <= catalogs[h][1], (h, sids)
        seen[h] += 1
    assert all(n > 0 for n in seen.values()), seen  # both catalogs served requests
    # no slot leak, older catalogs released (the served one and the previous a rollback
    # returns to are kept), every swap counted
    assert idle["flashrec_slots_used"] == 0 and idle["flashrec_kv_tokens_used"] == 0
    assert idle["flashrec_running_requests"] == 0
    assert len(reloads) > 2 and idle["flashrec_catalogs_live"] == 2
    assert idle["flashrec_catalog_reloads_ok_total"] == len(reloads)
    assert idle["flashrec_catalog_reloads_rejected_total"] == 0
    assert idle[f'flashrec_catalog_info{{hash="{reloads[-1][2]}"}}'] == 1
    assert info["hash"] == reloads[-1][2]
    # the static step served and the swaps sent mixed batches to the eager expansion
    assert idle["flashrec_decode_other_catalog_steps_total"] > 0
    assert np.isfinite(idle["flashrec_catalog_last_swap_ms"])


def test_engine_without_catalogs_refuses(fake: ServerThread) -> None:
    r = fake.post("/update_catalog", {"path": "/nowhere.json"})
    assert r.status_code == 400
    assert "cannot reload" in r.json()["error"]["message"]
    assert fake.metrics()["flashrec_catalog_reloads_rejected_total"] == 1
