"""harness.determinism without servers: bitwise comparison, STEP_HASH parsing, localisation
verdicts and CLI value parsing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.cli.determinism import _pairs
from harness.determinism import (
    AFTER_STEPS,
    HOST_STATE,
    NUMERICS,
    Answer,
    StepHash,
    bits,
    compare_processes,
    drift,
    first_divergence,
    identical,
    make_workload,
    parse_answer,
    parse_step_hashes,
)

A = Answer("r", [((1, 2), (-1.0, -2.0)), ((1, 3), (-1.5, -3.0))])


def test_bitwise_equality_is_exact():
    assert identical(A, Answer("other-rid", list(A.beams)))
    near = Answer("r", [((1, 2), (-1.0, -2.0 + 2**-40)), ((1, 3), (-1.5, -3.0))])
    assert not identical(A, near)
    assert bits(0.0) != bits(-0.0)  # the sign bit counts
    assert not identical(A, Answer("r", [((1, 2), (-0.0, -2.0))] + A.beams[1:]))
    assert not identical(A, Answer(error="timeout"))
    d = drift(A, near)
    assert d["bits_only"] and d["rank_changes"] == 0 and 0 < d["max_score_diff"] < 1e-11


def test_drift_counts_rank_changes():
    swapped = Answer("r", [A.beams[1], A.beams[0]])
    d = drift(A, swapped)
    assert d["rank_changes"] == 2 and d["top1_changed"] and d["max_score_diff"] == 0.0
    d = drift(A, Answer("r", A.beams[:1]))
    assert d["rank_changes"] == 1 and d["beams"] == [2, 1]


def test_compare_processes_reports_worst_process():
    items = make_workload(2, ns=(2,), median_tokens=16)
    swapped = Answer("r", [A.beams[1], A.beams[0]])
    near = Answer("r", [((1, 2), (-1.0, -2.0001)), A.beams[1]])
    runs = [[A, A], [A, near], [A, swapped]]
    out = compare_processes(runs, items)
    assert out["drifting_requests"] == 1 and out["errors"] == 0
    (row,) = out["drifting"]
    assert row["index"] == 1 and row["process"] == 2 and row["rank_changes"] == 2
    assert out["top1_changes"] == 1 and out["requests_with_rank_changes"] == 1


def test_workload_is_distinct_with_varied_n():
    items = make_workload(12, ns=(1, 4, 16), median_tokens=24)
    assert len({str(i.messages) for i in items}) == 12
    assert [i.n for i in items[:4]] == [1, 4, 16, 1]
    assert all(i.text.endswith("<|sid_begin|>") for i in items)


def test_parse_answer_keeps_every_score():
    chat = {
        "id": "c1",
        "choices": [{"sglext": {"token_ids": [5], "sequence_score": -0.25, "cum_logprob": -1.0}}],
    }
    beam = {"meta_info": {"sequence_score": -0.25, "cum_logprob": -1.0}}
    gen = {"meta_info": {"id": "g1", "beam_results": [{"output_ids": [5], **beam}]}}
    old = {"meta_info": {"id": "g0", "beam_results": [{"token_ids": [5], **beam}]}}
    assert parse_answer("chat", chat).beams == parse_answer("generate", gen).beams
    assert parse_answer("generate", old).beams == parse_answer("generate", gen).beams
    assert parse_answer("chat", chat).rid == "c1" and parse_answer("generate", [gen]).rid == "g1"
    assert not parse_answer("chat", chat).error


def test_answers_with_nothing_to_compare_are_errors_not_identical():
    """Two empty answers, or beams without token ids, would compare bit for bit equal: each
    is an error of its request instead (counted as errors, never as agreement)."""
    empty_chat = parse_answer("chat", {"id": "c", "choices": []})
    empty_gen = parse_answer("generate", {"meta_info": {"id": "g", "beam_results": []}})
    no_ids = parse_answer("chat", {"choices": [{"sglext": {"sequence_score": -0.5}}]})
    for a, why in ((empty_chat, "no beams"), (empty_gen, "no beams"), (no_ids, "token ids")):
        assert why in a.error
        assert not identical(a, a)


def test_a_run_of_no_request_is_refused(tmp_path):
    from harness.determinism.check import run_determinism

    for kw in ({"requests": 0}, {"ns": ()}):
        with pytest.raises(ValueError, match="--requests >= 1"):
            run_determinism("/no/model", out_dir=tmp_path, **kw)


LOG = """\
2026-01-01 INFO flashrec: STEP_HASH rid=a step=0 phase=prefill inputs=i0 outputs=o0 kv=k0 cached=0
noise line
2026-01-01 INFO flashrec: STEP_HASH rid=b step=0 phase=prefill inputs=j0 outputs=p0 kv=k9 cached=7
2026-01-01 INFO flashrec: STEP_HASH rid=a step=1 phase=decode inputs=i1 outputs=o1 kv=k1 cached=0
2026-01-01 INFO flashrec: STEP_HASH rid=a step=2 phase=decode inputs=i2 outputs=o2
"""


def test_parse_step_hashes():
    h = parse_step_hashes(LOG)
    assert [s.step for s in h["a"]] == [0, 1, 2] and h["b"][0].cached == 7
    assert h["a"][2] == StepHash(2, "decode", "i2", "o2")


def _steps(*triples):
    return [
        StepHash(i, "prefill" if i == 0 else "decode", a, b) for i, (a, b) in enumerate(triples)
    ]


@pytest.mark.parametrize(
    ("other", "verdict", "step"),
    [
        (_steps(("i0", "o0"), ("X", "o1"), ("i2", "o2")), HOST_STATE, 1),
        (_steps(("i0", "o0"), ("i1", "o1"), ("i2", "Y")), NUMERICS, 2),
        (_steps(("i0", "Z"), ("X", "o1"), ("i2", "o2")), NUMERICS, 0),
        (_steps(("i0", "o0"), ("i1", "o1"), ("i2", "o2")), AFTER_STEPS, None),
        (_steps(("i0", "o0"), ("i1", "o1")), HOST_STATE, 2),
    ],
)
def test_first_divergence(other, verdict, step):
    base = _steps(("i0", "o0"), ("i1", "o1"), ("i2", "o2"))
    div = first_divergence(base, other)
    assert div["verdict"] == verdict and div.get("step") == step


def test_first_divergence_without_hashes():
    assert "no step hashes" in first_divergence([], _steps(("i", "o")))["verdict"]


def test_cli_pairs():
    assert _pairs(
        ["batch_slots=512", "--enable-prefix-cache=false", "dtype=float32"], "--server-arg", True
    ) == {"batch_slots": 512, "enable_prefix_cache": False, "dtype": "float32"}
    assert _pairs(["A=1"], "--server-env", False) == {"A": "1"}
    with pytest.raises(SystemExit):
        _pairs(["nope"], "--server-arg", True)


def test_matrix_stage_adapter(monkeypatch, tmp_path):
    import harness.determinism.stage as det
    from harness.spec.matrix import StageSpec
    from harness.spec.model import ResolvedModel

    seen = {}

    def fake(model_path, catalog, **kw):
        seen.update(model_path=model_path, catalog=catalog, **kw)
        rows = [{"index": i} for i in range(30)]
        return {
            "status": "pass",
            "passed": True,
            "sequential": {"drifting": rows},
            "localisation": {},
        }

    monkeypatch.setattr(det, "run_determinism", fake)
    section = StageSpec(requests=40, processes=3, mode="sequential", ns=[1, 4])
    ctx = SimpleNamespace(model=ResolvedModel("/m", "/m/c.json", "h", "path", 3), out_dir=tmp_path)
    out = det.run_stage(section, ctx)
    assert seen["model_path"] == "/m" and seen["catalog"] == "/m/c.json"
    assert seen["requests"] == 40 and seen["ns"] == (1, 4) and "enabled" not in seen
    assert seen["out_dir"] == tmp_path / "determinism"
    assert len(out["sequential"]["drifting"]) == 10 and out["details"].endswith("determinism.json")
    assert (
        det.run_stage(section, SimpleNamespace(model=None, out_dir=tmp_path))["status"] == "error"
    )


def test_verdict_concurrent_drift_fails_only_when_strict():
    from harness.determinism.check import verdict

    agree = {"drifting_requests": 0}
    res = {
        "sequential": {"errors": 0, "drifting_requests": 0},
        "concurrent": {"errors": 0, "drifting_requests": 3, "vs_sequential": agree},
    }
    modes = ["sequential", "concurrent"]
    assert verdict(res, modes) == "pass"
    assert verdict(res, modes, strict_concurrent=True) == "fail"
    # concurrent processes agree with each other but not with the sequential answers
    res["concurrent"] = {
        "errors": 0,
        "drifting_requests": 0,
        "vs_sequential": {"drifting_requests": 5},
    }
    assert verdict(res, modes) == "pass"
    assert verdict(res, modes, strict_concurrent=True) == "fail"
    res["concurrent"]["vs_sequential"] = agree
    assert verdict(res, modes, strict_concurrent=True) == "pass"
    res["sequential"]["drifting_requests"] = 1
    assert verdict(res, modes) == "fail"
    res["concurrent"]["errors"] = 2
    assert verdict(res, modes, strict_concurrent=True) == "error"
    # strict without a concurrent run has nothing to judge: never a pass
    seq_only = {"sequential": {"errors": 0, "drifting_requests": 0}}
    assert verdict(seq_only, ["sequential"], True) == "error"
    assert verdict(seq_only, ["sequential"]) == "pass"


def test_strict_concurrent_needs_both_modes(tmp_path):
    from harness.cli.determinism import main
    from harness.determinism.check import run_determinism

    with pytest.raises(ValueError, match="--mode both"):
        run_determinism(str(tmp_path), mode="sequential", strict_concurrent=True, out_dir=tmp_path)
    rc = main(["--model-path", str(tmp_path), "--strict-concurrent", "--mode", "sequential"])
    assert rc == 2


def test_cli_flag_strict_concurrent():
    from harness.cli.determinism import build_parser

    args = build_parser().parse_args(["--model-path", "m", "--strict-concurrent"])
    assert args.strict_concurrent is True
    assert build_parser().parse_args(["--model-path", "m"]).strict_concurrent is False
