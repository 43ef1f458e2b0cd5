"""The ``candidates:`` form of the parity stage without servers: the section's checks, the
candidate x n table, the no_worse_than rule on planted beams, the report's rendering, and the
H200 matrix that uses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.parity.candidates import (
    candidate_result,
    judge_rules,
    multi_result,
    parse_plan,
    rule_failures,
)
from harness.parity.compare import Beam, Case, compare_beams
from harness.parity.stage import compact, run_parity_stage
from harness.report.render_stages import parity_blocks

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "matrices" / "h200_parity_fp32.yaml"
SECTION = {
    "ns": [1, 4],
    "candidates": [
        {"name": "fr-bf16", "dtype": "bf16", "no_worse_than": "hf-bf16"},
        {"name": "fr-fp8", "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"},
        {"name": "hf-bf16", "kind": "reference", "dtype": "bfloat16"},
    ],
}


def test_plan_flags_precisions_and_gates():
    plan = parse_plan({**SECTION, "server_args": {"batch_slots": 512}})
    bf16, fp8, hf = plan.candidates
    assert plan.reference_dtype == "float32" and plan.reference_args == {"dtype": "float32"}
    assert bf16.precision == "bfloat16" and bf16.gate
    assert bf16.args == {"dtype": "bfloat16", "quantization": "none", "batch_slots": 512}
    assert fp8.precision == "fp8" and fp8.thresholds.min_top1 == 0.75
    assert fp8.args == {"dtype": "bfloat16", "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3",
                        "batch_slots": 512}  # fmt: skip
    # the HF yardstick: reference-server flags only (no FlashRec server_args), reported only
    assert hf.kind == "reference" and hf.args == {"dtype": "bfloat16"} and not hf.gate
    assert [(r.candidate, r.than, r.metrics) for r in plan.rules] == [
        ("fr-bf16", "hf-bf16", ("top1_agreement", "overlap_mean"))
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"candidates": []}, "'candidates' is empty"),
        ({"ns": None}, "'ns'"),
        ({"ns": []}, "'ns'"),
        ({"ns": [0, 4]}, "n must be >= 1"),
        ({"candidate_url": "http://127.0.0.1:9"}, "single-candidate form"),
        ({"candidates": [{"name": "a"}, {"name": "a"}]}, "unique"),
        ({"candidates": [{"dtype": "bfloat16"}]}, "needs a 'name'"),
        ({"candidates": [{"name": "a", "kind": "sglang"}]}, "kind 'sglang'"),
        ({"candidates": [{"name": "a", "dtyp": "bfloat16"}]}, "unknown keys ['dtyp']"),
        ({"candidates": [{"name": "a", "precision": "int4"}]}, "unknown precision"),
        (
            {"candidates": [{"name": "a", "kind": "reference", "quantization": "fp8"}]},
            "only a dtype",
        ),
        ({"candidates": [{"name": "a", "no_worse_than": "b"}]}, "name another candidate"),
        ({"candidates": [{"name": "a", "no_worse_than": "a"}]}, "name another candidate"),
        ({"reference_dtype": "fp8"}, "reference_dtype"),
    ],
)
def test_plan_errors_are_clear(change, message):
    with pytest.raises(ValueError, match="parity: ") as err:
        parse_plan({**SECTION, **change})
    assert message in str(err.value)


def test_stage_reports_a_bad_section_as_an_error_not_a_pass(tmp_path):
    """No server is launched: the section is refused first, and the single-candidate form
    refuses an empty ns too (it used to compare nothing and pass)."""
    for spec in ({**SECTION, "candidates": []}, {"ns": []}):
        res = run_parity_stage(spec, None, None, tmp_path, log=lambda *a: None)
        assert res["status"] == "error" and not res["passed"], res
        assert "empty" in res["error"]
        assert (tmp_path / "parity.json").is_file()


def _case(n: int, prompt: int, ref: list[Beam], cand: list[Beam]) -> Case:
    case = Case("chat", prompt, n, ref=ref, cand=cand)
    case.metrics = compare_beams(ref, cand)
    return case


def _beams(n: int, seed: int) -> list[Beam]:
    return [Beam((seed, 2, i), -0.1 * i - 0.01 * seed) for i in range(n)]


def _results(plan, worse: dict[int, list[int]]) -> list[dict]:
    """Each candidate answers the reference's beams exactly, except ``worse``: at those n the
    listed prompts come back with the best beam moved last and one beam swapped for a new one."""
    out = []
    for cand in plan.candidates:
        cases = []
        for n in plan.ns:
            for p in range(4):
                ref = _beams(n, p)
                got = list(ref)
                if cand.name == "fr-bf16" and p in worse.get(n, []) and n > 1:
                    got = got[1:] + got[:1]
                    got[-2] = Beam((99, p, n), got[-2].score)
                cases.append(_case(n, p, ref, got))
        out.append(candidate_result(cand, cases, plan.ns))
    return out


def test_no_worse_than_fails_a_planted_worse_candidate_by_how_much():
    plan = parse_plan(SECTION)
    res = multi_result(plan, _results(plan, {4: [0, 1]}), ["chat"], [])
    assert not res["passed"] and res["status"] == "fail"
    # one row per candidate x n
    assert [(r["candidate"], r["n"]) for r in res["table"]] == [
        (c, n) for c in ("fr-bf16", "fr-fp8", "hf-bf16") for n in (1, 4)
    ]
    row = next(r for r in res["table"] if (r["candidate"], r["n"]) == ("fr-bf16", 4))
    assert row["top1_agreement"] == 0.5 and row["overlap_mean"] == 0.875
    failed = [c for c in res["rules"] if not c["passed"]]
    assert {(c["n"], c["metric"]) for c in failed} == {(4, "top1_agreement"), (4, "overlap_mean")}
    top1 = next(c for c in failed if c["metric"] == "top1_agreement")
    assert top1["value"] == 0.5 and top1["other"] == 1.0 and top1["margin"] == -0.5
    assert (
        "fr-bf16 no_worse_than hf-bf16 n=4 top1_agreement: 0.5000 < 1.0000 (by 0.5000)"
        in (res["failures"])
    )
    # the same candidates without the planted fault pass every check, margins 0
    ok = multi_result(plan, _results(plan, {}), ["chat"], [])
    assert ok["passed"] and all(c["passed"] and c["margin"] == 0 for c in ok["rules"])
    assert len(ok["rules"]) == 4  # 2 ns x 2 metrics


def test_a_tolerance_forgives_only_what_it_says():
    section = {**SECTION, "candidates": [dict(c) for c in SECTION["candidates"]]}
    section["candidates"][0]["no_worse_than"] = {"than": "hf-bf16", "tolerance": 0.2,
                                                 "metrics": ["overlap_mean"]}  # fmt: skip
    plan = parse_plan(section)
    res = multi_result(plan, _results(plan, {4: [0, 1]}), ["chat"], [])
    (n4,) = [c for c in res["rules"] if c["n"] == 4]
    assert n4["margin"] == -0.125 and n4["passed"]  # overlap 0.875 vs 1.0 within 0.2
    # the per-precision threshold (bf16 top-1 >= 0.9) still catches it: 6 of 8 cases
    assert not res["passed"] and "fr-bf16: top-1 agreement 0.750 < 0.9" in res["failures"]


def test_a_candidate_with_nothing_compared_fails_and_so_does_its_rule():
    plan = parse_plan(SECTION)
    results = _results(plan, {})
    results[2] = candidate_result(plan.candidates[2], [], plan.ns)  # the yardstick answered none
    res = multi_result(plan, results, ["chat"], [])
    assert "hf-bf16: n=1: no case returned beams" in res["failures"]
    assert all(not c["passed"] and c["margin"] is None for c in res["rules"])
    # errors fail even a candidate that is not gated
    errs = [Case("chat", 0, n, error="HTTP 500") for n in plan.ns]
    hf = candidate_result(plan.candidates[2], errs, plan.ns)
    assert not hf["passed"] and "n=4: every case failed" in hf["failures"]
    # so do answers that compare nothing: a NaN score, no beams (the yardstick is not gated)
    nan = [Beam(b.key, float("nan")) for b in _beams(4, 0)]
    broken = [_case(1, 0, _beams(1, 0), []), _case(4, 0, _beams(4, 0), nan)]
    hf = candidate_result(plan.candidates[2], broken, plan.ns)
    assert not plan.candidates[2].gate and not hf["passed"], hf
    assert any("no beams to compare (1 reference, 0 candidate)" in f for f in hf["failures"])
    assert any("not a finite number" in f for f in hf["failures"])


def test_report_renders_one_row_per_candidate_and_n():
    plan = parse_plan(SECTION)
    res = compact(multi_result(plan, _results(plan, {4: [0]}), ["chat"], []))
    res["reference"] = {"dtype": "float32"}
    blocks = dict(parity_blocks(res))
    head, rows = blocks["against the float32 reference"]
    assert head[:5] == ["candidate", "precision", "n", "cases", "errors"]
    assert [r[:3] for r in rows] == [
        [c, p, n] for c, p in (("fr-bf16", "bfloat16"), ("fr-fp8", "fp8"),
                               ("hf-bf16", "bfloat16")) for n in ("1", "4")
    ]  # fmt: skip
    assert rows[1][head.index("top1_agreement")] == "0.75"
    head, rules = blocks["no_worse_than"]
    assert [r[-1] for r in rules] == ["pass", "pass", "FAIL", "FAIL"]
    head, verdicts = blocks["candidates"]
    assert [v[:4] for v in verdicts] == [
        ["fr-bf16", "flashrec", "fail", "yes"],
        ["fr-fp8", "flashrec", "pass", "yes"],
        ["hf-bf16", "reference", "pass", "no (reported)"],
    ]


def test_h200_matrix_loads_and_its_section_is_the_issue_s():
    import yaml

    from harness.spec.load import load_cells

    spec, cells = load_cells(str(H200))
    assert cells and spec.model.preset == "onerec-1.7b" and spec.model.sid_entropy
    section = yaml.safe_load(H200.read_text())["parity"]
    plan = parse_plan(section)
    assert plan.reference_dtype == "float32" and plan.ns == [1, 50, 256]
    assert 8 <= section["prompts"] <= 16
    kinds = {c.name: (c.kind, c.precision, c.gate) for c in plan.candidates}
    # the fixed thresholds are notes: what gates is the rule (and any case error)
    assert kinds == {
        "flashrec-bf16": ("flashrec", "bfloat16", False),
        "flashrec-fp8": ("flashrec", "fp8", False),
        "hf-bf16": ("reference", "bfloat16", False),
    }
    assert [(r.candidate, r.than, r.confidence) for r in plan.rules] == [
        ("flashrec-bf16", "hf-bf16", 0.95)
    ]
    assert plan.candidates[1].args["kv_cache_dtype"] == "fp8_e4m3"


def test_h200_matrix_dry_run(capsys):
    from harness.cli import main

    assert main([str(H200), "--dry-run"]) == 0
    assert "--device cuda" in capsys.readouterr().out


def test_no_worse_than_allows_the_paired_noise_band_and_no_more():
    """With the case rows, a deficit inside the noise of the paired per-prompt differences
    passes (marked within noise); one beyond it fails; confidence 0 is strict."""
    plan = parse_plan(SECTION)

    def rows(worse_prompts: list[int], prompts: int = 4) -> list[dict]:
        out = []
        for cand in ("fr-bf16", "hf-bf16"):
            for p in range(prompts):
                top1 = not (cand == "fr-bf16" and p in worse_prompts)
                out.append({"candidate": cand, "protocol": "chat", "prompt": p, "n": 4,
                            "top1": top1, "overlap": 1.0})  # fmt: skip
        return out

    def table(rs: list[dict]) -> list[dict]:
        t = []
        for cand in ("fr-bf16", "hf-bf16"):
            mine = [r for r in rs if r["candidate"] == cand]
            t.append({"candidate": cand, "n": 4, "overlap_mean": 1.0,
                      "top1_agreement": sum(r["top1"] for r in mine) / len(mine)})  # fmt: skip
        return t

    # one flipped top-1 in 12 prompts: margin -1/12, band 1.645 * (sd 0.289 / sqrt 12) = 0.137
    rs = rows([3], prompts=12)
    (top1,) = [c for c in judge_rules(plan.rules, table(rs), [4], rs)
               if c["metric"] == "top1_agreement"]  # fmt: skip
    assert top1["passed"] and top1["within_noise"] and top1["pairs"] == 12
    assert abs(top1["margin"] + 1 / 12) < 1e-12 and abs(top1["noise"] - 0.1374) < 1e-3
    # every prompt worse: no spread, no band -- it fails
    rs = rows(list(range(12)), prompts=12)
    (top1,) = [c for c in judge_rules(plan.rules, table(rs), [4], rs)
               if c["metric"] == "top1_agreement"]  # fmt: skip
    assert not top1["passed"] and top1["noise"] == 0.0
    # 3 of 4 prompts worse: margin -0.75 against a band of 1.645 x 0.5 / 2 = 0.41: fails, the message says so
    rs = rows([0, 1, 2])
    res = judge_rules(plan.rules, table(rs), [4], rs)
    bad = [c for c in res if not c["passed"]]
    assert [c["metric"] for c in bad] == ["top1_agreement"]
    assert "beyond the noise band 0.4112 of 4 prompts" in rule_failures(bad)[0]
    # confidence 0: the strict comparison of the means
    section = {**SECTION, "candidates": [dict(c) for c in SECTION["candidates"]]}
    section["candidates"][0]["no_worse_than"] = {"than": "hf-bf16", "confidence": 0}
    strict = parse_plan(section)
    rs = rows([3], prompts=12)
    checks = judge_rules(strict.rules, table(rs), [4], rs)
    assert not next(c for c in checks if c["metric"] == "top1_agreement")["passed"]
    with pytest.raises(ValueError, match="confidence"):
        section["candidates"][0]["no_worse_than"] = {"than": "hf-bf16", "confidence": 1.0}
        parse_plan(section)
    with pytest.raises(ValueError, match="higher is closer"):
        section["candidates"][0]["no_worse_than"] = {"than": "hf-bf16",
                                                     "metrics": ["max_score_diff"]}  # fmt: skip
        parse_plan(section)


def test_case_progress_speaks_every_interval_and_at_the_end():
    from harness.parity.fetch import CaseProgress

    now, lines = [0.0], []
    prog = CaseProgress("reference (float32)", 6, lines.append, every_s=10.0, clock=lambda: now[0])
    for t in [4.0, 8.0, 12.0, 14.0, 21.0, 24.0]:  # one case done at each time
        now[0] = t
        prog()
    # 12 s (3 done): the first line; 21 s: 10 s have not passed since; 24 s: the last case
    assert lines == [
        "parity: reference (float32): 3/6 cases, 4.0 s per case, ~12 s left",
        "parity: reference (float32): 6/6 cases, 4.0 s per case, ~0 s left",
    ]
