"""One catalog, one meaning: the ``sid2pid.json`` that ``flashrec-bench eval-dataset`` writes
(keys packed base 8192, RecIF's) read by every reader of the project for a tiny model whose
codebooks hold 64 codes: ``flashrec catalog``, ``flashrec serve --sid-vocab-file``, ``POST
/update_catalog`` on a started server (in process and with the engine in a process of its
own), ``flashrec-bench eval`` (which launches a server on it) and the harness's SID checks.
Each must read the model's own SIDs, a key below 64^3 included (90121 is (0,11,9) in base
8192, (22,0,9) if misread in base 64); a file packed in another base reads right with that
base given, and without it its codes beyond the codebook are inexpressible SIDs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from server_helpers import ServerThread, server_config

from flashrec.cli import main as flashrec_main
from flashrec.engine.engine import Engine
from flashrec.engine.loop import EngineLoop
from flashrec.sid.catalog import load_catalog
from flashrec.sid.version import catalog_hash
from flashrec.synth import write_catalog_json

pytest.importorskip("pyarrow")
K, RECIF = 64, 8192  # the tiny preset's codes per level; RecIF's packing base


def digits(key: int, base: int = RECIF, depth: int = 3) -> tuple[int, ...]:
    """``key``'s base-``base`` digits, most significant first (what a right reading gives)."""
    out = []
    for _ in range(depth):
        key, code = divmod(key, base)
        out.append(code)
    assert key == 0
    return tuple(reversed(out))


@pytest.fixture(scope="module")
def dataset(tiny_model: Path, tmp_path_factory) -> Path:
    """``flashrec-bench eval-dataset`` over the tiny model and its 2,000-SID catalog."""
    from harness.cli.eval_dataset import main as eval_dataset

    out = tmp_path_factory.mktemp("packed") / "ds"
    argv = [str(out), "--model-path", str(tiny_model), "--samples", "4", "--beams", "8"]
    assert eval_dataset(argv) == 0
    return out


@pytest.fixture(scope="module")
def truth(tiny_model: Path, dataset: Path) -> dict:
    """The model's SIDs, and per packed key of sid2pid.json its SID read in base 8192."""
    model_catalog = json.loads((tiny_model / "catalog.json").read_text())
    sids = {tuple(map(int, k.split(","))) for k in model_catalog}
    mapping = json.loads((dataset / "sid2pid.json").read_text())
    by_key = {int(k): digits(int(k)) for k in mapping}
    assert all("," not in k for k in mapping) and set(by_key.values()) == sids
    low = [k for k in by_key if k < K**3]  # keys a base-64 reading takes for other SIDs
    assert low and any(digits(k, K) != by_key[k] for k in low)
    codes = np.array(sorted(sids), dtype=np.int64)
    return {"sids": sids, "by_key": by_key, "mapping": mapping, "hash": catalog_hash(codes)}


def test_catalog_command_reads_the_files_base(tiny_model, dataset, truth, tmp_path, capsys):
    """``flashrec catalog PATH --model-path`` (positional, as --from) converts the file with
    every SID expressible; each key's items land on its base-8192 SID."""
    src = dataset / "sid2pid.json"
    for how in (["--from", str(src)], [str(src)]):
        out = tmp_path / "catalog.json"
        rc = flashrec_main(["catalog", *how, "--model-path", str(tiny_model), "--out", str(out)])
        captured = capsys.readouterr()
        assert rc == 0, captured.err
        assert "packed keys base 8192" in captured.out and "inexpressible  none" in captured.out
        written = {tuple(map(int, k.split(","))): v for k, v in json.loads(out.read_text()).items()}
        assert set(written) == truth["sids"]
        for key, items in truth["mapping"].items():
            assert written[truth["by_key"][int(key)]] == [v["pid"] for v in items], key


def test_harness_readers_decode_as_the_catalog(dataset, truth):
    """The eval's PID map, its invalid-rate catalog and the SID checker read the same SIDs."""
    from harness.load.sids import SidChecker, load_catalog_sids
    from harness.quality.pids import load_pid_map

    src = dataset / "sid2pid.json"
    assert load_catalog_sids(src) == truth["sids"] == set(load_pid_map(src))
    assert {tuple(r) for r in load_catalog(src).codes.tolist()} == truth["sids"]
    checker = SidChecker(3, load_catalog_sids(src))
    key = min(truth["by_key"])  # the smallest key: below 64^3
    text = "".join(f"<s_{'abc'[i]}_{c}>" for i, c in enumerate(truth["by_key"][key]))
    assert checker.check([text]).invalid == 0


def _server(ckpt: Path, catalog: str, engine_process: bool) -> ServerThread:
    if engine_process:
        from flashrec.server.engine_process import start_engine_process

        config = server_config(str(ckpt), sid_vocab_file=catalog, engine_process="on")
        remote = start_engine_process(config)
        return ServerThread(remote, config, process=remote.proc)
    config = server_config(str(ckpt), sid_vocab_file=catalog)
    engine = Engine(config)
    return ServerThread(EngineLoop(engine), config)


@pytest.fixture(params=["in-process", "engine-process"])
def server(request, tiny_model, dataset) -> Iterator[ServerThread]:
    """A started server whose --sid-vocab-file is the eval-dataset's sid2pid.json."""
    with _server(tiny_model, str(dataset / "sid2pid.json"), request.param == "engine-process") as s:
        yield s


def test_serve_and_update_catalog_read_the_files_base(server, dataset, truth, tmp_path):
    """``--sid-vocab-file sid2pid.json`` serves the model's SIDs; a reload of a subset then of
    the file again swaps them back; the same SIDs packed base 64 reload with ``packed_base``
    and are refused without it, as inexpressible SIDs."""
    cat = server.get("/get_server_info").json()["engine"]["catalog"]
    assert (cat["hash"], cat["sids"], cat["depth"]) == (truth["hash"], len(truth["sids"]), 3)
    half = np.array(sorted(truth["sids"])[::2], dtype=np.int64)
    subset = write_catalog_json(half, tmp_path / "half.json")
    r = server.post("/update_catalog", {"path": str(subset)})
    assert r.status_code == 200 and r.json()["catalog_hash"] == catalog_hash(half), r.text
    r = server.post("/update_catalog", {"path": str(dataset / "sid2pid.json")})
    assert r.status_code == 200, r.text
    assert (r.json()["catalog_hash"], r.json()["sids"]) == (truth["hash"], len(truth["sids"]))

    p64 = tmp_path / "sid2pid_base64.json"  # the same SIDs packed base 64
    p64.write_text(json.dumps({str((a * K + b) * K + c): [] for a, b, c in truth["sids"]}))
    r = server.post("/update_catalog", {"path": str(subset)})
    assert r.status_code == 200, r.text
    r = server.post("/update_catalog", {"path": str(p64), "packed_base": 64})
    assert r.status_code == 200 and r.json()["catalog_hash"] == truth["hash"], r.text
    r = server.post("/update_catalog", {"path": str(p64)})  # read base 8192: codes beyond 64
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert "SIDs cannot be expressed by the SID layout" in msg and "decoded base 8192" in msg
    assert "at or beyond the codebook size 64" in msg
    for bad in (1, "64", True, 2.0):
        r = server.post("/update_catalog", {"path": str(p64), "packed_base": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "packed_base", bad
    assert server.get("/get_server_info").json()["engine"]["catalog"]["hash"] == truth["hash"]


def test_serve_packed_base_flag(tiny_model, truth, tmp_path):
    """``flashrec serve --packed-base 64`` reads a file packed base 64 as its SIDs."""
    p64 = tmp_path / "sid2pid_base64.json"
    p64.write_text(json.dumps({str((a * K + b) * K + c): [] for a, b, c in truth["sids"]}))
    config = server_config(str(tiny_model), sid_vocab_file=str(p64), packed_base=64)
    engine = Engine(config)
    assert engine.catalog_version.hash == truth["hash"]
    with pytest.raises(ValueError, match="cannot be expressed by the SID layout"):
        Engine(server_config(str(tiny_model), sid_vocab_file=str(p64)))


def test_eval_launches_a_server_on_the_mapping(tiny_model, dataset, tmp_path):
    """``flashrec-bench eval DS --model-path M``: the launched server serves the dataset's
    sid2pid.json as its catalog; every beam is valid in it and the PID metrics are on."""
    from harness.cli.eval import main as eval_main

    out = tmp_path / "eval.json"
    argv = [str(dataset), "--model-path", str(tiny_model), "--beams", "8", "--limit", "2",
            "--device", "cpu", "--out", str(out)]  # fmt: skip
    assert eval_main(argv) == 0
    result = json.loads(out.read_text())
    assert result["catalog_checked"] and result["pid_mode"]
    rate = result["overall"]["invalid_rate"]
    assert rate["n"] == 2 * 8 and rate["count"] == 0
