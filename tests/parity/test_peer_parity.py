"""``pytest -m parity`` against a peer: any beam server speaking the chat protocol at
``PEER_BEAM_URL`` (e.g. the public flashrec 0.1.2), held against ours at temperature 0.

Ours is ``FLASHREC_URL``, else FlashRec launched on ``MODEL_PATH`` (+ ``SID_VOCAB_FILE``) or on
the synthetic tiny model, at ``PARITY_PRECISION`` (default float32). Per n (``PARITY_NS``,
default 1,50,256): top-1 equal, mean overlap@n and max |score diff| on the beams both return,
beams keyed by their SID codes (a peer may return no token ids and wrap the text in
``<|sid_begin|>``). ``PEER_MAX_TOKENS`` is the peer's ``max_tokens`` (flashrec 0.1.2 counts SID
codes: the catalog's depth; default: ours, depth + 1). The table is printed and, with
``PEER_PARITY_OUT``, written as JSON. Disagreement is reported, not failed (a peer is another
engine, e.g. FP8 where ours is float32); a request either side could not answer fails.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import aiohttp
import pytest

from harness.parity import default_max_tokens, fetch_beams, make_prompts, precision_args
from harness.parity.candidates import against_rows
from harness.parity.compare import Case, compare_beams
from harness.parity.fetch import request_for
from harness.parity.servers import one_server

pytestmark = pytest.mark.parity


async def _cases(ours: str, peer: str, prompts, ns: list[int], peer_tokens: int | None):
    async with aiohttp.ClientSession() as session:
        ours_tokens = await default_max_tokens(session, ours)
        cases = []
        for p in prompts:
            for n in ns:
                case = Case("chat", p.index, n)
                try:
                    case.ref, case.cand = await asyncio.gather(
                        fetch_beams(session, ours, "chat",
                                    request_for(p.messages, p.text, n, ours_tokens, p.index)),
                        fetch_beams(session, peer, "chat",
                                    request_for(p.messages, p.text, n, peer_tokens or ours_tokens,
                                                p.index)),
                    )  # fmt: skip
                    case.metrics = compare_beams(case.ref, case.cand)
                except Exception as exc:  # noqa: BLE001 - reported as the case's error
                    case.error = f"{type(exc).__name__}: {exc}"[:300]
                cases.append(case)
        return cases


def test_peer_against_ours(synth_model, tmp_path_factory):
    peer = os.environ.get("PEER_BEAM_URL")
    if not peer:
        pytest.skip("PEER_BEAM_URL is not set (a peer beam server speaking the chat protocol)")
    ns = [int(x) for x in os.environ.get("PARITY_NS", "1,50,256").split(",") if x.strip()]
    model_path, catalog = os.environ.get("MODEL_PATH"), os.environ.get("SID_VOCAB_FILE")
    if not os.environ.get("FLASHREC_URL") and not model_path:
        path = synth_model("tiny", catalog_size=2000)
        model_path, catalog = str(path), str(path / "catalog.json")
    args = precision_args(os.environ.get("PARITY_PRECISION", "float32"))[0]
    if ns and max(ns) > 256:
        args["batch_slots"] = max(ns)
    log = tmp_path_factory.mktemp("peer-parity") / "ours.log"
    peer_tokens = int(os.environ["PEER_MAX_TOKENS"]) if os.environ.get("PEER_MAX_TOKENS") else None
    with one_server("candidate", args, model_path, catalog, log,
                    os.environ.get("PARITY_DEVICE"), os.environ.get("FLASHREC_URL")) as (ours, _):  # fmt: skip
        prompts = make_prompts(int(os.environ.get("PARITY_PROMPTS", "8")), model_path=model_path)
        cases = asyncio.run(_cases(ours, peer, prompts, ns, peer_tokens))
    rows = against_rows("peer", "flashrec", cases, ns)
    print(f"\npeer {peer} against ours {ours}:")
    for r in rows:
        print(f"  n={r['n']}: top-1 equal {r['top1_agreement']}, mean overlap@n "
              f"{r['overlap_mean']}, max |score diff| {r['max_score_diff']} "
              f"({r['cases']} cases, {r['errors']} errors)")  # fmt: skip
    if os.environ.get("PEER_PARITY_OUT"):
        out = {"peer": peer, "ours": ours, "rows": rows, "cases": [c.row() for c in cases]}
        Path(os.environ["PEER_PARITY_OUT"]).write_text(json.dumps(out, indent=1))
    errors = [f"prompt {c.prompt} n={c.n}: {c.error}" for c in cases if c.error]
    assert not errors, "\n".join(errors)
    assert all(r["cases"] == len(prompts) for r in rows), rows
    assert all(c.metrics["ref_beams"] and c.metrics["cand_beams"] for c in cases)
