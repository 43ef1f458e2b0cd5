"""``flashrec-bench witness``: flashrec-bench and GuideLLM on the same cell and server."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import requests
from bench_helpers import run_cli

from harness.witness.guidellm import guidellm_argv, guidellm_scenario
from harness.witness.side_by_side import compare, served_delta


def _scenario(tmp_path: Path) -> dict:
    return guidellm_scenario(
        "http://127.0.0.1:9", tmp_path / "p.jsonl", "/tok", n=8, concurrency=4, requests=40,
        max_tokens=4, timeout_s=60.0, out_json=tmp_path / "g.json",
    )  # fmt: skip


def test_scenario_is_the_cell_as_guidellm_reads_it(tmp_path):
    """GuideLLM's own scenario loader turns our file into the cell: chat completions, not
    streamed, HTTP/1.1, n and temperature 0 in the body, c streams, exactly R requests."""
    loader = pytest.importorskip("guidellm.schemas.benchmark.entrypoints", reason="no guidellm")
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_scenario(tmp_path)))
    (bench,) = loader.BenchmarkScenario.create(str(path)).get_benchmarks()
    b = bench.backend
    assert (b.kind, b.request_format, b.stream, b.http2) == (
        "openai_http", "/v1/chat/completions", False, False
    )  # fmt: skip
    assert b.extras.body == {"n": 8, "temperature": 0.0} and b.max_tokens == 4
    assert bench.profile.kind == "concurrent" and bench.profile.streams == [4]
    (limit,) = bench.constraints
    assert (limit.kind, limit.count) == ("max_requests", 40)
    assert str(bench.data[0].path).endswith("p.jsonl")


def test_compare_takes_medians_over_rounds_and_judges_each_metric():
    def rnd(qps, p50, p99):
        return {"qps": qps, "latency_p50_ms": p50, "latency_p99_ms": p99,
                "recomputed": {"qps": qps, "latency_p50_ms": p50, "latency_p99_ms": p99}}  # fmt: skip

    bench = [rnd(100, 10, 20), rnd(110, 11, 30), rnd(90, 9, 25)]
    witness = [rnd(103, 10.2, 40), rnd(104, 10.4, 41), rnd(10, 1, 1)]
    c = compare(bench, witness, 0.05)
    m = c["metrics"]
    assert m["qps"]["flashrec_bench"] == 100 and m["qps"]["witness"] == 103
    assert m["qps"]["ratio"] == pytest.approx(1.03) and m["qps"]["agree"]
    assert m["latency_p50_ms"]["agree"] and not m["latency_p99_ms"]["agree"]
    assert m["latency_p99_ms"]["ratio"] == pytest.approx(40 / 25)
    assert not c["agree"]
    assert compare(bench, witness, 0.7)["agree"]


def test_served_delta_reads_the_servers_counters():
    before = {
        'flashrec_requests_total{endpoint="chat",outcome="success"}': 10.0,
        "flashrec_completion_tokens_total": 100.0,
        'flashrec_request_latency_seconds_sum{endpoint="chat"}': 1.0,
        'flashrec_request_latency_seconds_count{endpoint="chat"}': 10.0,
    }
    after = dict(before)
    after.update({k: v * 3 for k, v in before.items()})
    d = served_delta(before, after)
    assert d == {"requests": 20.0, "completion_tokens": 200.0, "latency_mean_ms": 100.0}
    assert served_delta(None, after) == {} and served_delta(before, {}) == {}


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--url", "http://127.0.0.1:9"], "--url needs --tokenizer"),
        (["--url", "http://127.0.0.1:9", "--tokenizer", "t", "--pin-cpus"], "need --model-path"),
        (["--url", "http://127.0.0.1:9", "--tokenizer", "t", "--rounds", "0"], "--rounds must"),
    ],
)
def test_bad_flags_exit_2_and_say_why(capsys, argv, needle):
    assert run_cli("witness", *argv) == 2
    assert needle in capsys.readouterr().err


def test_witness_on_a_launched_tiny_flashrec(tmp_path, tiny_model):
    """A tiny run end to end: both tools measured the cell, GuideLLM sent flashrec-bench's
    measured prompts, each once, with n beams, the server counted the same work for both, the server
    is gone after. The agreement itself is measured in docs/baselines.md, not asserted on a
    loaded 2-core machine (a tolerance of 100 lets any numbers pass that verdict)."""
    if guidellm_argv(None) is None:
        pytest.skip("GuideLLM is not installed (the dev extra has it)")
    out = tmp_path / "w"
    argv = ["--model-path", str(tiny_model), "--device", "cpu", "--beam-width", "4",
            "--concurrency", "2", "--requests", "8", "--warmup", "2", "--rounds", "1",
            "--prompt-tokens", "40", "--timeout-s", "60", "--tolerance", "100",
            "--out", str(out)]  # fmt: skip
    assert run_cli("witness", *argv) == 0
    rep = json.loads((out / "report.json").read_text())
    assert "Witness: flashrec-bench vs GuideLLM" in (out / "REPORT.md").read_text()
    tools = {r["tool"]: r for r in rep["rounds"]}
    assert sorted(tools) == ["flashrec-bench", "guidellm"]
    for r in tools.values():
        assert r["server"]["requests"] == 8  # the measured requests alone, warm-up excluded
        assert r["server"]["completion_tokens"] == 8 * 4 * 4  # n beams of 3 levels + end
        assert r["qps"] > 0 and 0 < r["latency_p50_ms"] <= r["latency_p99_ms"]
    g, b = tools["guidellm"], tools["flashrec-bench"]
    assert g["ok"] == 8 and g["errors"] == 0 and g["output_tokens_mean"] == 16
    assert {k: g["body"][k] for k in ("n", "temperature", "max_completion_tokens")} == {
        "n": 4, "temperature": 0.0, "max_completion_tokens": 4
    }  # fmt: skip
    assert b["beams_mean"] == 4 and b["invalid_rate"] == 0 and b["errors"] == 0
    sent = json.loads((out / "witness" / "round-0" / "guidellm.json").read_text())
    bodies = [
        json.loads(r["request_args"])["body"]
        for r in sent["benchmarks"][0]["requests"]["successful"]
    ]
    ours = [json.loads(line)["messages"] for line in (out / "witness" / "prompts.jsonl").open()]
    assert len(ours) == 8 and sorted(map(json.dumps, (x["messages"] for x in bodies))) == sorted(
        map(json.dumps, ours)
    )
    assert all(not math.isnan(v["ratio"]) for v in rep["comparison"]["metrics"].values())
    with pytest.raises(requests.ConnectionError):
        requests.get(rep["server"]["url"] + "/health", timeout=5)
