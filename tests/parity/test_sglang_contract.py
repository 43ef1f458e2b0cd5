"""Our side of SGLang's beam protocol checked by SGLang's own code, where ``sglang`` imports
(it is not a dependency: ``pip install sglang==0.5.23`` in an environment of its own, then run
this file there with the repository on ``PYTHONPATH``).

- the /generate bodies the harness sends pass upstream's contract gate
  (``sglang.api.v1.api_types.GenerateRequest``) and ``SamplingParams`` normalize / verify;
- the fake's list of admitted sampling keys is upstream's;
- an answer built by upstream's beam output code parses to the same beams as FlashRec's
  answer for the same beams, with the same keys and finish reasons.
"""

from __future__ import annotations

import pytest

api = pytest.importorskip(
    "sglang.api.v1.api_types", reason="sglang is not installed (optional contract check)"
)
sampling = pytest.importorskip("sglang.srt.sampling.sampling_params")
output = pytest.importorskip("sglang.srt.beam_search.output")
io_struct = pytest.importorskip("sglang.srt.managers.io_struct")
schedule_batch = pytest.importorskip("sglang.srt.managers.schedule_batch")
types = pytest.importorskip("sglang.srt.beam_search.types")
msgspec = pytest.importorskip("msgspec")

from fake_sglang import SAMPLING_KEYS  # noqa: E402

from flashrec.engine.request import BeamResult, GenResult  # noqa: E402
from flashrec.server import responses  # noqa: E402
from harness.load.client import Request, generate_body  # noqa: E402
from harness.load.workload import Prompt  # noqa: E402
from harness.parity import body_for, parse_beams  # noqa: E402

MSGS = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(("n", "seed"), [(1, None), (4, 7), (50, None)])
def test_harness_bodies_pass_sglangs_checks(n: int, seed: int | None) -> None:
    req = Request(Prompt(0, MSGS), n, 4, 0.0, text="x<|sid_begin|>", seed=seed)
    for body in (generate_body(req), body_for("generate", req)[1]):
        api.GenerateRequest.from_json_value(body)  # upstream's 400 gate
        sp = sampling.SamplingParams(**body["sampling_params"])
        sp.normalize(None)
        sp.verify(1000)
        assert sp.beam_width == n and sp.n == n and sp.max_new_tokens == 4
        assert sp.sampling_seed == seed
    with pytest.raises(api.JsonContractError, match="unknown field `seed`"):
        api.GenerateRequest.from_json_value({"text": "x", "sampling_params": {"seed": 1}})


def test_fake_admits_exactly_upstreams_sampling_keys() -> None:
    assert set(SAMPLING_KEYS) == set(api.SamplingParams.__struct_fields__)


def _upstream_answer(beams: list[BeamResult], meta: dict) -> dict:
    """The /generate answer upstream's beam output code builds for ``beams``."""
    stop, length = schedule_batch.FINISH_MATCHED_TOKEN, schedule_batch.FINISH_LENGTH
    seqs = [
        types.BeamSearchSequence(
            tokens=list(b.token_ids),
            cum_logprob=b.cum_logprob,
            beam_score=b.sequence_score,
            text=b.text,
            finish_reason=(
                stop(matched=b.token_ids[-1])
                if b.finish_reason == "stop"
                else length(len(b.token_ids))
            ).to_json(),
        )
        for b in beams
    ]
    required = [f.name for f in msgspec.structs.fields(io_struct.BatchStrOutput) if f.required]
    recv = io_struct.BatchStrOutput(
        **{name: None for name in required},
        beam_search_output=[io_struct.BeamSearchOutput(sequences=seqs)],
    )
    recv.finished_reasons = [seqs[0].finish_reason]
    out = output.try_build_beam_search_out_dict(recv, 0, dict(meta))
    assert out is not None
    return output.build_beam_search_out(out)


def test_upstream_answer_parses_as_ours() -> None:
    beams = [
        BeamResult([11, 12, 99], -1.5, -0.5, "stop", "<s_a_1><s_b_2><|sid_end|>"),
        BeamResult([11, 13], -2.0, -1.0, "length", "<s_a_1><s_b_3>"),
    ]
    result = GenResult("rid", beams, 7, 3)
    meta = {"id": "rid", "prompt_tokens": 7, "completion_tokens": 3, "cached_tokens": 3}
    upstream = _upstream_answer(beams, meta)
    ours = responses.generate_result(result, 0.1)
    assert parse_beams("generate", upstream) == parse_beams("generate", ours)
    assert [b.key for b in parse_beams("generate", upstream)] == [(11, 12, 99), (11, 13)]
    assert set(upstream) == set(ours) == {"text", "output_ids", "meta_info"}
    assert upstream["output_ids"] == ours["output_ids"] and upstream["text"] == ours["text"]
    assert upstream["meta_info"]["completion_tokens"] == ours["meta_info"]["completion_tokens"]
    for up, our in zip(upstream["meta_info"]["beam_results"], ours["meta_info"]["beam_results"]):
        assert set(up) == set(our)
        assert set(up["meta_info"]) <= set(our["meta_info"])  # ours adds cum_logprob
        for key in ("finish_reason", "sequence_score"):
            assert up["meta_info"][key] == our["meta_info"][key]
