"""Shared fixtures: synthetic checkpoints built by our own code, cached per test session."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

# One intra-op thread per process, tests and the servers they start alike (they inherit the
# variable): the models are tiny, and two pytest-xdist workers with their servers' thread
# pools would oversubscribe a 2-core machine. A value already set is kept.
_ONE_THREAD = "OMP_NUM_THREADS" not in os.environ
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402 - after the thread count it reads at import

if _ONE_THREAD:
    torch.set_num_threads(1)  # in case a plugin imported torch first

PLANTS = Path(__file__).resolve().parent / "plants"


@pytest.fixture(scope="session", autouse=True)
def plants_on_pythonpath():
    """``tests/plants`` first on ``PYTHONPATH`` (every process the tests start inherits it:
    its ``sitecustomize`` installs the plants whose variables a test sets, see
    ``flashrec_plants``) and on ``sys.path`` (tests that plant in process)."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLANTS), old]))
    sys.path.insert(0, str(PLANTS))
    yield
    sys.path.remove(str(PLANTS))
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory):
    """``synth_model(preset="tiny", catalog_size=None, **overrides) -> Path`` (cached)."""
    from flashrec.synth import build_checkpoint

    cache: dict[str, Path] = {}

    def make(
        preset: str = "tiny",
        catalog_size: int | None = None,
        dtype: str = "float32",
        seed: int = 0,
        **overrides,
    ) -> Path:
        key = json.dumps([preset, catalog_size, dtype, seed, sorted(overrides.items())])
        if key not in cache:
            out = tmp_path_factory.mktemp(f"model-{preset}")
            cache[key] = Path(
                build_checkpoint(
                    out, preset, seed=seed, dtype=dtype, catalog_size=catalog_size, **overrides
                )
            )
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_model(synth_model) -> Path:
    """The tiny Qwen3 preset with a 2,000-SID catalog (``catalog.json`` inside the dir)."""
    return synth_model("tiny", catalog_size=2000)


@pytest.fixture
def bad_catalogs(tmp_path) -> dict[str, str]:
    """name -> path of catalog files no tiny-model server (3 levels of 64 codes) can serve:
    unparsable, empty, another depth, a code out of range, a negative code, and a missing one."""
    bad = {
        "bad json": "{not json",
        "empty": "{}",
        "wrong depth": '{"1,2": {}, "3,4": {}}',
        "out of range": '{"1,2,64": {}}',
        "negative": '{"1,-2,3": {}}',
    }
    out = {}
    for i, (name, text) in enumerate(bad.items()):
        p = tmp_path / f"bad{i}.json"
        p.write_text(text)
        out[name] = str(p)
    out["missing"] = str(tmp_path / "nowhere.json")
    return out


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
