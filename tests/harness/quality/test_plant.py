"""The generated dataset's plant against real servers: the HF reference over SGLang-shaped
``/generate`` must score exactly what was planted; FlashRec (float32, chat) within a few
samples of it. Servers on 127.0.0.1, always stopped."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from harness.quality.dataset import load_dataset
from harness.quality.evaluate import EvalOptions, ask, score
from harness.quality.pids import load_pid_map
from harness.quality.serve import launched

pytest.importorskip("pyarrow")
SAMPLES, FRACTION, EXTRA = 24, 0.5, 1


@pytest.fixture(scope="module")
def confident_model(synth_model):
    """The tiny preset made confident (``sid_entropy``: fewer near-ties to flip a top-1)."""
    return synth_model("tiny", catalog_size=2000, sid_entropy=1.0)


def _eval(url, ds, protocol, tokenizer=None):
    from harness.load.sids import load_catalog_sids
    from harness.load.workload import PromptRenderer, load_tokenizer

    files = load_dataset(ds)
    samples = [s for f in files for s in f.samples]
    opts = EvalOptions(32, 3, (1, 32), protocol, 4, 120.0)
    renderer = PromptRenderer(load_tokenizer(tokenizer)) if tokenizer else None

    async def go():
        async with aiohttp.ClientSession() as session:
            return await ask(session, url, samples, opts, renderer)

    pid_map = load_pid_map(ds / "sid2pid.json")
    return score(asyncio.run(go()), opts, load_catalog_sids(ds / "sid2pid.json"), pid_map, files)


def test_recall_matches_the_plant(confident_model, tmp_path):
    from harness.quality.generate import generate_dataset

    model, catalog = str(confident_model), str(confident_model / "catalog.json")
    ds = tmp_path / "ds"
    with launched(
        "reference", model, catalog, tmp_path / "ref.log", args={"dtype": "float32"}
    ) as ref:
        plant = generate_dataset(
            ds, model, catalog, SAMPLES, FRACTION, EXTRA, seed=3, reference_url=ref.base_url
        )
        assert json.loads((ds / "plant.json").read_text()) == plant
        (gen,) = load_dataset(ds)  # laid out like the benchmark, never taken for it
        assert gen.task == "video" and not gen.official and "generated" in gen.official_why
        got = _eval(ref.base_url, ds, "generate", tokenizer=model)
    f = plant["fraction"]
    assert f == FRACTION and plant["expected"]["recall"] == f / 2
    block = got["tasks"]["video"]
    m = {k: v["value"] for k, v in block["metrics"].items()}
    # the reference itself over /generate: exactly the plant, by SID and by PID
    for p in ("", "pid_"):
        assert m[f"{p}pass@1"] == m[f"{p}pass@32"] == m[f"{p}position1_pass@1"] == f
        assert m[f"{p}recall@32"] == m[f"{p}recall@1"] == f / 2
    assert block["invalid_rate"]["count"] == 0 and block["invalid_rate"]["n"] == 32 * SAMPLES
    assert block["samples"] == SAMPLES and block["failed_requests"] == 0

    with launched("flashrec", model, catalog, tmp_path / "fr.log", args={"dtype": "float32"}) as fr:
        got = _eval(fr.base_url, ds, "chat")
    m = {k: v["value"] for k, v in got["overall"]["metrics"].items()}
    tol = 2 / SAMPLES  # a near-tie may flip a top-1 or two between two exact float32 decodes
    assert abs(m["recall@32"] - f / 2) <= tol / 2
    assert abs(m["position1_pass@1"] - f) <= tol and abs(m["pass@32"] - f) <= tol
    assert abs(m["pid_recall@32"] - m["recall@32"]) <= tol / 2
    assert got["overall"]["invalid_rate"]["count"] == 0
