"""HF baseline, MFU, targets and explicit ``cells:`` lists (harness.metrics.flops,
harness.baseline.hf, harness.judge.targets)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from bench_helpers import REPO, base_matrix, fake_engine, processes_with, run_cli, write_matrix

from harness.judge.targets import evaluate_targets
from harness.load.client import Record
from harness.metrics.flops import (
    ceiling_for,
    decode_forwards,
    derived_metrics,
    kv_guard,
    linear_params,
    request_flops,
)
from harness.spec.cells import expand_cells
from harness.spec.checks import TargetSpec
from harness.spec.load import load_cells
from harness.spec.matrix import MfuSpec, SpecError, parse_spec

TINY = {  # the tiny preset's shapes (flashrec/synth/presets.py)
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
}


def test_linear_params_by_hand(tiny_model):
    # per layer: q 64x64 + k 64x32 + v 64x32 + o 64x64 + gate/up/down 3 x 64x128
    per_layer = 4096 + 2048 + 2048 + 4096 + 3 * 8192
    assert linear_params(TINY) == 2 * per_layer == 73_728
    cfg = json.loads((Path(tiny_model) / "config.json").read_text())
    assert linear_params(cfg) == 73_728
    # onerec-1.7b: 28 x (q 2048x2048 + k, v 2048x1024 + o 2048x2048 + 3 x 2048x6144) = 1.409 B
    from flashrec.synth import config_dict, resolve_preset

    big = config_dict(resolve_preset("onerec-1.7b"), "bf16")
    assert linear_params(big) == 28 * (3 * 2048 * 2048 + 3 * 2048 * 6144) == 1_409_286_144


def test_flops_per_request():
    assert decode_forwards(4, 3) == 2  # levels 1 and 2; the <|sid_end|> step is free
    assert decode_forwards(2, 3) == 1 and decode_forwards(1, 3) == 0
    p = 1_409_286_144
    # n=50, 2,491 prompt tokens: 2 * params * tokens of prefill, two decode forwards of 50 rows
    assert request_flops(p, 2491, 50, 0) / 1e12 == pytest.approx(7.021, abs=1e-3)
    assert request_flops(p, 0, 50, 2) / 1e12 == pytest.approx(0.2819, abs=1e-4)


def test_mfu_arithmetic():
    mfu = MfuSpec(ceiling_tflops={"fp8": 1450, "bf16": 760})
    assert ceiling_for(mfu, {"quantization": "fp8"}) == (1450.0, "fp8")
    assert ceiling_for(mfu, {"quantization": "BF16"}) == (760.0, "bf16")
    assert ceiling_for(mfu, {"quantization": "int4"})[0] is None
    assert ceiling_for(MfuSpec(ceiling_tflops=500), {}) == (500.0, "")
    with_default = MfuSpec(ceiling_tflops={"fp8": 1, "default": 2})
    assert ceiling_for(with_default, {}) == (2.0, "default")
    info = {"linear_params": 1000, "beam_width": 4, "decode_forwards": 2, "ceiling_tflops": 1e-6}
    recs = [
        Record("c", 0, "measure", i, i, 0.0, 1.0, prompt_tokens=100, cached_tokens=20)
        for i in range(2)
    ]
    hf = {"status": "ok", "hf_ms_per_request": 500.0, "hf_qps": 2.0}
    extra = derived_metrics(info, hf)
    out = extra(recs, {"qps": 10.0, "latency_mean_ms": 50.0})
    flops = 2 * 1000 * (100 - 20 + 4 * 2)  # prefilled tokens + decode rows
    assert out["tflop_per_request"] == pytest.approx(flops / 1e12)
    assert out["achieved_tflops"] == pytest.approx(flops * 10 / 1e12)
    assert out["mfu"] == pytest.approx(flops * 10 / 1e12 / 1e-6)
    assert out["speedup_vs_hf"] == pytest.approx(5.0)
    assert out["hf_latency_ratio"] == pytest.approx(10.0)
    assert derived_metrics(None, None) is None


def test_kv_guard_reason():
    onerec = {**TINY, "num_hidden_layers": 28, "num_key_value_heads": 8, "head_dim": 128}
    gib, reason = kv_guard(onerec, 512, 2465, 2, 120)
    assert gib == pytest.approx(512 * 2465 * 28 * 2 * 8 * 128 * 2 / 2**30)
    assert reason.startswith("needs ~135 GiB of per-beam KV (512 beams x 2465 prompt tokens")
    assert reason.endswith("> max_kv_gib 120")
    assert kv_guard(onerec, 50, 2465, 2, 120)[1] is None
    assert kv_guard(onerec, 512, 2465, 2, None)[1] is None


def _report(cells):
    return {
        "cells": [
            {
                "id": cid,
                "params": params,
                "status": "ok",
                "metrics": {k: {"median": v} for k, v in metrics.items()},
            }
            for cid, params, metrics in cells
        ]
    }


def test_targets_met_and_missed():
    rep = _report(
        [
            ("a", {"beam_width": 50}, {"qps": 41.6, "latency_p50_ms": 734.0}),
            ("b", {"beam_width": 256}, {"qps": 26.4, "latency_p50_ms": 37.9}),
            ("c", {"beam_width": 8}, {"qps": 130.0}),
        ]
    )
    targets = [
        TargetSpec(metric="qps", op=">=", value=100, cells="beam_width=50"),
        TargetSpec(name="lat", metric="latency_p50_ms", op="<=", value=12, cells="beam_width=256"),
        TargetSpec(metric="qps", op=">=", value=100, cells="beam_width=8"),
    ]
    res = evaluate_targets(targets, rep).to_json()
    assert res["status"] == "missed" and res["fail_run"] is False
    qps, lat, ok = (r["checks"][0] for r in res["results"])
    assert not qps["met"] and qps["missed_by"] == pytest.approx(58.4)
    assert qps["ratio"] == pytest.approx(0.416) and qps["factor"] == pytest.approx(100 / 41.6)
    assert qps["text"].startswith("missed by 58.4 (41.6 vs >= 100: 0.416x the target; needs 2.4")
    assert not lat["met"] and lat["factor"] == pytest.approx(37.9 / 12)
    assert "missed by 25.9" in lat["text"]
    assert ok["met"] and ok["missed_by"] == 0 and ok["text"].startswith("met (130 vs >= 100")
    strict = [TargetSpec(metric="qps", op=">=", value=100, cells="beam_width=50", fail_run=True)]
    assert evaluate_targets(strict, rep).to_json()["fail_run"] is True
    assert evaluate_targets([], rep).to_json()["status"] == "none"


def test_relative_targets_judge_a_cell_against_its_same_run_reference():
    """relative_to: the metric as a ratio to the cell with those parameters changed (#29's
    "sampling within 5% of greedy, same run"); a cell without a reference has no data, a
    reference the filter also selects is not judged against itself."""
    rep = _report(
        [
            ("g50", {"beam_width": 50, "temperature": 0.0}, {"qps": 104.65}),
            ("s50", {"beam_width": 50, "temperature": 0.8}, {"qps": 93.56}),
            ("g8", {"beam_width": 8, "temperature": 0.0}, {"qps": 200.0}),
            ("s8", {"beam_width": 8, "temperature": 0.8}, {"qps": 198.0}),
            ("s4", {"beam_width": 4, "temperature": 0.8}, {"qps": 300.0}),  # no greedy cell
        ]
    )
    t = TargetSpec(
        name="sampling", metric="qps", op=">=", value=0.95, relative_to="temperature=0.0"
    )
    res = evaluate_targets([t], rep).to_json()["results"][0]
    assert res["status"] == "missed"
    by = {c["cell"]: c for c in res["checks"]}
    assert set(by) == {"s50", "s8"}  # g50 / g8 are their own references: not judged
    assert not by["s50"]["met"] and by["s50"]["actual"] == pytest.approx(93.56 / 104.65)
    assert by["s50"]["reference"] == "g50" and by["s50"]["reference_actual"] == 104.65
    assert by["s50"]["text"].endswith(
        "(0.894 vs >= 0.95: 0.941x the target; needs 1.06x); 93.56 against 104.7 in g50"
    )
    assert by["s8"]["met"] and by["s8"]["actual"] == pytest.approx(0.99)
    assert res["missing"] == ["s4"] and "no cell of this run" in res["missing_why"]["s4"]
    # a failed reference: the cell has no data, saying whose metric is missing
    rep["cells"][2]["status"] = "failed"
    res = evaluate_targets([t], rep).to_json()["results"][0]
    assert (
        "s8" in res["missing"] and "the reference g8's qps is missing" in res["missing_why"]["s8"]
    )
    with pytest.raises(ValueError, match="key=value"):
        TargetSpec(metric="qps", op=">=", value=0.95, relative_to="temperature=0.*")


def test_relative_targets_checked_against_the_matrix(tmp_path):
    """A relative_to naming a parameter no cell has, or values no cell has, is reported when
    the matrix is checked, before anything runs."""

    def problems(relative_to: str) -> list[str]:
        m = base_matrix(
            fake_engine(),
            axes={"beam_width": [4, 8], "temperature": [0.0, 0.8]},
            targets=[{"metric": "qps", "op": ">=", "value": 0.9, "cells": "temperature=0.8",
                      "relative_to": relative_to}],
        )  # fmt: skip
        try:
            load_cells(str(write_matrix(tmp_path, m)))
        except SpecError as exc:
            return str(exc)
        return ""

    assert problems("temperature=0.0") == ""
    assert "relative_to" in problems("temp=0.0") and "parameter(s) temp" in problems("temp=0.0")
    assert "no cell it selects has a cell with those values" in problems("temperature=0.5")


def test_targets_say_the_mfu_a_missed_speed_target_needs():
    rep = _report(
        [
            ("a", {"beam_width": 50}, {"qps": 40.0, "error_rate": 0.02}),
            ("b", {"beam_width": 256}, {"latency_p50_ms": 36.0}),
            ("c", {"beam_width": 8}, {"qps": 50.0}),
        ]
    )
    rep["cells"][0]["mfu"] = {"mfu": 0.2}
    rep["cells"][1]["mfu"] = {"mfu": 0.15}
    targets = [
        TargetSpec(metric="qps", op=">=", value=100, cells="beam_width=50"),
        TargetSpec(metric="latency_p50_ms", op="<=", value=12, cells="beam_width=256"),
        TargetSpec(metric="error_rate", op="<=", value=0.01, cells="beam_width=50"),
        TargetSpec(metric="qps", op=">=", value=100, cells="beam_width=8"),
    ]
    qps, lat, err, no_mfu = (
        r["checks"][0] for r in evaluate_targets(targets, rep).to_json()["results"]
    )
    assert qps["mfu_needed"] == pytest.approx(0.2 * 100 / 40)
    assert qps["text"].endswith("needs 2.5x, MFU 20.0% -> 50.0%)")
    assert lat["mfu_needed"] == pytest.approx(0.15 * 36 / 12)
    assert err["mfu_needed"] is None and "MFU" not in err["text"]  # not a speed metric
    assert no_mfu["mfu_needed"] is None and "MFU" not in no_mfu["text"]  # no MFU entry


def test_explicit_cells_list():
    spec, _ = parse_spec(
        """
engine: {name: fr, kind: command, command: [python, x.py]}
cells:
  - {beam_width: 50, concurrency: 32, quantization: fp8}
  - {beam_width: 256, concurrency: 1, prompt_tokens: 1000}
link:
  slots: "beam_width * concurrency"
exclude:
  - {prompt_tokens: 5000}
"""
    )
    cs = expand_cells(spec)
    assert [c.id for c in cs] == [
        "fr,beam_width=50,concurrency=32,quantization=fp8",
        "fr,beam_width=256,concurrency=1,prompt_tokens=1000",
    ]
    assert cs[0].server_args == {"beam_width": 50, "quantization": "fp8", "slots": 1600}
    assert cs[1].client.median_tokens == 1000 and cs[1].client.concurrency == 1
    with pytest.raises(SpecError, match="not both"):
        parse_spec("engine: {kind: external, url: 'http://h:1'}\naxes: {n: [1]}\ncells: [{n: 1}]")


def test_h200_targets_dry_run(monkeypatch, capsys):
    monkeypatch.delenv("MODEL_PATH", raising=False)
    monkeypatch.delenv("SID_VOCAB_FILE", raising=False)
    path = str(REPO / "matrices" / "h200_targets.yaml")
    spec, cells = load_cells(path)
    assert len(cells) == 7 and spec.model.catalog_size == 1_500_000
    assert spec.load.rounds >= 3 and spec.load.radix == "cold" and spec.load.mode == "closed"
    assert run_cli(path, "--dry-run") == 0
    out = capsys.readouterr().out
    # the sampled n=50 cell shares the greedy one's server (temperature is a client setting)
    assert sum(line.startswith("server ") for line in out.splitlines()) == 6 and "7 cell(s)" in out
    assert "--quantization fp8 --kv-cache-dtype fp8_e4m3 --cuda-graph-max-bs 1600" in out
    assert "--cuda-graph-max-bs 4096" in out and "--max-prefill-tokens 40960" in out
    assert "--cuda-graph-max-bs 3200" in out and "requests=1280" in out  # ~300-token prompts, c=64
    assert "prompt~2465" in out and "+hf-baseline(2) mfu-ceiling=1450" in out
    assert "prompt~5000" in out and "+hf-baseline(1) mfu-ceiling=760" in out
    assert out.count("target: ") == 11 and "temperature=0.8" in out
    # every target selects the cells its goal names: the element-wise one the four FP8 cells
    # at ~2,465 and ~300 tokens (not the FP8 p=5,000 cell), the others at least one
    from harness.spec.cells import matches

    picked = {
        t.label: [c for c in cells if matches(c.id, c.params, t.cells or "")] for t in spec.targets
    }
    assert all(picked.values())
    ew = next(v for k, v in picked.items() if k.startswith("element-wise"))
    assert sorted((c.params["beam_width"], c.params["prompt_tokens"]) for c in ew) == [
        (50, 300),
        (50, 2465),
        (50, 2465),
        (512, 2465),
    ]


def test_hf_failure_is_recorded(tmp_path):
    from harness.baseline.hf import main

    job = {
        "model_path": str(tmp_path / "missing"),
        "catalog": None,
        "messages": [[{"role": "user", "content": "x"}]],
        "n": 2,
        "max_tokens": 4,
        "dtype": "float32",
        "device": "cpu",
    }
    (tmp_path / "in.json").write_text(json.dumps(job))
    assert main([str(tmp_path / "in.json"), str(tmp_path / "out.json")]) == 1
    res = json.loads((tmp_path / "out.json").read_text())
    assert res["status"] == "failed" and res["hf_error"]


@pytest.mark.skipif(
    not (REPO / "flashrec" / "server" / "app.py").is_file(),
    reason="the FlashRec server is not in this checkout",
)
def test_hf_baseline_mfu_targets_in_smoke_matrix(tmp_path, tiny_model, marker):
    """One server, two cells: n=4 gets an HF baseline, n=16 is skipped by the memory guard."""
    m = {
        "name": "hf-smoke",
        "engine": {
            "kind": "flashrec",
            "device": "cpu",
            "startup_timeout_s": 180,
            "args": {"served_model_name": marker},
        },
        "model": {"path": str(tiny_model)},
        "catalog": {"path": str(Path(tiny_model) / "catalog.json")},
        "workload": {
            "kind": "synthetic",
            "requests": 4,
            "warmup_requests": 1,
            "median_tokens": 48,
            "spread": 0.0,
            "system_prompt_tokens": 0,
        },
        "cells": [{"beam_width": 4, "concurrency": 1}, {"beam_width": 16, "concurrency": 2}],
        "axis_scope": {"beam_width": "client"},
        "load": {"rounds": 3, "radix": "cold", "max_tokens": 4, "request_timeout_s": 60},
        # tiny model: n x ~74 tokens x 2 layers x 2 x 2 heads x 16 x 4 bytes -> n=4 fits, 16 not
        "baseline": {
            "hf": {
                "requests": 1,
                "warmup": 0,
                "dtype": "float32",
                "device": "cpu",
                "max_kv_gib": 0.00015,
            }
        },
        "mfu": {"ceiling_tflops": 0.001},
        "targets": [
            {"metric": "qps", "op": ">=", "value": 1e9, "cells": "beam_width=4"},
            {"metric": "latency_p50_ms", "op": "<=", "value": 1e6},
        ],
    }
    out = tmp_path / "out"
    assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0  # targets: no fail
    rep = json.loads((out / "report.json").read_text())
    cells = {c["id"]: c for c in rep["cells"]}
    small, big = (
        cells["flashrec,beam_width=4,concurrency=1"],
        cells["flashrec,beam_width=16,concurrency=2"],
    )
    hf = small["baseline"]["hf"]
    assert hf["status"] == "ok", hf
    assert hf["hf_requests"] == 1 and hf["hf_beams"] == [4] and hf["hf_ms_per_request"] > 0
    assert hf["hf_qps"] == pytest.approx(1000 / hf["hf_ms_per_request"])
    assert hf["speedup"] == pytest.approx(small["metrics"]["qps"]["median"] / hf["hf_qps"])
    assert small["metrics"]["speedup_vs_hf"]["n"] == 3
    skipped = big["baseline"]["hf"]
    assert skipped["status"] == "skipped"
    assert "per-beam KV (16 beams x" in skipped["hf_skipped"]
    assert "> max_kv_gib 0.00015" in skipped["hf_skipped"]
    for c in (small, big):
        f = c["mfu"]
        assert f["linear_params"] == 73_728 and f["decode_forwards"] == 2
        assert f["decode_rows"] == 2 * c["params"]["beam_width"]
        assert math.isclose(f["mfu"], c["metrics"]["mfu"]["median"])
        assert f["achieved_tflops"] / 0.001 == pytest.approx(f["mfu"])
    t = rep["targets"]
    assert t["status"] == "missed" and t["fail_run"] is False
    assert t["results"][0]["checks"][0]["text"].startswith("missed by")
    assert t["results"][1]["status"] == "met"
    md = (out / "REPORT.md").read_text()
    assert "## HF transformers baseline (same run)" in md and "## Model-FLOP utilisation" in md
    assert "> max_kv_gib 0.00015" in md and "## Targets: missed" in md and "MISSED" in md
    assert "hf_speedup" in (out / "summary.csv").read_text().splitlines()[0]
    assert processes_with(marker) == []


def test_a_target_with_an_unmeasured_cell_is_partial_not_met():
    """Met where measured but a selected cell has no value (failed, or no quality eval):
    the target and the run's targets are partial, never met; with fail_run it fails."""
    rep = _report([("a", {"beam_width": 8}, {"qps": 130.0}), ("b", {"beam_width": 8}, {})])
    rep["cells"][1]["params"] = {"beam_width": 8}
    targets = [TargetSpec(metric="qps", op=">=", value=100, cells="beam_width=8")]
    res = evaluate_targets(targets, rep).to_json()
    (r,) = res["results"]
    assert r["status"] == "partial" and r["missing"] == ["b"] and r["checks"][0]["met"]
    assert res["status"] == "partial" and res["fail_run"] is False
    strict = [TargetSpec(metric="qps", op=">=", value=100, cells="beam_width=8", fail_run=True)]
    assert evaluate_targets(strict, rep).to_json()["fail_run"] is True
    rep["cells"] = rep["cells"][:1]
    assert evaluate_targets(targets, rep).to_json()["status"] == "met"


def test_a_missed_speed_target_says_what_the_traced_gpu_work_allows():
    """A traced cell whose file has the GPU work per request: a missed QPS or latency target
    also says that work and the QPS it allows with the GPU never idle (here 1.5 ms: at most
    666.7 QPS, so 800 needs less work per request); a met one, a cell without it, and a
    non-speed metric say nothing of it."""
    rep = _report(
        [
            ("a", {"beam_width": 50}, {"qps": 600.0, "error_rate": 0.02}),
            ("b", {"beam_width": 8}, {"qps": 600.0}),
        ]
    )
    work = {"gpu_ms_per_request": 1.5, "qps_at_full_busy": 666.67, "requests_in_window": 400}
    rep["cells"][0]["trace"] = {"files": [{"device": "gpu"}, work]}  # the first with it counts
    asked = (  # (metric, op, value, cells): missed, met, not a speed metric, untraced
        ("qps", ">=", 800, "beam_width=50"),
        ("qps", ">=", 500, "beam_width=50"),
        ("error_rate", "<=", 0.01, "beam_width=50"),
        ("qps", ">=", 800, "beam_width=8"),
    )
    targets = [TargetSpec(metric=m, op=o, value=v, cells=c) for m, o, v, c in asked]
    missed, met, err, untraced = (
        r["checks"][0]["text"] for r in evaluate_targets(targets, rep).to_json()["results"]
    )
    assert missed.endswith(
        "; traced GPU work 1.5 ms per request, at most 666.7 QPS with the GPU never idle"
    )
    for text in (met, err, untraced):
        assert "traced GPU work" not in text
