"""A gate over nothing is not a pass: a metric the run could not check (invalid SIDs without a
catalog, duplicates of one-beam answers, hit@K without ground truth, MFU without a FLOP model,
ratios without an HF baseline, the quality eval's invalid rate without a catalog) is left out
of the cell's metrics (``-`` in the tables), its reason is in the cell's ``unchecked``, and a
gate on it is ``no_data`` with that reason (``fail`` when required), never ``pass``."""

from __future__ import annotations

import json

import pytest
import yaml
from bench_helpers import base_matrix, fake_catalog, fake_engine, run_cli, write_matrix

from harness.judge.gates import evaluate_gates
from harness.judge.targets import evaluate_targets
from harness.load.client import Record
from harness.metrics.rounds import round_metrics
from harness.quality.dataset import Sample
from harness.quality.evaluate import Answer, EvalOptions, score
from harness.report.build import cell_entry
from harness.report.render import cells_table
from harness.report.render_quality import quality_eval_table
from harness.run.cell import CellResult
from harness.spec.checks import GateSpec, TargetSpec
from harness.spec.matrix import parse_spec

SID = "<s_a_1><s_b_2><s_c_3>"


def rec(i: int, beams: int = 4, checked: bool = True, rnd: int = 0, **kw) -> Record:
    """A measured ok request of round ``rnd``, as the load client fills it."""
    t0 = rnd * 10 + i * 0.1
    return Record("c", rnd, "measure", i, i, t0, t0 + 0.05, beams=beams, sids_checked=checked, **kw)


def records(n: int = 4, rounds: int = 3, **kw) -> list[Record]:
    return [rec(i, rnd=r, **kw) for r in range(rounds) for i in range(n)]


def cell(recs: list[Record], cid: str = "e,beam_width=4", **kw) -> dict:
    """The report entry the real report builder makes of a cell with these records."""
    spec, _ = parse_spec(yaml.safe_dump(base_matrix(fake_engine())))
    res = CellResult(cid, {"engine": "e"}, records=recs, rounds_done=3, **kw)
    return cell_entry(res, spec).to_json()  # the cell as report.json holds it


def gate(metric: str, op: str = "==", value: float = 0, **kw) -> GateSpec:
    return GateSpec(metric=metric, op=op, value=value, **kw)


def test_round_metrics_measure_only_what_could_be_checked():
    """invalid_rate needs every answer checked against a catalog; duplicate_rate an answer of
    more than one beam."""
    unchecked = round_metrics([rec(i, checked=False, invalid=1) for i in range(4)])
    assert "invalid_rate" not in unchecked and unchecked["beams_mean"] == 4
    assert round_metrics([rec(i, invalid=1) for i in range(4)])["invalid_rate"] == 0.25
    one = round_metrics([rec(i, beams=1) for i in range(4)])
    assert "duplicate_rate" not in one and one["beams_mean"] == 1
    assert round_metrics([rec(i, duplicates=1) for i in range(4)])["duplicate_rate"] == 0.25


def test_invalid_sids_without_a_catalog_are_no_data_not_a_pass():
    c = cell(records(checked=False))
    assert "invalid_rate" not in c["metrics"] and "no catalog" in c["unchecked"]["invalid_rate"]
    report = {"cells": [c]}
    res = evaluate_gates([gate("invalid_rate")], report).to_json()
    assert res["status"] == "no_data"
    (g,) = res["results"]
    assert g["status"] == "no_data" and "no catalog: invalid SIDs not checked" in g["reason"]
    assert g["checks"] == [] and g["unchecked"][0]["target"] == "e,beam_width=4"
    # required: unchecked fails, and says why
    res = evaluate_gates([gate("invalid_rate", required=True)], report).to_json()
    assert res["status"] == "fail" and "no catalog" in res["results"][0]["reason"]
    # a path gate on the same metric, per cell or through the report
    for spec in (
        GateSpec(path="metrics.invalid_rate.median", op="==", value=0, cells="e"),
        GateSpec(path="cells.0.metrics.invalid_rate.median", op="==", value=0),
    ):
        assert evaluate_gates([spec], report).to_json()["results"][0]["status"] == "no_data"
    # the table shows "-", not 0.0%
    head, rows = cells_table(report)
    assert rows[0][head.index("invalid SIDs")] == "-"
    # with a catalog the same records are measured and pass
    checked = {"cells": [cell(records())]}
    assert checked["cells"][0]["metrics"]["invalid_rate"]["median"] == 0
    assert evaluate_gates([gate("invalid_rate")], checked).to_json()["status"] == "pass"
    head, rows = cells_table(checked)
    assert rows[0][head.index("invalid SIDs")] == "0.0%"
    # beams that are no SID at all are still seen without a catalog: a note, not a rate
    bad = cell(records(checked=False, invalid=1))
    assert "invalid_rate" not in bad["metrics"]
    assert any("12 of 48 beams are no SID at all" in n for n in bad["notes"]), bad["notes"]


def test_one_checked_cell_does_not_pass_a_gate_for_an_unchecked_one():
    report = {"cells": [cell(records(), "e,a"), cell(records(checked=False), "e,b")]}
    res = evaluate_gates([gate("invalid_rate")], report).to_json()["results"][0]
    assert res["status"] == "no_data" and [c["target"] for c in res["checks"]] == ["e,a"]
    bad = {"cells": [cell(records(invalid=1)), cell(records(checked=False), "e,b")]}
    assert (
        evaluate_gates([gate("invalid_rate")], bad).to_json()["status"] == "fail"
    )  # a failure wins


def test_the_audit_each_unmeasurable_metric_is_no_data_with_its_reason():
    """Duplicates of one-beam answers, hit@K of a workload without ground truth, MFU without
    a FLOP model, the HF ratios without a baseline, the steady rate of a non-closed load."""
    plain = cell(records())
    one_beam = cell(records(beams=1))
    cases = [
        (one_beam, "duplicate_rate", "one beam per answer"),
        (plain, "hit@10", "no ground truth"),
        (plain, "ndcg@1", "no ground truth"),
        (plain, "mfu", "no FLOP model: the matrix has no mfu: section"),
        (cell(records(), mfu={"error": "no config.json to count parameters from"}),
         "achieved_tflops", "no FLOP model: no config.json"),
        (plain, "speedup_vs_hf", "no HF baseline"),
        (cell(records(), baseline={"hf": {"status": "skipped", "hf_skipped": "KV 9 GiB > 1"}}),
         "hf_latency_ratio", "HF baseline skipped: KV 9 GiB > 1"),
        (plain, "qps_steady", "not a closed load"),
        (plain, "gpu_busy_implied", "no traced GPU work per request"),
        (plain, "quality_invalid_rate", "no quality eval"),
        (plain, "server_radix_hit_rate", "no prefix-cache counters"),
        (plain, "server_prefill_tokens_per_request", "no prefix-cache counters"),
        (plain, "pass@10", "no quality eval"),
    ]  # fmt: skip
    for c, metric, why in cases:
        assert metric not in c["metrics"], metric
        res = evaluate_gates([gate(metric, ">=", 0)], {"cells": [c]}).to_json()["results"][0]
        assert res["status"] == "no_data" and why in res["reason"], (metric, res)
    # measured where they can be: more beams, ground truth
    assert (
        evaluate_gates([gate("duplicate_rate")], {"cells": [plain]}).to_json()["status"] == "pass"
    )
    truth = cell(records(quality={"hit@10": 1.0, "ndcg@1": 0.5}))
    res = evaluate_gates(
        [gate("hit@10", ">=", 1), gate("ndcg@1", ">", 0)], {"cells": [truth]}
    ).to_json()
    assert res["status"] == "pass"
    # absent for no reason the run knows (every request failed): still a failure
    failed = [Record("c", r, "measure", 0, 0, r, r + 1, status="error") for r in range(3)]
    res = evaluate_gates([gate("latency_p50_ms", "<", 1e9)], {"cells": [cell(failed)]}).to_json()
    assert res["status"] == "fail" and res["results"][0]["checks"][0]["value"] == "no value"


def test_targets_on_an_unchecked_metric_say_why():
    report = {"cells": [cell(records(checked=False))]}
    t = TargetSpec(metric="invalid_rate", op="<=", value=0)
    (r,) = evaluate_targets([t], report).to_json()["results"]
    assert r["status"] == "no_data" and "no catalog" in r["missing_why"]["e,beam_width=4"]


def _eval(catalog, beams: int = 4) -> dict:
    """A real scoring of 3 answers (as the quality stage does), with or without a catalog."""
    samples = [Sample("t", i, [{"role": "user", "content": "x"}], ((1, 2, 3),)) for i in range(3)]
    answers = [Answer(s, [SID] * beams) for s in samples]
    out = score(answers, EvalOptions(beam_width=beams, ks=(1,)), catalog, keep_values=True)
    return {**out, "status": "ok"}


@pytest.mark.parametrize("beams", [1, 4])
def test_quality_eval_rates_without_a_catalog_or_with_one_beam(beams):
    c = cell(records(), quality=_eval(None, beams))
    assert "quality_invalid_rate" not in c["metrics"] and "pass@1" in c["metrics"]
    res = evaluate_gates([gate("quality_invalid_rate")], {"cells": [c]}).to_json()["results"][0]
    assert res["status"] == "no_data" and "no catalog" in res["reason"]
    assert quality_eval_table({"cells": [c]})[1][0][6] == "-"  # the invalid column
    dup = evaluate_gates([gate("quality_duplicate_rate")], {"cells": [c]}).to_json()["results"][0]
    assert dup["status"] == ("no_data" if beams == 1 else "fail")  # 4 copies of one SID
    checked = cell(records(), quality=_eval({(1, 2, 3)}, beams))
    assert checked["metrics"]["quality_invalid_rate"]["median"] == 0
    assert evaluate_gates([gate("quality_invalid_rate")], {"cells": [checked]}).to_json()[
        "status"
    ] == ("pass")


def test_run_on_a_server_without_a_catalog_never_passes_what_it_did_not_check(tmp_path, marker):
    """End to end on the fake server: no catalog, n=1. REPORT.md shows '-' for invalid SIDs and
    the gates on invalid SIDs, duplicates, hit@10 and MFU are no_data with their reasons (they
    were pass, pass, fail, fail). The same run with a catalog measures and passes them."""
    gates = [
        {"name": "valid", "metric": "invalid_rate", "op": "==", "value": 0},
        {"name": "no-dups", "metric": "duplicate_rate", "op": "==", "value": 0},
        {"name": "hits", "metric": "hit@10", "op": ">=", "value": 0},
        {"name": "mfu", "metric": "mfu", "op": ">=", "value": 0},
        {"name": "no-errors", "metric": "error_rate", "op": "==", "value": 0},
    ]
    m = base_matrix(fake_engine("--marker", marker), load={"rounds": 2, "beam_width": 1},
                    gates=gates)  # fmt: skip
    out = tmp_path / "none"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0
    rep = json.loads((out / "report.json").read_text())
    (c,) = rep["cells"]
    assert c["status"] == "ok" and "invalid_rate" not in c["metrics"]
    status = {g["name"]: (g["status"], g.get("reason", "")) for g in rep["gates"]["results"]}
    assert status["no-errors"] == ("pass", "")
    for name, why in (("valid", "no catalog"), ("no-dups", "one beam"),
                      ("hits", "no ground truth"), ("mfu", "no FLOP model")):  # fmt: skip
        assert status[name][0] == "no_data" and why in status[name][1], (name, status[name])
    assert rep["gates"]["status"] == "no_data"
    md = (out / "REPORT.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith(f"| {c['id']} |"))
    assert "| - |" in row and "0.0%" not in row.split("|")[9]  # the invalid SIDs column
    assert "| valid | no_data | no catalog: invalid SIDs not checked" in md
    # with a catalog (the fake answers from it): measured, and the gate passes
    catalog = fake_catalog(tmp_path)
    m = base_matrix(fake_engine("--sid-vocab-file", str(catalog), "--marker", marker),
                    load={"rounds": 2, "beam_width": 4}, catalog={"path": str(catalog)},
                    gates=gates[:2])  # fmt: skip
    out = tmp_path / "with"
    assert run_cli(str(write_matrix(tmp_path, m, "with.yaml")), "--out", str(out)) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["cells"][0]["metrics"]["invalid_rate"]["median"] == 0
    assert rep["gates"]["status"] == "pass"
