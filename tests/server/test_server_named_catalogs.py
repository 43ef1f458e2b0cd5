"""Several named catalogs in one server (``--sid-vocab-file NAME=PATH``, repeatable): a request
picks one (``catalog`` in the chat body, in ``sampling_params`` of ``/generate``), each named
catalog is swapped on its own (``/update_catalog {"name", "path"}``) and returns to its previous
version (``/rollback_catalog {"name"}``); ``/get_server_info`` and ``/metrics`` list them all.

The catalogs split level 0 into disjoint ranges, so every SID tells which catalog decoded it:
a request served by the wrong trie cannot pass. Sizes differ on purpose (a catalog's device
bytes and SID count are checked per name)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from server_helpers import ServerThread, server_config

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine
from flashrec.engine.loop import EngineLoop
from flashrec.sid.version import catalog_hash
from flashrec.synth import synth_catalog, write_catalog_json

K, CODE_START, DEPTH = 64, 261, 3  # the tiny preset's SID layout
# name -> level-0 code range; "ad2" is the file /update_catalog puts under the name "ad"
RANGES = {"video": (0, 16), "ad": (16, 24), "product": (32, 64), "ad2": (24, 32)}


@pytest.fixture(scope="module")
def catalogs(tmp_path_factory) -> dict[str, tuple[str, str, set]]:
    """name -> (path, hash, SIDs) of four catalogs over disjoint level-0 ranges."""
    d = tmp_path_factory.mktemp("named")
    codes = synth_catalog(4000, K, DEPTH, seed=5)
    out = {}
    for name, (lo, hi) in RANGES.items():
        part = codes[(codes[:, 0] >= lo) & (codes[:, 0] < hi)]
        path = write_catalog_json(part, d / f"{name}.json")
        out[name] = (str(path), catalog_hash(part), set(map(tuple, part.tolist())))
    return out


def specs(catalogs: dict, names=("video", "ad", "product")) -> tuple[str, ...]:
    return tuple(f"{n}={catalogs[n][0]}" for n in names)


def in_process(ckpt: Path, files: tuple[str, ...]) -> ServerThread:
    config = server_config(str(ckpt), sid_vocab_file=files)
    return ServerThread(EngineLoop(Engine(config)), config)


def engine_process(ckpt: Path, files: tuple[str, ...]) -> ServerThread:
    from flashrec.server.engine_process import start_engine_process

    config = server_config(str(ckpt), sid_vocab_file=files, engine_process="on")
    remote = start_engine_process(config)
    return ServerThread(remote, config, process=remote.proc)


@pytest.fixture(params=["in-process", "engine-process"])
def server(request, tiny_checkpoint, catalogs) -> Iterator[ServerThread]:
    make = in_process if request.param == "in-process" else engine_process
    with make(tiny_checkpoint, specs(catalogs)) as srv:
        yield srv


def beam_sids(body: dict) -> set[tuple[int, ...]]:
    out = set()
    for beam in body["meta_info"]["beam_results"]:
        ids = beam["output_ids"][:DEPTH]
        out.add(tuple((t - CODE_START) - level * K for level, t in enumerate(ids)))
    return out


def generate(s: requests.Session, url: str, catalog: str | None, text: str = "x") -> dict:
    sp = {"n": 4} if catalog is None else {"n": 4, "catalog": catalog}
    r = s.post(url + "/generate", json={"text": text, "sampling_params": sp}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def served_by(s, url: str, catalogs: dict, name: str | None, file: str) -> None:
    """A /generate request naming ``name`` decoded over ``catalogs[file]``, and a chat request
    naming it too (its answer's catalog hash)."""
    body = generate(s, url, name)
    assert body["meta_info"]["catalog_hash"] == catalogs[file][1], (name, file)
    assert beam_sids(body) <= catalogs[file][2], (name, file)
    chat = {"messages": [{"role": "user", "content": "y"}], "n": 2}
    if name is not None:
        chat["catalog"] = name
    r = s.post(url + "/v1/chat/completions", json=chat, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["catalog_hash"] == catalogs[file][1], (name, file)


def by_name(server: ServerThread) -> dict[str, dict]:
    info = server.get("/get_server_info").json()["engine"]
    return {c["name"]: c for c in info["catalogs"]}


def refused(r: requests.Response, param: str, *words: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and all(w in err["message"] for w in words), err


def test_pick_update_rollback(server: ServerThread, catalogs) -> None:
    url = server.url
    held = by_name(server)
    assert list(held) == ["video", "ad", "product"]
    assert [c["default"] for c in held.values()] == [True, False, False]
    for name, c in held.items():
        assert (c["version"], c["previous"], c["hash"]) == (1, None, catalogs[name][1])
        assert c["sids"] == len(catalogs[name][2]) and c["device_bytes"] > 0
    # more SIDs, more device bytes: the per-catalog figure is each catalog's own
    assert held["product"]["device_bytes"] > held["ad"]["device_bytes"]
    with requests.Session() as s:
        served_by(s, url, catalogs, None, "video")  # the default
        for name in held:
            served_by(s, url, catalogs, name, name)
        # unknown names: 400 listing the held ones, on both protocols
        r = s.post(url + "/generate", json={"text": "x", "sampling_params": {"catalog": "z"}})
        refused(r, "sampling_params.catalog", "'z'", "video, ad, product")
        chat = {"messages": [{"role": "user", "content": "y"}], "catalog": "z"}
        refused(s.post(url + "/v1/chat/completions", json=chat), "catalog", "'z'", "video")
        chat["catalog"] = 3
        refused(s.post(url + "/v1/chat/completions", json=chat), "catalog", "string")

        # a rollback with no previous version, an update of an unknown name: nothing changes
        refused(server.post("/rollback_catalog", {"name": "ad"}), "name", "no previous version")
        refused(server.post("/rollback_catalog", {"name": "z"}), "name", "'z'", "video")
        r = server.post("/update_catalog", {"name": "z", "path": catalogs["ad2"][0]})
        refused(r, "name", "'z'")
        assert by_name(server) == held

        # ad swapped alone: version 2 serves, version 1 kept; the others untouched
        r = server.post("/update_catalog", {"name": "ad", "path": catalogs["ad2"][0]})
        assert r.status_code == 200, r.text
        info = r.json()
        assert (info["name"], info["version"], info["previous_version"]) == ("ad", 2, 1)
        assert info["catalog_hash"] == catalogs["ad2"][1]
        served_by(s, url, catalogs, "ad", "ad2")
        served_by(s, url, catalogs, None, "video")
        now = by_name(server)
        assert (now["ad"]["version"], now["ad"]["hash"]) == (2, catalogs["ad2"][1])
        assert (now["ad"]["previous"]["version"], now["ad"]["previous"]["hash"]) == (
            1,
            catalogs["ad"][1],
        )
        assert now["video"] == held["video"] and now["product"] == held["product"]
        m = server.metrics()
        assert m['flashrec_catalog_version{name="ad"}'] == 2
        assert m['flashrec_catalog_previous_version{name="ad"}'] == 1
        assert m['flashrec_catalog_version{name="video"}'] == 1
        assert m['flashrec_catalog_size{name="ad"}'] == len(catalogs["ad2"][2])
        assert m['flashrec_catalog_device_bytes{name="ad"}'] > now["ad"]["device_bytes"]
        h = catalogs["ad2"][1]
        assert m[f'flashrec_catalog_hash_info{{name="ad",hash="{h}",default="false"}}'] == 1

        # back to version 1; a second rollback has nothing to return to
        r = server.post("/rollback_catalog", {"name": "ad"})
        assert r.status_code == 200, r.text
        assert (r.json()["version"], r.json()["catalog_hash"]) == (1, catalogs["ad"][1])
        served_by(s, url, catalogs, "ad", "ad")
        assert by_name(server)["ad"]["previous"] is None
        refused(server.post("/rollback_catalog", {"name": "ad"}), "name", "no previous version")
        # a number is never given out twice for a name: the next reload is version 3
        r = server.post("/update_catalog", {"name": "ad", "path": catalogs["ad2"][0]})
        assert (r.json()["version"], r.json()["previous_version"]) == (3, 1), r.text
        assert server.post("/rollback_catalog", {"name": "ad"}).json()["version"] == 1

        # the default by omission: update and roll back without a name
        assert server.post("/update_catalog", {"path": catalogs["ad2"][0]}).status_code == 200
        served_by(s, url, catalogs, None, "ad2")
        assert server.post("/rollback_catalog").status_code == 200
        served_by(s, url, catalogs, "video", "video")
    m = server.metrics()
    assert m["flashrec_catalog_rollbacks_ok_total"] == 3
    assert m["flashrec_catalog_rollbacks_rejected_total"] == 2  # "z": refused before the engine
    assert m["flashrec_catalog_reloads_ok_total"] == 3
    assert m["flashrec_catalog_reloads_rejected_total"] == 0  # z refused before staging


def engine(ckpt: Path, files, **kw) -> Engine:
    cfg = EngineConfig(
        model_path=str(ckpt), sid_vocab_file=files, batch_slots=64, beam_width=8, **kw
    )
    return Engine(cfg)


def beams(result) -> list[list[int]]:
    return [list(map(int, ids)) for ids in result.beams.token_ids]


@pytest.mark.parametrize("step_graph", [False, True], ids=["eager", "static-step"])
def test_mixed_batch_equals_each_catalog_alone(tiny_checkpoint, catalogs, step_graph) -> None:
    """Requests of three catalogs decoding in one batch each get the beams (and scores) of an
    engine serving its catalog alone: the per-request tries never mix."""
    eng = engine(tiny_checkpoint, specs(catalogs), enable_step_graph=step_graph)
    prompts = [eng.build_prompt(messages=[{"role": "user", "content": f"p{i}"}]) for i in range(3)]
    names = ["product", "video", "ad"]
    reqs = [eng.new_request(p, n=8, catalog=c) for p, c in zip(prompts, names)]
    mixed = eng.generate(reqs)
    for name, prompt, got in zip(names, prompts, mixed):
        alone = engine(tiny_checkpoint, catalogs[name][0], enable_step_graph=step_graph)
        (want,) = alone.generate([alone.new_request(prompt, n=8)])
        assert got.catalog_hash == catalogs[name][1]
        assert beams(got) == beams(want), name
        np.testing.assert_allclose(got.beams.cum_logprobs, want.beams.cum_logprobs, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown catalog 'z'; this server holds: video"):
        eng.generate([eng.new_request(prompts[0], n=8, catalog="z")])


def test_bad_catalog_flags(tiny_checkpoint, catalogs, tmp_path) -> None:
    """Two unnamed files, a name given twice, an empty path, a catalog of another depth: each
    refused at start-up with the reason."""
    a, b = catalogs["video"][0], catalogs["ad"][0]
    for files, words in [
        ((a, b), "'default' given twice"),
        ((f"x={a}", f"x={b}"), "'x' given twice"),
        (("x=",), "no path after 'x='"),
    ]:
        with pytest.raises(ValueError, match=words):
            EngineConfig(model_path=str(tiny_checkpoint), sid_vocab_file=files)
    deep = write_catalog_json(synth_catalog(200, K, 2, seed=1), tmp_path / "two_levels.json")
    with pytest.raises(ValueError, match="2 levels; the server decodes 3"):
        engine(tiny_checkpoint, (f"video={a}", f"short={deep}"))


def test_flag_repeats_on_the_command_line(tmp_path) -> None:
    """``flashrec serve`` takes ``--sid-vocab-file`` repeatedly, in order, the first the default;
    given once it is the plain path it always was."""
    from flashrec.cli import build_parser
    from flashrec.config import ServerConfig, config_from_args

    argv = ["serve", "--model-path", "m", "--sid-vocab-file", "video=/v.json"]
    one = config_from_args(ServerConfig, build_parser().parse_args(argv))
    assert one.sid_vocab_file == "video=/v.json" and one.catalog_specs == (("video", "/v.json"),)
    argv += ["--sid-vocab-file", "ad=/a.json", "--sid-vocab-file", "/data/p=1.json"]
    with pytest.raises(ValueError, match="'default'"):  # /data/p=1.json is unnamed: fine alone
        config_from_args(ServerConfig, build_parser().parse_args([*argv, "--sid-vocab-file", "x"]))
    many = config_from_args(ServerConfig, build_parser().parse_args(argv))
    assert many.catalog_specs == (
        ("video", "/v.json"),
        ("ad", "/a.json"),
        ("default", "/data/p=1.json"),
    )
