"""harness.report.engines: side-by-side verdicts against the noise band and an A/A control, and
the matrix's refusal of a control that does not repeat the first engine."""

from __future__ import annotations

import pytest

from harness.metrics.stats import summarize
from harness.report.engines import engine_comparison
from harness.report.model import Cell, Metric
from harness.spec.matrix import SpecError, parse_spec

BASE_QPS = [100.0, 101.0, 99.5, 100.5, 100.2, 99.8]  # CV ~0.5%: a noise band of ~1%


def _cell(engine: str, qps: list[float]) -> Cell:
    p50 = [1000.0 / q for q in qps]  # latency falls as QPS rises (closed loop, c=1)
    rounds = [{"round": i, "qps": q, "latency_p50_ms": ms, "latency_p99_ms": 1.2 * ms}
              for i, (q, ms) in enumerate(zip(qps, p50))]  # fmt: skip
    metrics = {
        "qps": Metric.from_json(summarize(qps)),
        "latency_p50_ms": Metric.from_json(summarize(p50)),
        "latency_p99_ms": Metric.from_json(summarize([1.2 * x for x in p50])),
    }
    return Cell(id=f"{engine},beam_width=256", engine=engine, params={"beam_width": 256},
                rounds=len(qps), round_metrics=rounds, metrics=metrics)  # fmt: skip


def _scaled(factors: list[float]) -> list[float]:
    return [q * f for q, f in zip(BASE_QPS, factors)]


def _ratios(cells: list[Cell], controls=()) -> dict:
    sec = engine_comparison(cells, [str(c.engine) for c in cells], True, controls=controls)
    assert sec is not None and sec["controls"] == sorted(controls)
    (row,) = sec["rows"]
    return row["ratios"]


B_2PCT = [1.021, 1.019, 1.020, 1.022, 1.018, 1.020]  # a steady 2% change, paired by round


def test_a_steady_change_without_a_control_is_ahead_and_says_the_spread_is_unmeasured():
    r = _ratios([_cell("base", BASE_QPS), _cell("b", _scaled(B_2PCT))])["b"]
    assert r["qps"]["ci_low"] > 1
    assert r["qps"]["verdict"] == "b ahead (no A/A control)"
    assert r["qps"]["band_from"] == "noise band" and 0 < r["qps"]["band"] < 0.02
    # lower latency is better: the same engine ahead on p50
    assert r["latency_p50_ms"]["ci_high"] < 1
    assert r["latency_p50_ms"]["verdict"] == "b ahead (no A/A control)"


def test_the_same_change_inside_the_a_a_spread_is_level():
    aa = [1.030, 1.028, 1.033, 1.029, 1.031, 1.030]  # two servers of one setting 3% apart
    cells = [_cell("base", BASE_QPS), _cell("b", _scaled(B_2PCT)), _cell("aa", _scaled(aa))]
    r = _ratios(cells, controls=["aa"])
    assert r["aa"]["qps"]["verdict"].startswith("A/A control (reach ±3.")
    assert "band" not in r["aa"]["qps"]
    q = r["b"]["qps"]
    assert q["ci_low"] > 1 and q["band_from"] == "A/A spread" and q["band"] > 0.03
    assert q["verdict"].startswith("level within the A/A spread (±3.")


def test_a_change_beyond_the_a_a_spread_is_ahead_with_no_caveat():
    aa = [0.995, 1.004, 1.000, 0.998, 1.003, 1.001]
    slower = [0.90, 0.91, 0.895, 0.905, 0.90, 0.902]
    cells = [_cell("base", BASE_QPS), _cell("aa", _scaled(aa)), _cell("c", _scaled(slower))]
    r = _ratios(cells, controls=["aa"])
    assert r["aa"]["qps"]["verdict"].startswith("A/A control")
    assert r["c"]["qps"]["verdict"] == "base ahead"
    assert r["c"]["latency_p50_ms"]["verdict"] == "base ahead"


def test_a_paired_change_inside_noisy_rounds_is_level_within_the_noise_band():
    noisy = [100.0, 90.0, 110.0, 95.0, 105.0, 100.0]  # CV ~7%: a noise band of ~14%
    base = _cell("base", noisy)
    b = _cell("b", [q * 1.05 for q in noisy])  # the pairing makes the interval tight at 1.05
    r = _ratios([base, b])["b"]["qps"]
    assert r["ci_low"] > 1
    assert r["band_from"] == "noise band" and r["band"] > 0.1
    assert r["verdict"].startswith("level within the noise band (±")


def test_an_interval_holding_one_is_level():
    mixed = [1.02, 0.98, 1.01, 0.99, 1.0, 1.0]
    r = _ratios([_cell("base", BASE_QPS), _cell("b", _scaled(mixed))])["b"]["qps"]
    assert r["ci_low"] <= 1 <= r["ci_high"]
    assert r["verdict"] == "level (interval holds 1)"


def test_a_failed_control_leaves_the_verdict_uncontrolled():
    failed = Cell(id="aa,beam_width=256", engine="aa", params={"beam_width": 256},
                  status="failed", error="server died")  # fmt: skip
    cells = [_cell("base", BASE_QPS), _cell("b", _scaled(B_2PCT)), failed]
    r = _ratios(cells, controls=["aa"])
    assert "aa" not in r
    assert r["b"]["qps"]["verdict"] == "b ahead (no A/A control)"


def test_matrix_takes_a_control_that_repeats_the_first_engine():
    text = (
        "name: t\nengines:\n"
        "  - {name: a, kind: command, command: [srv], env: {X: '1'}}\n"
        "  - {name: x, kind: command, command: [srv, --other]}\n"
        "  - {name: aa, kind: command, command: [srv], env: {X: '1'}, control: true,"
        " startup_timeout_s: 900}\n"
        "axes: {beam_width: [4]}\nload: {rounds: 3}\n"
    )
    spec, _ = parse_spec(text)
    assert [e.control for e in spec.engine_list] == [False, False, True]


@pytest.mark.parametrize(
    ("engines", "words"),
    [
        (["{name: a, kind: command, command: [srv], control: true}",
          "{name: b, kind: command, command: [srv]}"], "'control: true' belongs on a later"),
        (["{name: a, kind: command, command: [srv], env: {X: '1'}}",
          "{name: aa, kind: command, command: [srv], control: true}"], "sets env of its own"),
        (["{name: a, kind: command, command: [srv]}",
          "{name: aa, kind: command, command: [srv, --fast], control: true}"], "sets command"),
    ],
)  # fmt: skip
def test_matrix_refuses_a_control_that_is_not_a_repeat(engines, words):
    text = "name: t\nengines:\n" + "".join(f"  - {e}\n" for e in engines)
    text += "axes: {beam_width: [4]}\nload: {rounds: 3}\n"
    with pytest.raises(SpecError, match=words):
        parse_spec(text, "m.yaml")
