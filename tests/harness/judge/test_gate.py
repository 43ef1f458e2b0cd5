"""harness.judge.runs and harness.judge.gates: compare verdicts (A/A within noise, 20%
slowdown regressed, separate runs judged against drift), gates, and references that match
nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bench_helpers import REPO, base_matrix, fake_engine, processes_with, run_cli, write_matrix

from harness.judge.gates import evaluate_gates, resolve_path
from harness.judge.runs import compare_reports
from harness.metrics.stats import summarize
from harness.spec.checks import GateSpec


def report(qps: list[float], lat: list[float], cell: str = "e,concurrency=1") -> dict:
    """A one-cell report; its matrix records a between-run band of 0 (the synthetic runs
    share one machine state), so compare judges by the rounds alone."""
    return {
        "matrix": {"stats": {"alpha": 0.05, "test": "welch", "between_run_band_pct": 0}},
        "cells": [
            {
                "id": cell,
                "params": {"engine": cell.split(",")[0], "concurrency": 1},
                "status": "ok",
                "metrics": {
                    "qps": summarize(qps),
                    "latency_p50_ms": summarize(lat),
                    "invalid_rate": summarize([0.0] * len(qps)),
                },
            }
        ],
        "parity": {"status": "ok", "top1_agreement": 0.97},
    }


def sample(rng, mean: float, rounds: int = 5, cv: float = 0.02) -> list[float]:
    return list(rng.normal(mean, mean * cv, rounds))


def test_aa_within_noise_and_20pct_slowdown_regressed():
    rng = np.random.default_rng(0)
    false_alarms = caught = 0
    trials = 100
    for _ in range(trials):
        base = report(sample(rng, 100), sample(rng, 10))
        aa = report(sample(rng, 100), sample(rng, 10))
        slow = report(sample(rng, 100 / 1.2), sample(rng, 12))
        false_alarms += compare_reports(base, aa)["verdict"] != "ok"
        res = compare_reports(base, slow)
        regressed = {r["metric"] for r in res["regressions"]}
        caught += regressed >= {"qps", "latency_p50_ms"}
    assert false_alarms <= 5, false_alarms
    assert caught >= 97, caught


def test_compare_verdict_details():
    base = report([100, 101, 99, 100, 100], [10, 10.1, 9.9, 10, 10])
    fast = report([120, 121, 119, 120, 120], [8, 8.1, 7.9, 8, 8])
    res = compare_reports(base, fast)
    m = res["cells"][0]["metrics"]
    assert m["qps"]["verdict"] == "improved" and m["latency_p50_ms"]["verdict"] == "improved"
    assert m["qps"]["delta_pct"] == 20.0 and m["qps"]["p_value"] < 0.001
    assert m["invalid_rate"]["verdict"] == "within_noise"
    few = report([100.0], [10.0])
    assert compare_reports(few, few)["cells"][0]["metrics"]["qps"]["verdict"] == "n/a"
    # cells are matched by id, or by parameters when the engine names differ (A/B)
    other = report([100, 101, 99, 100, 100], [10, 10.1, 9.9, 10, 10], cell="cand,concurrency=1")
    assert compare_reports(base, other)["cells"][0]["base_id"] == "e,concurrency=1"


def test_compare_of_nothing_is_no_data_and_a_lost_metric_is_shown(tmp_path):
    """Two runs with no cell compared (the new one failed, or the cells do not match) give
    verdict no_data and exit 3, never ok; a metric the new run lost (its quality eval failed)
    is n/a 'missing in the new run' and leaves a gate on it nothing to check."""
    base = report([100, 101, 99, 100, 100], [10, 10.1, 9.9, 10, 10])
    failed = json.loads(json.dumps(base))
    failed["cells"][0].update(status="failed", metrics={})
    other = report([100.0] * 5, [10.0] * 5, cell="e,concurrency=9")
    other["cells"][0]["params"]["concurrency"] = 9
    for new in (failed, other):
        assert compare_reports(base, new)["verdict"] == "no_data"
    for name, rep in (("base", base), ("new", failed)):  # no matrix: no gates to validate
        (tmp_path / f"{name}.json").write_text(
            json.dumps({k: v for k, v in rep.items() if k != "matrix"})
        )
    out = tmp_path / "cmp"
    code = run_cli("compare", str(tmp_path / "base.json"), str(tmp_path / "new.json"),
                   "--out", str(out))  # fmt: skip
    assert code == 3
    lost = json.loads(json.dumps(base))
    base["cells"][0]["metrics"]["hit@1"] = summarize([0.5, 0.5, 0.5])
    res = compare_reports(base, lost)
    hit = res["cells"][0]["metrics"]["hit@1"]
    assert hit["verdict"] == "n/a" and hit["reason"] == "missing in the new run"
    gate = GateSpec(name="hit", metric="hit@1", max_regression_pct=1)
    assert evaluate_gates([gate], lost, res).to_json()["status"] == "no_data"


def test_compare_lists_what_makes_two_runs_incomparable():
    base = report([100, 101, 99, 100, 100], [10, 10.1, 9.9, 10, 10])
    new = report([100, 101, 99, 100, 100], [10, 10.1, 9.9, 10, 10])
    for r, model, radix, tokens in ((base, "aaa", "cold", 2465), (new, "aaa", "cold", 2465)):
        r["model"] = {"hash": model}
        r["matrix"].update(load={"radix": radix, "rounds": 3}, workload={"median_tokens": tokens})
    assert compare_reports(base, new)["comparability"] == []
    new["matrix"]["load"]["rounds"] = 5  # rounds may differ
    assert compare_reports(base, new)["comparability"] == []
    base["model"]["catalog_hash"] = "c1"
    new["model"]["catalog_hash"] = "c1"
    assert compare_reports(base, new)["comparability"] == []
    new["model"]["hash"] = "bbb"
    new["model"]["catalog_hash"] = "c2"  # the same model on another catalog
    new["matrix"]["load"]["radix"] = "warm"
    new["matrix"]["workload"]["median_tokens"] = 1000
    diffs = compare_reports(base, new)["comparability"]
    assert {d["field"] for d in diffs} == {
        "model.hash", "model.catalog_hash", "load.radix", "workload.median_tokens"
    }  # fmt: skip
    assert {"field": "load.radix", "base": "cold", "new": "warm"} in diffs
    # an older report without those fields is not flagged
    assert compare_reports(report([1, 2], [1, 2]), new)["comparability"] == []


def test_compare_cli_require_comparable(tmp_path):
    from harness.cli.compare import main as compare_main

    a, b = tmp_path / "a", tmp_path / "b"
    for d, radix in ((a, "cold"), (b, "warm")):
        d.mkdir()
        r = report([100, 101, 99, 100, 100], [10, 10.1, 9.9, 10, 10])
        m = base_matrix(fake_engine(name="e"))
        m["load"]["radix"] = radix
        r["matrix"] = {**m, "stats": r["matrix"]["stats"]}  # a valid matrix: the CLI reads gates
        (d / "report.json").write_text(json.dumps(r))
    assert compare_main([str(a), str(b)]) == 0  # printed and written, not fatal
    assert "not comparable" in (b / "compare.md").read_text()
    assert compare_main([str(a), str(b), "--require-comparable"]) == 2
    assert compare_main([str(a), str(a), "--require-comparable", "--out", str(tmp_path)]) == 0


def test_path_gates_with_cells_read_inside_each_cell():
    """``path`` + ``cells``: the path inside each selected cell, e.g. its trace summary; a
    cell without it (not traced) is missing (skipped, or a failure when required)."""
    r = report([100, 101, 99], [10, 10, 10], cell="e,quantization=fp8")
    traced = {"files": [{"decode_graph_replay": True, "gemm": {"fp8_fraction": 0.99}}]}
    r["cells"][0]["trace"] = traced
    r["cells"][0]["params"]["quantization"] = "fp8"
    bf16 = report([100], [10], cell="e,quantization=bf16")["cells"][0]
    bf16["params"]["quantization"] = "bf16"
    r["cells"].append(bf16)  # not traced
    graph = GateSpec(path="trace.files.0.decode_graph_replay", op="==", value=1, cells="e")
    fp8 = GateSpec(
        path="trace.files.0.gemm.fp8_fraction", op=">=", value=0.95, cells="quantization=fp8"
    )
    res = evaluate_gates([graph, fp8], r).to_json()
    g, f = res["results"]
    assert g["status"] == "pass" and g["missing"] == [
        "e,quantization=bf16: trace.files.0.decode_graph_replay"
    ]
    assert f["status"] == "pass" and f["checks"][0]["value"] == 0.99
    traced["files"][0]["gemm"]["fp8_fraction"] = 0.5  # bf16 GEMMs in an fp8 cell
    traced["files"][0]["decode_graph_replay"] = False  # decode ran eagerly
    assert [x["status"] for x in evaluate_gates([graph, fp8], r).to_json()["results"]] == [
        "fail"
    ] * 2
    strict = GateSpec(
        path="trace.files.0.decode_graph_replay", op="==", value=1, cells="bf16", required=True
    )
    assert evaluate_gates([strict], r).to_json()["status"] == "fail"  # required, and never traced


def test_gates():
    base = report([100, 101, 99, 100, 100], [10, 10.1, 9.9, 10, 10])
    slow = report([80, 81, 79, 80, 80], [12, 12.1, 11.9, 12, 12])
    gates = [
        GateSpec(metric="invalid_rate", op="==", value=0),
        GateSpec(metric="qps", op=">=", value=90),
        GateSpec(path="parity.top1_agreement", op=">=", value=0.95),
        GateSpec(path="determinism.drifting", op="==", value=0),
        GateSpec(path="determinism.drifting", op="==", value=0, required=True, name="det"),
        GateSpec(metric="qps", max_regression_pct=3),
    ]
    res = evaluate_gates(gates, slow).to_json()
    assert [r["status"] for r in res["results"]] == [
        "pass",
        "fail",
        "pass",
        "no_data",  # the report has no determinism section: nothing to check, never a pass
        "fail",
        "skipped",  # needs a baseline
    ]
    assert res["status"] == "fail"
    comparison = compare_reports(base, slow)
    res = evaluate_gates(gates[-1:], slow, comparison).to_json()
    assert res["status"] == "fail" and res["results"][0]["checks"][0]["worse_pct"] > 19
    res = evaluate_gates(
        [GateSpec(metric="qps", max_regression_pct=25)], slow, comparison
    ).to_json()
    assert res["status"] == "pass"
    assert evaluate_gates([], slow).to_json()["status"] == "none"
    # keep only if it beats the baseline: a 25% gain passes a 2% bar, the A/A rerun and a
    # 25% loss do not, and a gain needs the band cleared (not just the median moved)
    better = GateSpec(metric="qps", min_improvement_pct=2)
    assert better.label == "qps improvement >= 2.0%"
    fast = report([125, 126, 124, 125, 125], [8, 8.1, 7.9, 8, 8])
    same = report([100, 101.5, 99, 100.5, 99.5], [10, 10.1, 9.9, 10, 10])
    res = evaluate_gates([better], fast, compare_reports(base, fast)).to_json()
    assert res["status"] == "pass" and res["results"][0]["checks"][0]["better_pct"] > 24
    assert evaluate_gates([better], same, compare_reports(base, same)).to_json()["status"] == "fail"
    assert evaluate_gates([better], slow, compare_reports(base, slow)).to_json()["status"] == "fail"
    too_high = GateSpec(metric="qps", min_improvement_pct=30)
    assert (
        evaluate_gates([too_high], fast, compare_reports(base, fast)).to_json()["status"] == "fail"
    )
    assert (
        evaluate_gates([better], fast).to_json()["results"][0]["status"] == "skipped"
    )  # no baseline
    with pytest.raises(ValueError, match="exactly one"):
        GateSpec(metric="qps", max_regression_pct=3, min_improvement_pct=2)
    with pytest.raises(ValueError, match="apply to a 'metric'"):
        GateSpec(path="parity.x", min_improvement_pct=2)
    assert resolve_path(slow, "cells.0.metrics.qps.n") == 5


def test_compare_cli_on_real_runs(tmp_path, marker):
    """Two real runs of one setup (A/A) are never called improved or regressed, however the
    load of the machine moved between them: a change their rounds support is inconclusive,
    and the p50 gate never fails. A 3x slower server (60 vs 20 ms per request: far beyond what
    a loaded 2-core machine does to a sleep) is inconclusive without a between-run band and
    regressed with one."""
    from harness.names import CELL_FIELDS, REPORT_SECTIONS

    def run(name: str, latency: str) -> str:
        m = base_matrix(
            fake_engine("--latency-ms", latency, "--marker", marker),
            load={"rounds": 6, "beam_width": 4},
            gates=[{"name": "p50-5pct", "metric": "latency_p50_ms", "max_regression_pct": 5}],
            # the band rule alone: a machine busy with other work (this suite beside a CI run)
            # would make every change here inconclusive (its own test below)
            stats={"busy_host_cores": 0},
        )
        m["workload"]["requests"] = 16
        out = tmp_path / name
        assert run_cli(str(write_matrix(tmp_path, m, f"{name}.yaml")), "--out", str(out)) == 0
        return str(out)

    base, aa, slow = run("base", "20"), run("aa", "20"), run("slow", "60")
    rep = json.loads((tmp_path / "base" / "report.json").read_text())
    assert set(rep) <= set(REPORT_SECTIONS) and list(rep["cells"][0]) == list(CELL_FIELDS)

    assert run_cli("compare", base, aa, "--fail-on-regression") == 0
    res = json.loads((tmp_path / "aa" / "compare.json").read_text())
    assert res["between_runs"]["interleaved"] is False
    assert not res["regressions"] and not res["improvements"]
    assert res["verdict"] in ("ok", "inconclusive") and res["gates"]["status"] != "fail"
    for r in res["cells"][0]["metrics"].values():
        assert r["verdict"] in ("within_noise", "inconclusive", "n/a"), r
        if r["verdict"] == "inconclusive":
            assert "not interleaved" in r["reason"] and "flashrec-bench gate" in r["reason"]

    assert run_cli("compare", base, slow, "--fail-on-regression") == 0  # nothing established
    res = json.loads((tmp_path / "slow" / "compare.json").read_text())
    p50 = res["cells"][0]["metrics"]["latency_p50_ms"]
    assert res["verdict"] == "inconclusive" and p50["verdict"] == "inconclusive", p50
    assert "no between-run band recorded" in p50["reason"]
    assert res["gates"]["status"] == "inconclusive"
    assert "inconclusive" in (tmp_path / "slow" / "compare.md").read_text()

    argv = ["compare", base, slow, "--fail-on-regression", "--between-run-band-pct", "10"]
    assert run_cli(*argv) == 1
    res = json.loads((tmp_path / "slow" / "compare.json").read_text())
    assert res["verdict"] == "regressed" and res["gates"]["status"] == "fail"
    p50 = res["cells"][0]["metrics"]["latency_p50_ms"]
    assert p50["verdict"] == "regressed" and p50["delta_pct"] > 50, p50
    assert res["cells"][0]["metrics"]["qps"]["delta_pct"] < 0
    assert "regressed" in (tmp_path / "slow" / "compare.md").read_text()
    assert processes_with(marker) == []


def _run_of(qps: list[float], commit: str, probe_ms: float, engine: str = "e") -> dict:
    """A report of a separate run: its commit, host probe and engine."""
    r = report(qps, [1000 / q for q in qps])
    r["matrix"] = {"stats": {"alpha": 0.05, "test": "welch"}, "engine": {"name": engine}}
    r["environment"] = {
        "git": {"commit": commit, "dirty": False, "tree": None},
        "host_probe": {"json_256_beams_ms": probe_ms},
    }
    return r


def test_cross_run_changes_are_judged_against_between_run_variation():
    """The issue's case: the same commit run again on a less loaded machine, QPS +106.7% with
    p(Holm) << 0.05 over its rounds. Separate runs cannot tell that from drift: inconclusive,
    saying why, and a regression gate on it is inconclusive too (neither pass nor fail)."""
    loaded = _run_of([100, 101, 99, 100, 102], "c0ffee" * 6, 2.0)
    idle = _run_of([206, 208, 205, 207, 206], "c0ffee" * 6, 1.2)
    res = compare_reports(loaded, idle)
    qps = res["cells"][0]["metrics"]["qps"]
    assert qps["verdict"] == "inconclusive" and qps["delta_pct"] > 100 and qps["p_value"] < 1e-6
    assert "the same code (c0ffeec) and setup" in qps["reason"]
    assert (
        "host probe differs by -40.0%" in qps["reason"] and "flashrec-bench gate" in qps["reason"]
    )
    assert res["verdict"] == "inconclusive" and not res["improvements"]
    gates = [
        GateSpec(metric="qps", max_regression_pct=2),
        GateSpec(metric="qps", min_improvement_pct=2),
    ]
    assert [g["status"] for g in evaluate_gates(gates, idle, res).to_json()["results"]] == [
        "inconclusive"
    ] * 2
    # a recorded band does not make an A/A pair a verdict
    assert compare_reports(loaded, idle, between_run_band_pct=5)["verdict"] == "inconclusive"

    # different code: without a recorded band, inconclusive; with one, a change beyond the
    # band plus the probe's difference stands, one inside them does not
    new = _run_of([206, 208, 205, 207, 206], "beef" * 10, 2.0)
    r = compare_reports(loaded, new)["cells"][0]["metrics"]["qps"]
    assert r["verdict"] == "inconclusive" and "no between-run band recorded" in r["reason"]
    r = compare_reports(loaded, new, between_run_band_pct=10)["cells"][0]["metrics"]["qps"]
    assert r["verdict"] == "improved" and r["between_run_pct"] == 10
    faster_host = _run_of([125, 126, 124, 125, 127], "beef" * 10, 1.4)  # probe -30%
    r = compare_reports(loaded, faster_host, between_run_band_pct=10)["cells"][0]["metrics"]
    assert (
        r["qps"]["verdict"] == "inconclusive"
        and "between-run band (10% + 30.0% probe)" in (r["qps"]["reason"])
    )
    # no change at all stays within noise, with or without a band
    same = _run_of([100, 100.5, 99.5, 101, 101.5], "c0ffee" * 6, 2.0)
    assert compare_reports(loaded, same)["verdict"] == "ok"


def test_a_cell_measured_on_a_busy_host_is_inconclusive_between_runs():
    """A change that would stand beyond the recorded band is inconclusive when either run's
    cell carries the busy-host note (other processes used the CPUs during its rounds); the
    cell without the note on either side keeps its verdict."""
    from harness.metrics.host import busy_host_note

    base = _run_of([100, 101, 99, 100, 102], "c0ffee" * 6, 2.0)
    new = _run_of([70, 71, 69, 70, 71], "beef" * 10, 2.0)
    quiet = compare_reports(base, new, between_run_band_pct=10)["cells"][0]["metrics"]["qps"]
    assert quiet["verdict"] == "regressed"
    note = busy_host_note(
        [{"host_other_cpu_cores": 1.5, "host_steal_cores": 0.0, "host_window_s": 3.0}]
    )
    for side in ("new", "base"):
        b, n = json.loads(json.dumps(base)), json.loads(json.dumps(new))
        ({"new": n, "base": b}[side])["cells"][0]["notes"] = ["other note", note]
        res = compare_reports(b, n, between_run_band_pct=10)
        cell = res["cells"][0]
        assert cell["busy_host"] == [side]
        qps = cell["metrics"]["qps"]
        assert qps["verdict"] == "inconclusive", qps
        assert f"a busy host on the {side} side" in qps["reason"]
        assert res["verdict"] == "inconclusive" and not res["regressions"]


def test_interleaved_comparisons_are_not_judged_for_drift():
    """The paired A/B comparison (flashrec-bench gate) keeps its verdicts: its pairs cancel
    drift, so nothing there is inconclusive."""
    from harness.judge.paired import compare_paired

    def paired(values):
        r = report(values, values)
        r["cells"][0]["round_metrics"] = [{"round": i, "qps": v} for i, v in enumerate(values)]
        return r

    values = [100.0, 120, 90, 110, 105, 95]
    a, b = paired(values), paired([v * 0.8 for v in values])
    res = compare_paired(a, b, metrics=["qps"])
    assert res["verdict"] == "regressed" and res["inconclusive"] == [] and "between_runs" not in res


# --------------------------------------------------------------------------- references


TYPOS = [  # (section entry, what the error names)
    ({"gates": [{"name": "inv", "metric": "invalid_rat", "op": "==", "value": 0}]},
     ["gates.0.metric", "gate 'inv'", "'invalid_rat' is not a metric", "'invalid_rate'"]),
    ({"gates": [{"name": "par", "path": "parity.pased", "op": "==", "value": 1}]},
     ["gates.0.path", "gate 'par'", "runs no parity stage"]),
    ({"gates": [{"name": "bw", "metric": "qps", "op": ">", "value": 0, "cells": "beam_widht=4"}]},
     ["gates.0.cells", "gate 'bw'", "'beam_widht' is not a cell parameter", "'beam_width'"]),
    ({"gates": [{"name": "c9", "metric": "qps", "op": ">", "value": 0, "cells": "concurrency=9"}]},
     ["gates.0.cells", "gate 'c9'", "selects no cell of the matrix"]),
    ({"gates": [{"name": "sum", "path": "summry.ok", "op": ">", "value": 0}]},
     ["gates.0.path", "'summry' is not a section of a report", "'summary'"]),
    ({"gates": [{"name": "tr", "path": "trace.files.0.x", "op": ">", "value": 0, "cells": "e"}]},
     ["gates.0.path", "gate 'tr'", "none of its cells is traced"]),
    ({"gates": [{"name": "mf", "path": "mfu.mfu", "op": ">=", "value": 0.3, "cells": "e"}]},
     ["gates.0.path", "gate 'mf'", "computes no MFU"]),
    ({"quality": {"dataset": "d.parquet", "cells": "beam_width=8"},
      "gates": [{"name": "q", "path": "quality.samples", "op": ">=", "value": 1,
                 "cells": "beam_width=4"}]},
     ["gates.0.path", "gate 'q'", "none of its cells is evaluated"]),
    ({"targets": [{"name": "t", "metric": "qsp", "op": ">=", "value": 1}]},
     ["targets.0.metric", "target 't'", "'qsp' is not a metric", "'qps'"]),
    ({"targets": [{"name": "t", "metric": "qps", "op": ">=", "value": 1, "cells": "beam_width=5"}]},
     ["targets.0.cells", "target 't'", "selects no cell"]),
    ({"targets": [{"name": "t", "metric": "baselin.hf.speedup", "op": ">=", "value": 1}]},
     ["targets.0.metric", "'baselin' is not a section of a report cell"]),
    ({"gates": [{"name": "h", "metric": "hit@5", "op": ">", "value": 0}]},  # quality.ks: 1, 10
     ["gates.0.metric", "'hit@5' is not a metric"]),
    # a section's own filter that selects nothing would trace / evaluate nothing
    ({"trace": {"cells": ["beam_width=8", "beam_width=5"]}},
     ["trace.cells.1", "trace: cells 'beam_width=5' selects no cell of the matrix"]),
    ({"quality": {"dataset": "d.parquet", "cells": "concurrency=9"}},
     ["quality.cells", "quality: cells 'concurrency=9' selects no cell of the matrix"]),
]  # fmt: skip


@pytest.mark.parametrize("section,expected", TYPOS)
def test_dry_run_refuses_references_that_match_nothing(tmp_path, capsys, section, expected):
    """A gate or target naming a metric, path section, stage or cells no cell has is a matrix
    error at load time (exit 2 from --dry-run), located by file:line and named."""
    engine = {"name": "e", "kind": "external", "url": "http://127.0.0.1:9"}
    m = base_matrix(engine, axes={"beam_width": [4, 8], "concurrency": [1, 2]}, **section)
    path = write_matrix(tmp_path, m)
    assert run_cli(str(path), "--dry-run") == 2
    err = capsys.readouterr().err
    field = expected[0]  # e.g. gates.0.metric, at the line of that key
    lines = path.read_text().splitlines()
    where = err.split(f"{path}:", 1)[1].split(":", 1)[0]
    last, line = field.split(".")[-1], lines[int(where) - 1]
    if last.isdigit():  # a list item: its own line
        assert line.strip().startswith("- ") and line.strip()[2:] in err, err
    else:
        assert line.strip(" -").startswith(last + ":"), err
    for text in expected:
        assert text in err, (text, err)


def test_references_that_match_something_load(tmp_path):
    """The same sections spelled right load (and so does every matrix under matrices/)."""
    from harness.spec.load import load_cells

    engine = {"name": "e", "kind": "external", "url": "http://127.0.0.1:9"}
    m = base_matrix(
        engine,
        axes={"beam_width": [4, 8]},
        trace={"cells": ["beam_width=8"]},
        gates=[
            {"metric": "invalid_rate", "op": "==", "value": 0},
            {"metric": "hit@10", "op": ">=", "value": 0},
            {"path": "summary.ok", "op": ">", "value": 0},
            {"path": "trace.files.0.decode_graph_replay", "op": "==", "value": 1, "cells": "e"},
            {"metric": "qps", "op": ">", "value": 0, "cells": "beam_width=4"},
        ],
        targets=[{"metric": "baseline.hf.speedup", "op": ">=", "value": 1, "cells": "8"}],
    )
    spec, cells = load_cells(str(write_matrix(tmp_path, m)))
    assert len(spec.gates) == 5 and len(cells) == 2
    for path in sorted((REPO / "matrices").rglob("*.yaml")):
        load_cells(str(path))


def test_run_time_missing_path_fails_the_gate():
    """What only a run can tell: a path absent where its section exists fails the gate (a
    typo under a configured stage, a traced cell without the value), and a gate with nothing
    measured (every cell failed) is ``no_data``, never a pass."""
    r = report([100, 101, 99], [10, 10, 10])
    r["parity"] = {"status": "ok", "passed": True}
    typo = GateSpec(name="typo", path="parity.pased", op="==", value=1)
    right = GateSpec(path="parity.passed", op="==", value=1)
    res = evaluate_gates([typo, right], r).to_json()
    assert [g["status"] for g in res["results"]] == ["fail", "pass"] and res["status"] == "fail"
    assert res["results"][0]["checks"] == [
        {"target": "parity.pased", "value": "absent", "ok": False}
    ]
    r["cells"][0]["trace"] = {"status": "ok", "files": [{}]}  # traced, but no such value
    res = evaluate_gates(
        [GateSpec(path="trace.files.0.x", op="==", value=1, cells="e")], r
    ).to_json()
    assert res["status"] == "fail"
    del r["cells"][0]["metrics"]["invalid_rate"]  # a cell that ran without the metric
    assert evaluate_gates([GateSpec(metric="invalid_rate", op="==", value=0)], r).to_json()[
        "status"
    ] == ("fail")
    r["cells"][0]["status"] = "failed"  # every cell failed: nothing was checked
    res = evaluate_gates([GateSpec(metric="qps", op=">", value=0), right], r).to_json()
    assert [g["status"] for g in res["results"]] == ["no_data", "pass"]
    assert res["status"] == "no_data" and "missing: e,concurrency=1" in res["results"][0]["reason"]


def test_run_with_a_missing_path_fails_and_all_failed_never_passes(tmp_path, marker, capsys):
    """Real runs on the fake server: a gate on a path the report lacks (``summary.okk``, known
    only after the run) exits 1 naming the gate; a run whose every cell fails says ``gates
    no_data`` (exit 3), not ``gates pass``."""
    gates = [
        {"name": "ok-cells", "path": "summary.okk", "op": ">", "value": 0},
        {"name": "no-errors", "metric": "error_rate", "op": "==", "value": 0},
    ]
    m = base_matrix(fake_engine("--marker", marker), gates=gates)
    out = tmp_path / "typo"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 1
    rep = json.loads((out / "report.json").read_text())
    assert rep["summary"]["ok"] == 1
    assert [g["status"] for g in rep["gates"]["results"]] == ["fail", "pass"]
    assert "ok-cells" in (out / "REPORT.md").read_text()
    m = base_matrix(fake_engine("--fail-start", "--marker", marker), gates=gates[1:])
    out = tmp_path / "dead"
    capsys.readouterr()
    assert run_cli(str(write_matrix(tmp_path, m, "dead.yaml")), "--out", str(out)) == 3
    assert "gates no_data" in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text())["gates"]["status"] == "no_data"
    assert processes_with(marker) == []


def test_compare_metrics_must_name_metrics_the_reports_have(tmp_path, capsys):
    from harness.cli.compare import main as compare_main

    d = tmp_path / "a"
    d.mkdir()
    r = report([100, 101, 99, 100, 100], [10, 10.1, 9.9, 10, 10])
    r["matrix"] = {**base_matrix(fake_engine(name="e")), "stats": r["matrix"]["stats"]}
    (d / "report.json").write_text(json.dumps(r))
    assert compare_main([str(d), str(d), "--metrics", "qps,latency_p50_ms"]) == 0
    assert compare_main([str(d), str(d), "--metrics", "qps,latncy_p50_ms"]) == 2
    assert "'latncy_p50_ms' is not a metric (did you mean 'latency_p50_ms'?)" in (
        capsys.readouterr().err
    )
    assert compare_main([str(d), str(d), "--metrics", "mfu"]) == 2  # a metric neither has
    assert "no cell of the two reports has it" in capsys.readouterr().err
    assert compare_main([str(d), str(d), "--metrics", ","]) == 2
