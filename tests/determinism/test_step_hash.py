"""The scheduler's STEP_HASH lines (FLASHREC_DEBUG_STEP_HASH) and the planted id()-keyed cache
(FLASHREC_TEST_PLANT_ID_CACHE, tests/plants/flashrec_plants.py), in process on the tiny model;
the plants installed by their sitecustomize in a fresh process."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine
from flashrec.synth import synth_prompts
from harness.determinism import HOST_STATE, first_divergence, parse_step_hashes

PROMPTS = synth_prompts(5, median_tokens=60, seed=3, system_prompt_tokens=24)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.text.append(record.getMessage())


@pytest.fixture
def step_log():
    handler = Lines()
    logger = logging.getLogger("flashrec")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old)


def engine(model, debug: bool = True) -> Engine:
    e = Engine(
        EngineConfig(
            model_path=str(model), sid_vocab_file=str(model / "catalog.json"), batch_slots=256
        )
    )
    e.scheduler.debug_hash = debug
    return e


def run(e: Engine, jobs: list[tuple[int, int]], tag: str):
    reqs = [
        e.new_request(e.build_prompt(messages=PROMPTS[p]), n=n, rid=f"{tag}-{p}") for p, n in jobs
    ]
    return e.generate(reqs)


def beams(res):
    return [(b.token_ids, b.sequence_score, b.cum_logprob) for b in res.beams]


def test_one_line_per_request_and_forward(tiny_model, step_log):
    e = engine(tiny_model)
    run(e, [(0, 4), (1, 8)], "a")
    h = parse_step_hashes("\n".join(step_log.text))
    for rid in ("a-0", "a-1"):
        assert [(s.step, s.phase) for s in h[rid]] == [(0, "prefill"), (1, "decode"), (2, "decode")]
        assert all(len(s.inputs) == len(s.outputs) == 16 and s.kv for s in h[rid])
    assert h["a-0"][0].inputs != h["a-1"][0].inputs


def test_hashing_changes_no_result(tiny_model):
    jobs = [(0, 4), (1, 16), (2, 1)]
    on = run(engine(tiny_model, True), jobs, "x")
    off = run(engine(tiny_model, False), jobs, "x")
    assert [beams(r) for r in on] == [beams(r) for r in off]


def test_inputs_hash_ignores_allocation_but_not_content(tiny_model, step_log):
    """Alone vs behind other requests (other slots, other rows, a radix hit): same inputs
    hashes, different raw KV indices."""
    run(engine(tiny_model), [(0, 8)], "solo")
    e = engine(tiny_model)
    run(e, [(3, 4), (4, 16)], "before")
    run(e, [(0, 8)], "later")
    h = parse_step_hashes("\n".join(step_log.text))
    solo, later = h["solo-0"], h["later-0"]
    assert later[0].cached > 0 and solo[0].cached == 0
    assert [s.inputs for s in solo] == [s.inputs for s in later]
    assert [s.kv for s in solo] != [s.kv for s in later]


def test_planted_id_cache_is_localised_to_decode_inputs(tiny_model, step_log, monkeypatch):
    """Force the address reuse the planted bug waits for: every state gets the same key, so
    the second request decodes against the first one's prompt slots."""
    import flashrec_plants

    from flashrec.engine.scheduler.prefill import PrefillManager

    with monkeypatch.context() as m:
        run_ = flashrec_plants.id_cached_run(PrefillManager.run, key=lambda st: 0)
        m.setattr(PrefillManager, "run", run_)
        e = engine(tiny_model)
        run(e, [(1, 4)], "p")
        bad = run(e, [(2, 4)], "p")[0]
    good = run(engine(tiny_model), [(2, 4)], "q")[0]
    assert beams(bad) != beams(good)
    h = parse_step_hashes("\n".join(step_log.text))
    div = first_divergence(h["q-2"], h["p-2"])
    assert div["verdict"] == HOST_STATE and (div["step"], div["phase"]) == (1, "decode")
    prefill_q, prefill_p = h["q-2"][0], h["p-2"][0]
    assert (prefill_q.inputs, prefill_q.outputs) == (prefill_p.inputs, prefill_p.outputs)


PROBE = """
import sys
import flashrec.engine.loop as loop
import flashrec.engine.scheduler as sched
from flashrec.engine.scheduler.prefill import PrefillManager
print(
    "flashrec_plants" in sys.modules,
    getattr(PrefillManager.run, "planted", False),
    getattr(loop.EngineLoop.__init__, "planted", False),
    getattr(sched.Scheduler.step, "planted", False),
)
"""


@pytest.mark.parametrize(
    "env, want",
    [
        ({}, "False False False False"),
        ({"FLASHREC_TEST_PLANT_ID_CACHE": "1"}, "True True False False"),
        ({"FLASHREC_TEST_STEP_DELAY_MS": "0"}, "True False False False"),
        ({"FLASHREC_TEST_STEP_DELAY_MS": "25"}, "True False True False"),
        ({"FLASHREC_CALIB_SPIN_US": "10"}, "True False False True"),
    ],
)
def test_plants_install_from_the_environment_only(env, want):
    """A process started by the tests (PYTHONPATH from tests/conftest.py) gets exactly the
    plants its environment asks for, patched in as the engine modules load."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FLASHREC_TEST_", "FLASHREC_CALIB"))
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == want
