"""Servers for ``pytest -m parity``: external URLs from the environment, or launched ones.

- ``SGLANG_BEAM_URL`` (+ ``FLASHREC_URL``): compare those servers; without ``FLASHREC_URL`` a
  FlashRec server is launched on ``MODEL_PATH``.
- otherwise an HF reference server and a FlashRec server are launched on ``MODEL_PATH``
  (+ ``SID_VOCAB_FILE``), or on the synthetic tiny float32 model with a 2,000-SID catalog.

Knobs: ``PARITY_NS`` (default ``1,4,16,64``), ``PARITY_PROMPTS`` (8), ``PARITY_PRECISION``
(float32 | bfloat16 | fp8: thresholds and launched servers' dtype flags),
``PARITY_MAX_SCORE_DIFF`` (override), ``PARITY_DEVICE``, ``PARITY_SERVER_ARGS`` /
``PARITY_REFERENCE_ARGS`` (``key=value,...`` flags), ``SGLANG_BEAM_PROTOCOL``.
Launched servers listen on 127.0.0.1 ephemeral ports and are always stopped.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import pytest

from harness.parity import (
    ParityPrompt,
    default_max_tokens,
    detect_protocols,
    make_prompts,
    no_shared_protocol,
    precision_args,
    serving,
)


@dataclass(frozen=True)
class ParityTarget:
    """Two servers to compare and what to send them."""

    reference: str
    candidate: str
    protocols: list[str]
    prompts: list[ParityPrompt]
    ns: list[int]
    precision: str
    overrides: dict
    launched_reference: bool
    max_tokens: int
    why: dict  # protocol -> why it was left out (detection)


def _ns() -> list[int]:
    return [int(x) for x in os.environ.get("PARITY_NS", "1,4,16,64").split(",") if x.strip()]


def _flags(var: str) -> dict:
    """``PARITY_SERVER_ARGS="batch_slots=512,logprob_scope=sid"`` -> flag dict."""
    pairs = (x.split("=", 1) for x in os.environ.get(var, "").split(",") if "=" in x)
    return {k.strip(): v.strip() for k, v in pairs}


async def _probe(ref: str, cand: str) -> tuple[list[str], int, dict]:
    why: dict[str, str] = {}
    async with aiohttp.ClientSession() as session:
        a = await detect_protocols(session, ref, why)
        b = await detect_protocols(session, cand, why)
        max_tokens = await default_max_tokens(session, cand, ref)
    return [p for p in a if p in b], max_tokens, why


@pytest.fixture(scope="session")
def parity_target(synth_model, tmp_path_factory) -> Iterator[ParityTarget]:
    ref_url = os.environ.get("SGLANG_BEAM_URL") or None
    cand_url = os.environ.get("FLASHREC_URL") or None
    model_path = os.environ.get("MODEL_PATH") or None
    catalog = os.environ.get("SID_VOCAB_FILE") or None
    if model_path is None and ref_url is None:
        path = synth_model("tiny", catalog_size=2000)
        model_path, catalog = str(path), str(path / "catalog.json")
    if cand_url is None and model_path is None:
        pytest.skip("SGLANG_BEAM_URL is set: also set FLASHREC_URL or MODEL_PATH")
    overrides = {}
    if os.environ.get("PARITY_MAX_SCORE_DIFF"):
        overrides["max_score_diff"] = float(os.environ["PARITY_MAX_SCORE_DIFF"])
    device = os.environ.get("PARITY_DEVICE") or None
    precision = os.environ.get("PARITY_PRECISION", "float32")
    cand_args, ref_args = precision_args(precision)
    cand_args.update(_flags("PARITY_SERVER_ARGS"))
    ref_args.update(_flags("PARITY_REFERENCE_ARGS"))
    logs = tmp_path_factory.mktemp("parity-servers")
    with serving(model_path, catalog, logs, ref_url, cand_url, device, cand_args, ref_args) as urls:
        protocols, max_tokens, why = asyncio.run(_probe(urls["reference"], urls["candidate"]))
        if not protocols:
            pytest.fail(no_shared_protocol(why), pytrace=False)
        yield ParityTarget(
            urls["reference"],
            urls["candidate"],
            protocols,
            make_prompts(int(os.environ.get("PARITY_PROMPTS", "8")), model_path=model_path),
            _ns(),
            precision,
            overrides,
            ref_url is None,
            max_tokens,
            why,
        )
