"""harness.run.sides / harness.cli.gate / harness.judge.paired: the A/B performance gate (issue 7).

Paired statistics against scipy and simulated A/A and slowed runs; the baseline ref, the pin
file and the temporary worktree; whole gate runs against a throw-away git repository whose
"server" is the fake server with a committed latency (A/A passes, a slowed working tree
fails, a missing or unusable baseline is skipped only when allowed); and one run on the real
FlashRec server with the planted per-step delay of the candidate only.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from bench_helpers import FAKE, REPO, processes_with, run_cli, write_matrix

from harness.judge.gates import evaluate_gates
from harness.judge.paired import compare_paired, paired_metric, paired_t, wilcoxon
from harness.run.sides import Side, cpu_split, pin_server, pinned_ref, resolve_commit, worktree
from harness.servers.launch import LaunchedServer
from harness.spec.checks import GateSpec
from harness.spec.matrix import EngineSpec

# --------------------------------------------------------------------------- statistics


def test_paired_tests_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for n in (4, 9, 20, 45):
        d = rng.normal(0.2, 1.0, n)
        assert math.isclose(paired_t(d), stats.ttest_1samp(d, 0).pvalue, rel_tol=1e-9)
        assert math.isclose(wilcoxon(d), stats.wilcoxon(d).pvalue, rel_tol=2e-2)
    tied = np.round(rng.normal(0.3, 1.0, 15), 1)
    expected = stats.wilcoxon(tied, correction=True, method="approx").pvalue
    assert math.isclose(wilcoxon(tied), expected, rel_tol=1e-6)
    assert paired_t(np.zeros(5)) == 1.0 and wilcoxon(np.zeros(5)) == 1.0


def _pairs(rng, k: int, slowdown: float, drift: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Latencies of k pairs: a shared drifting level (other load) x independent noise."""
    level = 10.0 * np.exp(np.cumsum(rng.normal(0, 0.08, k))) if drift else np.full(k, 10.0)
    a = level * np.exp(rng.normal(0, 0.08, k))
    b = level * (1 + slowdown) * np.exp(rng.normal(0, 0.08, k))
    return a, b


@pytest.mark.parametrize("test", ["paired_t", "wilcoxon"])
def test_paired_verdicts_aa_and_10pct(test):
    rng = np.random.default_rng(0)
    trials, alarms, caught = 300, 0, 0
    for _ in range(trials):
        a, b = _pairs(rng, 40, 0.0)
        alarms += (
            paired_metric("latency_p50_ms", a, b, 0.05, test, 2.0)["verdict"] != "within_noise"
        )
        a, b = _pairs(rng, 40, 0.10)
        r = paired_metric("latency_p50_ms", a, b, 0.05, test, 2.0)
        caught += r["verdict"] == "regressed"
    assert alarms <= 0.05 * trials, alarms
    assert caught >= 0.95 * trials, caught
    # drift alone, which an unpaired test mistakes for a change, cancels in the pairs
    a, b = _pairs(np.random.default_rng(1), 40, 0.0)
    assert paired_metric("qps", a, b, 0.05, test, 2.0)["verdict"] == "within_noise"


def test_sessions_are_the_units_when_processes_differ():
    """Each session's fresh processes carry their own lasting offset (sd 4%): pairs of one
    session are not independent, sessions are."""
    rng = np.random.default_rng(2)
    groups = np.repeat(np.arange(6), 10)
    alarms = {"pairs": 0, "sessions": 0}
    caught = 0
    for _ in range(300):
        offset = np.repeat(rng.normal(0, 0.04, 6), 10)
        a = 10 * np.exp(rng.normal(0, 0.1, 60))
        b = 10 * np.exp(offset + rng.normal(0, 0.1, 60))
        alarms["pairs"] += paired_metric("qps", a, b, 0.05, "paired_t", 2.0)["verdict"] != (
            "within_noise"
        )
        r = paired_metric("qps", a, b, 0.05, "paired_t", 2.0, groups)
        alarms["sessions"] += r["verdict"] != "within_noise"
        assert r["units"] == 6 and r["pairs"] == 60
        slow = paired_metric("qps", a, b * 0.85, 0.05, "paired_t", 2.0, groups)
        caught += slow["verdict"] == "regressed"
    assert alarms["sessions"] <= 20 < alarms["pairs"], alarms
    assert caught >= 270, caught


def test_paired_metric_details():
    a = np.array([10.0, 11, 9, 10, 12, 10])
    r = paired_metric("qps", a, a * 0.8, 0.05, "paired_t", 2.0)
    assert r["verdict"] == "regressed" and math.isclose(r["delta_pct"], -20.0)
    assert r["band_pct"] < 1e-9 and r["pairs"] == 6
    assert paired_metric("qps", a[:2], a[:2], 0.05, "paired_t", 2.0)["verdict"] == "n/a"
    zeros = np.zeros(6)
    r = paired_metric("error_rate", zeros, zeros, 0.05, "paired_t", 2.0)
    assert r["verdict"] == "within_noise" and r["delta_pct"] == 0.0
    r = paired_metric("error_rate", zeros, np.full(6, 0.5), 0.05, "paired_t", 2.0)
    assert r["verdict"] == "regressed"


def _report(values: dict[str, list[float]], cell: str = "e,concurrency=1") -> dict:
    k = len(next(iter(values.values())))
    rounds = [{"round": i, **{m: v[i] for m, v in values.items()}} for i in range(k)]
    return {
        "matrix": {"stats": {"alpha": 0.05, "test": "welch", "band_k": 2.0}},
        "cells": [
            {
                "id": cell,
                "params": {"engine": "e", "concurrency": 1},
                "status": "ok",
                "round_metrics": rounds,
                "metrics": {m: {"median": float(np.median(v))} for m, v in values.items()},
            }
        ],
    }


def test_compare_paired_feeds_the_regression_gates():
    rng = np.random.default_rng(5)
    a, b = _pairs(rng, 30, 0.0)
    _, slow = _pairs(rng, 30, 0.25)
    base = _report({"latency_p50_ms": list(a), "qps": list(1000 / a)})
    same = _report({"latency_p50_ms": list(b), "qps": list(1000 / b)})
    worse = _report({"latency_p50_ms": list(slow), "qps": list(1000 / slow)})
    gates = [
        GateSpec(metric="qps", max_regression_pct=2),
        GateSpec(metric="latency_p50_ms", max_regression_pct=2),
    ]
    ok = compare_paired(base, same)
    assert ok["paired"] and ok["test"] == "paired_t" and ok["verdict"] == "ok"
    assert evaluate_gates(gates, same, ok).to_json()["status"] == "pass"
    bad = compare_paired(base, worse)
    assert {r["metric"] for r in bad["regressions"]} == {"qps", "latency_p50_ms"}
    assert evaluate_gates(gates, worse, bad).to_json()["status"] == "fail"
    # rounds are matched by number: a missing round drops its pair, not the alignment
    worse["cells"][0]["round_metrics"].pop(3)
    assert compare_paired(base, worse)["cells"][0]["metrics"]["qps"]["pairs"] == 29


def test_compare_paired_judges_named_informational_metrics():
    """``also``: a Server-Timing phase judged lower-is-better, the steady rate higher-is-better,
    a metric without a direction only ``changed``; none of them without being named."""
    rng = np.random.default_rng(7)
    a, b = _pairs(rng, 30, 0.0)
    _, slow = _pairs(rng, 30, 0.25)
    base = _report({"qps": list(1000 / a), "server_tokenize_ms_mean": list(a),
                    "qps_steady": list(1000 / a), "prompt_tokens_mean": list(a)})  # fmt: skip
    new = _report({"qps": list(1000 / b), "server_tokenize_ms_mean": list(slow),
                   "qps_steady": list(1000 / slow), "prompt_tokens_mean": list(slow)})  # fmt: skip
    also = ["server_tokenize_ms_mean", "qps_steady", "prompt_tokens_mean"]
    got = compare_paired(base, new, also=also)["cells"][0]["metrics"]
    assert {m: got[m]["verdict"] for m in also} == {
        "server_tokenize_ms_mean": "regressed",
        "qps_steady": "regressed",
        "prompt_tokens_mean": "changed",
    }
    assert got["qps"]["verdict"] == "within_noise"
    assert set(compare_paired(base, new)["cells"][0]["metrics"]) == {"qps"}


# --------------------------------------------------------------------------- git plumbing


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


SERVER = """import runpy, sys
sys.argv[1:1] = ["--latency-ms", "{latency}"] + {extra!r}
if {broken}:
    sys.exit("this baseline cannot serve")
runpy.run_path({fake!r}, run_name="__main__")
"""


def _write_server(repo: Path, latency: float, broken: bool = False, extra: tuple = ()) -> None:
    text = SERVER.format(latency=latency, broken=broken, fake=FAKE, extra=list(extra))
    (repo / "server.py").write_text(text)


def _repo(tmp_path: Path, latency: float = 4.0, broken: bool = False, commits: int = 2) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    for i in range(commits):
        _write_server(repo, latency, broken)
        (repo / "n.txt").write_text(str(i))
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"c{i}")
    return repo


def test_refs_pin_file_and_worktree(tmp_path):
    repo = _repo(tmp_path)
    assert pinned_ref(repo) is None
    (repo / ".ci").mkdir()
    (repo / ".ci" / "baseline-ref").write_text("# comment\n\n  v1.0  # pinned\nother\n")
    assert pinned_ref(repo) == "v1.0"
    head1 = _git(repo, "rev-parse", "HEAD~1")
    assert resolve_commit(repo, "HEAD~1") == head1
    assert resolve_commit(repo, "HEAD~5") is None and resolve_commit(repo, "nope") is None
    with worktree(repo, head1) as tree:
        assert (tree / "n.txt").read_text() == "0"
        assert str(tree) in _git(repo, "worktree", "list")
    assert not tree.exists() and str(tree) not in _git(repo, "worktree", "list")


def test_side_points_the_engine_at_its_tree(tmp_path):
    side = Side("baseline", tmp_path, {"FLASHREC_TEST_STEP_DELAY_MS": "1"})
    e = side.engine(EngineSpec(kind="flashrec", env={"X": "1"}))
    assert e.cwd == str(tmp_path) and e.env["X"] == "1"
    assert e.env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert e.env["FLASHREC_TEST_STEP_DELAY_MS"] == "1"
    if (REPO / ".git").exists():
        origin = Side("candidate", REPO).flashrec_origin(EngineSpec(kind="flashrec"))
        assert origin == str(REPO / "flashrec" / "__init__.py")


@pytest.mark.skipif(cpu_split() is None, reason="needs >= 2 CPUs")
def test_pin_server_pins_every_thread(tmp_path, marker):
    servers, client = cpu_split()
    assert servers and client and not servers & client
    engine = EngineSpec(kind="command", command=["python", FAKE, "--marker", marker])
    server = LaunchedServer(engine, {}, None, tmp_path / "s.log")
    server.launch()
    try:
        pin_server(server, servers)
        tasks = list(Path(f"/proc/{server.proc.pid}/task").iterdir())
        assert tasks and all(os.sched_getaffinity(int(t.name)) == servers for t in tasks)
    finally:
        server.stop()
    assert not processes_with(marker)


# --------------------------------------------------------------------------- whole gate runs


def _matrix(
    tmp_path: Path, repo: Path, marker: str, pairs: int = 8, gates: tuple[dict, ...] = ()
) -> Path:
    m = {
        "name": "abtest",
        "engine": {
            "name": "fake",
            "kind": "command",
            "command": ["python", "server.py", "--marker", marker],
            "startup_timeout_s": 120,  # a fake server's start on a saturated 2-core machine
            "stop_timeout_s": 5,
        },
        "workload": {"kind": "lorem", "requests": 10, "warmup_requests": 2, "median_tokens": 20},
        "axes": {"concurrency": [1, 2]},
        "load": {"rounds": pairs, "beam_width": 4, "radix": "cold", "request_timeout_s": 10},
        "gates": [
            {"metric": "error_rate", "op": "==", "value": 0},
            {"metric": "latency_p50_ms", "max_regression_pct": 10},
            *gates,
        ],
    }
    return write_matrix(repo, m, "gate.yaml")


def _gate(repo: Path, monkeypatch, *argv: str) -> tuple[int, dict]:
    monkeypatch.chdir(repo)
    out = repo.parent / "out"
    code = run_cli("gate", "gate.yaml", "--out", str(out), *argv)
    return code, json.loads((out / "compare.json").read_text())


def _commit_matrix(
    repo: Path, tmp_path: Path, marker: str, pairs: int = 8, gates: tuple[dict, ...] = ()
) -> None:
    _matrix(tmp_path, repo, marker, pairs, gates)
    _git(repo, "add", "gate.yaml")
    _git(repo, "commit", "-q", "-m", "matrix")


def test_gate_aa_passes_and_slowed_candidate_fails(tmp_path, monkeypatch, marker):
    repo = _repo(tmp_path)
    _commit_matrix(repo, tmp_path, marker)
    affinity = os.sched_getaffinity(0)
    code, res = _gate(repo, monkeypatch, "--baseline-ref", "HEAD", "--pin-cpus", "--sessions", "3")
    assert code == 0, res["gate"]
    assert res["gate"]["status"] == "pass" and res["paired"]
    assert os.sched_getaffinity(0) == affinity, "the client's CPU mask is restored"
    assert res["sessions"] == res["ab"]["sessions"] == 3 and res["ab"]["pairs"] == 8
    assert res["ab"]["baseline_commit"] == _git(repo, "rev-parse", "HEAD")
    r = res["cells"][0]["metrics"]["latency_p50_ms"]
    assert res["cells"][0]["status"] == "compared" and (r["pairs"], r["units"]) == (8, 3)
    out = repo.parent / "out"
    for side in ("baseline", "candidate"):
        rep = json.loads((out / side / "report.json").read_text())
        assert [c["rounds"] for c in rep["cells"]] == [8, 8]
        logs = sorted(p.name for p in (out / side / "servers").iterdir())
        assert logs == ["fake-1.log", "fake-2.log", "fake-3.log"], "fresh servers per session"
    assert (out / "compare.md").read_text().count("## A/B gate: pass") == 1

    _write_server(repo, 24.0)  # the working tree (candidate) is now 6x as slow: far beyond
    # what other load on the machine adds to a request, so the verdict holds on a busy machine
    code, res = _gate(repo, monkeypatch, "--baseline-ref", "HEAD")
    assert code == 1 and res["gate"]["status"] == "fail"
    regressed = {(r["cell"], r["metric"]) for r in res["regressions"]}
    assert ("fake,concurrency=1", "latency_p50_ms") in regressed
    assert not processes_with(marker), "no server outlives the gate"
    assert len(_git(repo, "worktree", "list").splitlines()) == 1, "baseline worktree removed"


def test_gate_without_usable_baseline(tmp_path, monkeypatch, marker, capsys):
    repo = _repo(tmp_path, commits=1)
    _commit_matrix(repo, tmp_path, marker, pairs=3)  # HEAD~1 exists but predates gate.yaml
    code, res = _gate(repo, monkeypatch)
    assert code == 2 and res["gate"]["status"] == "error"
    code, res = _gate(repo, monkeypatch, "--allow-no-baseline")
    assert code == 0 and res["gate"]["status"] == "skipped"
    assert "predates gate.yaml" in res["gate"]["reason"]
    code, res = _gate(repo, monkeypatch, "--allow-no-baseline", "--baseline-ref", "HEAD~9")
    assert code == 0 and "names no commit" in res["gate"]["reason"]
    # a baseline whose servers cannot start: skipped, and the candidate was still measured
    _write_server(repo, 4.0, broken=True)
    _git(repo, "commit", "-q", "-am", "broken server")
    _write_server(repo, 4.0)
    capsys.readouterr()
    code, res = _gate(repo, monkeypatch, "--baseline-ref", "HEAD")
    assert code == 3 and res["gate"]["status"] == "error"
    # the failed start is printed with the end of that server's log: its cause at a glance
    said = capsys.readouterr()
    printed = said.out + said.err
    assert "baseline server failed to start" in printed
    assert "its log ends:" in printed and "\n    this baseline cannot serve\n" in printed
    code, res = _gate(repo, monkeypatch, "--baseline-ref", "HEAD", "--allow-no-baseline")
    assert code == 0 and "cannot serve" in res["gate"]["reason"]
    cand = json.loads((repo.parent / "out" / "candidate" / "report.json").read_text())
    assert all(c["status"] == "ok" for c in cand["cells"])
    assert not processes_with(marker)


def test_gate_judges_named_metrics(tmp_path, monkeypatch, marker):
    """--metrics: a Server-Timing phase that got worse fails the gate though latency and
    throughput did not move (the fake reports the phase, it does not wait for it); a phase
    the servers do not report is an error, not a pass on nothing."""
    repo = _repo(tmp_path)
    _write_server(repo, 4.0, extra=("--tokenize-ms", "1.0"))
    _git(repo, "commit", "-q", "-am", "Server-Timing")
    _commit_matrix(repo, tmp_path, marker, pairs=4)
    tok = "server_tokenize_ms_mean"
    code, res = _gate(repo, monkeypatch, "--baseline-ref", "HEAD", "--metrics", tok)
    assert code == 0 and res["gate"]["status"] == "pass", res["gate"]
    assert res["cells"][0]["metrics"][tok]["verdict"] == "within_noise"
    _write_server(repo, 4.0, extra=("--tokenize-ms", "3.0"))  # the candidate's phase, 3x
    code, res = _gate(repo, monkeypatch, "--baseline-ref", "HEAD", "--metrics", tok)
    assert code == 1 and res["gate"]["status"] == "fail", res["gate"]
    # the named phase regressed (latency or QPS may also read as moved on a loaded machine:
    # four pairs of a fake; the claim here is the phase's verdict, which fails the gate)
    assert (tok, "regressed") in {(r["metric"], r["verdict"]) for r in res["regressions"]}
    assert res["cells"][0]["metrics"][tok]["verdict"] == "regressed"
    code, res = _gate(repo, monkeypatch, "--baseline-ref", "HEAD")  # not named: not judged
    assert code == 0 and tok not in res["cells"][0]["metrics"]
    code, res = _gate(
        repo, monkeypatch, "--baseline-ref", "HEAD", "--metrics", "server_ipc_ms_mean"
    )
    assert code == 2 and res["gate"]["status"] == "error"
    assert "no paired rounds" in res["gate"]["reason"]
    assert not processes_with(marker)


def test_a_gate_left_nothing_to_check_is_an_error(tmp_path, monkeypatch, marker):
    """A regression gate on a metric the servers never report (this fake sends no ipc phase)
    has nothing to check in any cell: the A/B is an error (exit 3), not a pass on the
    other gates."""
    repo = _repo(tmp_path)
    gate = {"name": "ipc", "metric": "server_ipc_ms_mean", "max_regression_pct": 10}
    _commit_matrix(repo, tmp_path, marker, pairs=3, gates=(gate,))
    code, res = _gate(repo, monkeypatch, "--baseline-ref", "HEAD")
    assert code == 3 and res["gate"]["status"] == "error", res["gate"]
    assert "gates with nothing to check: ipc" in res["gate"]["reason"]
    assert not processes_with(marker)


def test_gate_within_a_time_budget(tmp_path, monkeypatch, marker):
    """--max-wall-s: the pairs that fit are compared (each cell has >= 3), and the verdict
    says the run was cut; a budget that leaves a cell under 3 pairs is an error, never a
    pass on rounds that did not run."""
    repo = _repo(tmp_path)
    _commit_matrix(repo, tmp_path, marker, pairs=1000)
    base = ("--baseline-ref", "HEAD", "--sessions", "1")
    code, res = _gate(repo, monkeypatch, *base, "--max-wall-s", "20")
    assert code == 0 and res["gate"]["status"] == "pass", res["gate"]
    assert 3 <= res["ab"]["pairs"] < res["ab"]["pairs_planned"] == 1000
    assert res["ab"]["cut"] and "cut after" in res["gate"]["reason"]
    assert all(c["metrics"]["qps"]["pairs"] >= 3 for c in res["cells"])
    code, res = _gate(repo, monkeypatch, *base, "--max-wall-s", "0.001")
    assert code == 3 and res["gate"]["status"] == "error"
    assert "too few pairs to judge" in res["gate"]["reason"]
    assert not processes_with(marker)


def test_gate_usage_errors(tmp_path, monkeypatch, marker):
    repo = _repo(tmp_path)
    _matrix(tmp_path, repo, marker)
    monkeypatch.chdir(repo)
    assert run_cli("gate", "gate.yaml", "--pairs", "2") == 2
    assert run_cli("gate", "gate.yaml", "--metrics", "tokenize_ms") == 2  # no such metric
    assert run_cli("gate", "gate.yaml", "--max-wall-s", "0") == 2
    assert run_cli("gate", "gate.yaml", "--sessions", "9") == 2  # 8 pairs
    assert run_cli("gate", "gate.yaml", "--candidate-env", "NOVALUE") == 2
    assert run_cli("gate", "missing.yaml") == 2
    monkeypatch.chdir(tmp_path)  # not a git checkout
    assert run_cli("gate", str(repo / "gate.yaml")) == 2


@pytest.mark.skipif(
    not (REPO / ".git").exists() or not (REPO / "flashrec" / "server" / "app.py").is_file(),
    reason="needs the FlashRec server in a git checkout",
)
def test_planted_step_delay_fails_the_gate_on_flashrec(tmp_path, monkeypatch):
    """The real engine, baseline = HEAD (a worktree); only the candidate sleeps after steps.

    The planted delay (25 ms a step, ~100 ms a request) is large against what a loaded 2-core
    machine adds to a tiny-model request, so it stays far beyond the gate's 10% and the band
    however busy the machine is; the assertions are on the verdict, not on its size."""
    m = {
        "name": "planted",
        "engine": {"kind": "flashrec", "device": "cpu", "env": {"OMP_NUM_THREADS": "1"}},
        "model": {"preset": "tiny", "seed": 0, "dtype": "float32", "catalog_size": 2000},
        "workload": {"requests": 8, "warmup_requests": 2, "median_tokens": 48},
        "axes": {"beam_width": [8]},
        "load": {"rounds": 8, "radix": "warm", "max_tokens": 4},
        "gates": [{"metric": "latency_p50_ms", "max_regression_pct": 10}],
    }
    matrix = write_matrix(tmp_path, m)
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    argv = ["gate", str(matrix), "--baseline-ref", "HEAD", "--out", str(out)]
    code = run_cli(*argv, "--candidate-env", "FLASHREC_TEST_STEP_DELAY_MS=25")
    res = json.loads((out / "compare.json").read_text())
    assert code == 1, res.get("gate")
    r = res["cells"][0]["metrics"]["latency_p50_ms"]
    assert r["verdict"] == "regressed" and r["delta_pct"] > 10, r
    assert res["gates"]["status"] == "fail"
    assert res["ab"]["candidate_env"] == ["FLASHREC_TEST_STEP_DELAY_MS=25"]


WIDE = ["qps", "latency_mean_ms", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms",
        "beams_mean", "achieved_tflops", "mfu", "speedup_vs_hf", "burst_ms_mean"]  # fmt: skip


def _wide_pair(rng, shift: dict[str, float], pairs: int = 10) -> tuple[dict, dict]:
    """Baseline and candidate of one paired run: ten directional metrics drawn independently
    (a drift shared by the two halves of a pair, 2% noise of their own) and an error rate of
    0 on both sides; ``shift[name]`` scales the candidate's values of that metric."""
    a, b = {}, {}
    for m in WIDE:
        drift = 10 * np.exp(rng.normal(0, 0.05, pairs))
        a[m] = list(drift * np.exp(rng.normal(0, 0.02, pairs)))
        b[m] = list(drift * shift.get(m, 1.0) * np.exp(rng.normal(0, 0.02, pairs)))
    a["error_rate"] = b["error_rate"] = [0.0] * pairs
    return _report(a), _report(b)


def test_holm_keeps_the_table_free_of_false_verdicts_and_keeps_real_ones():
    """Ten metrics of one cell, each tested at alpha, label one of them "regressed" or
    "improved" in ~40% of A/A comparisons; Holm-adjusted (the default), in at most ~alpha of
    them. A 10% slowdown of one metric stays regressed; the error rate (0 against 0) is no
    test and does not count."""
    rng = np.random.default_rng(3)
    trials, raw, labelled = 300, 0, 0
    for _ in range(trials):
        a, b = _wide_pair(rng, {})
        plain = compare_paired(a, b, correction="none")
        raw += bool(plain["improvements"] or plain["regressions"])
        res = compare_paired(a, b)
        labelled += bool(res["improvements"] or res["regressions"])
        assert res["correction"] == {"method": "holm", "tests": 10}
    assert raw / trials > 0.25, raw  # the problem the correction solves is real
    assert labelled / trials <= 0.07, labelled
    slow = compare_paired(*_wide_pair(rng, {"latency_p50_ms": 1.1}))
    assert [r["metric"] for r in slow["regressions"]] == ["latency_p50_ms"]
    r = slow["regressions"][0]
    assert r["p_value"] <= r["p_adjusted"] < 0.05


def test_holm_reason_markdown_and_matrix_setting(tmp_path):
    """A verdict only the correction removes says why; compare.md shows both p columns and
    the number of tests; ``stats.correction: none`` in the matrix turns the correction off."""
    from harness.report.render_compare import write_compare_markdown

    rng = np.random.default_rng(11)
    for _ in range(300):  # an A/A pair where a metric is significant alone, not after Holm
        a, b = _wide_pair(rng, {})
        res = compare_paired(a, b)
        dropped = [
            r
            for r in res["cells"][0]["metrics"].values()
            if r.get("reason", "").endswith("tests (Holm)")
        ]
        if dropped:
            break
    assert dropped and dropped[0]["p_value"] < 0.05 <= dropped[0]["p_adjusted"]
    assert dropped[0]["verdict"] == "within_noise"
    write_compare_markdown(res, tmp_path / "compare.md")
    text = (tmp_path / "compare.md").read_text()
    assert "| p | p (Holm) | verdict |" in text and "Holm-adjusted over the 10 tests" in text
    b["matrix"]["stats"]["correction"] = "none"
    plain = compare_paired(a, b)
    assert plain["correction"]["method"] == "none"
    assert plain["regressions"] or plain["improvements"]


def test_a_failed_start_fails_only_the_cells_of_its_server(tmp_path):
    """One server group that cannot start (e.g. out of GPU memory beside the other side's
    server) fails its own cells; cells already measured on other servers keep their results."""
    import asyncio

    from harness.run.sides import ABRun
    from harness.servers.launch import ServerError
    from harness.spec.load import load_cells

    path = _matrix(tmp_path, tmp_path, "unused", pairs=3)
    spec, cells = load_cells(str(path))
    assert len(cells) == 2
    sides = [Side("baseline", tmp_path), Side("candidate", tmp_path)]
    run = ABRun(spec, cells, sides, 3, tmp_path / "out", None, log=lambda _: None)

    class NoStart:
        async def start(self, session):
            raise ServerError("exited with code 1 during start", log_tail="CUDA out of memory")

    run.campaigns["candidate"].new_server = lambda cell: NoStart()
    group = [c for c in run.cells["candidate"] if c.id == cells[1].id]
    assert asyncio.run(run._start(None, "candidate", group)) is None
    res = run.results["candidate"]
    assert res[cells[1].id].status == "failed" and "out of memory" in res[cells[1].id].log_tail
    assert res[cells[0].id].status == "ok", "a cell of another server is not failed with it"
    assert all(r.status == "ok" for r in run.results["baseline"].values())
