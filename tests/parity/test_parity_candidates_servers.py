"""``pytest -m parity``: the ``candidates:`` stage against a real launched float32 HF
reference on the tiny synthetic model: FlashRec float32 agrees exactly, a bf16 FlashRec and
HF bf16 report their distance, a planted worse candidate fails no_worse_than; and a CPU copy
of matrices/h200_parity_fp32.yaml runs end to end through flashrec-bench."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from perturb_proxy import PerturbProxy

from harness.parity import precision_args, run_parity_stage
from harness.parity.servers import one_server

# these launch their own servers: a run pointed at external ones (SGLANG_BEAM_URL) is about those
pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(
        bool(os.environ.get("SGLANG_BEAM_URL")), reason="SGLANG_BEAM_URL: external servers"
    ),
]
REPO = Path(__file__).resolve().parents[2]
NS = [1, 4, 16]


def test_candidates_against_an_fp32_reference(synth_model, tmp_path):
    path = synth_model("tiny", catalog_size=2000)
    catalog = str(path / "catalog.json")
    fp32 = precision_args("float32")[0]
    log = tmp_path / "perturbed-backend.log"
    with one_server("candidate", fp32, str(path), catalog, log, "cpu") as (backend, _):
        with PerturbProxy(backend) as proxy:
            spec = {
                "device": "cpu", "reference_dtype": "float32", "ns": NS, "prompts": 2,
                "protocols": ["chat"], "startup_timeout_s": 300, "timeout_s": 120,
                "candidates": [
                    {"name": "flashrec-fp32", "dtype": "float32", "no_worse_than": "hf-bf16"},
                    {"name": "flashrec-bf16", "dtype": "bfloat16", "gate": False},
                    {"name": "hf-bf16", "kind": "reference", "dtype": "bfloat16"},
                    {"name": "perturbed", "url": proxy.url, "gate": False,
                     "no_worse_than": "hf-bf16"},
                ],
            }  # fmt: skip
            lines: list[str] = []
            res = run_parity_stage(spec, str(path), catalog, tmp_path / "out", log=lines.append)
            perturbed = proxy.perturbed
    # each server's cases end with a progress line (6 = 2 prompts x 3 ns)
    for label in ("reference (float32)", "flashrec-fp32", "flashrec-bf16", "hf-bf16", "perturbed"):
        assert any(ln.startswith(f"parity: {label}: 6/6 cases, ") for ln in lines), (label, lines)
    assert res["status"] == "fail", res.get("error")
    saved = json.loads((tmp_path / "out" / "parity.json").read_text())
    assert saved["table"] == res["table"] and saved["reference"]["dtype"] == "float32"
    # the reference server says how it searched: on CPU, HF generate over the whole prompt
    assert (saved["reference"]["search"], saved["reference"]["prefill_chunk"]) == ("generate", 0)
    rows = {(r["candidate"], r["n"]): r for r in res["table"]}
    assert len(rows) == 4 * len(NS) and all(
        r["cases"] == 2 and r["errors"] == 0 for r in rows.values()
    )
    # FlashRec float32 against the float32 HF reference: the same ranked beams
    for n in NS:
        r = rows[("flashrec-fp32", n)]
        assert r["exact_rate"] == 1.0 and r["top1_agreement"] == 1.0 and r["overlap_mean"] == 1.0
        assert r["max_score_diff"] <= 1e-4
    # the bf16 engines report how far from fp32 they are (rounding moves every score)
    for name in ("flashrec-bf16", "hf-bf16"):
        assert max(rows[(name, n)]["max_score_diff"] for n in NS) > 1e-4
    cands = {c["name"]: c for c in res["candidates"]}
    assert cands["flashrec-fp32"]["passed"] and cands["flashrec-fp32"]["args"]["dtype"] == "float32"
    assert cands["hf-bf16"]["engine"] == "hf-reference" and not cands["hf-bf16"]["gate"]
    # the rule: fp32 FlashRec is at least as close as HF bf16; the perturbed proxy is not
    good = [c for c in res["rules"] if c["candidate"] == "flashrec-fp32"]
    assert len(good) == 2 * len(NS) and all(c["passed"] and c["margin"] >= 0 for c in good)
    bad = [c for c in res["rules"] if c["candidate"] == "perturbed" and not c["passed"]]
    assert perturbed > 0 and {(c["n"], c["metric"]) for c in bad} == {
        (4, "top1_agreement"),
        (16, "top1_agreement"),
    }
    assert all(c["value"] == 0.0 and c["margin"] == -c["other"] < 0 for c in bad)
    assert res["failures"] and all(f.startswith("perturbed no_worse_than") for f in res["failures"])


def test_cpu_copy_of_the_h200_matrix(synth_model, tmp_path):
    """The H200 matrix with only its size and device changed (tiny preset, CPU, 2 prompts,
    n 1 / 4 / 16) runs its cell and the three-candidate parity stage end to end."""
    from harness.cli import main

    m = yaml.safe_load((REPO / "matrices" / "h200_parity_fp32.yaml").read_text())
    m["engine"].update(device="cpu", startup_timeout_s=300)
    m["model"].update(path="", preset="tiny", dtype="float32", catalog_size=2000)
    m["model"]["cache_dir"] = str(tmp_path / "models")
    m.pop("catalog")
    m["workload"].update(requests=4, warmup_requests=1, median_tokens=64, system_prompt_tokens=16)
    m["axes"] = {"beam_width": [4], "concurrency": [1]}
    m["parity"].update(ns=NS, prompts=2, median_tokens=64, system_prompt_tokens=16,
                       startup_timeout_s=300, timeout_s=120)  # fmt: skip
    # bf16 on a tiny random model may miss the bf16 thresholds: the run must still finish
    m["gates"] = [g for g in m["gates"] if g.get("path") != "parity.passed"]
    matrix = tmp_path / "cpu.yaml"
    matrix.write_text(yaml.safe_dump(m))
    assert main([str(matrix), "--out", str(tmp_path / "run")]) == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    parity = report["parity"]
    assert parity["status"] in ("pass", "fail"), parity.get("error")
    assert [(r["candidate"], r["n"]) for r in parity["table"]] == [
        (c, n) for c in ("flashrec-bf16", "flashrec-fp8", "hf-bf16") for n in NS
    ]
    assert all(r["cases"] == 2 and r["errors"] == 0 for r in parity["table"])
    assert {(c["candidate"], c["than"]) for c in parity["rules"]} == {("flashrec-bf16", "hf-bf16")}
    md = (tmp_path / "run" / "REPORT.md").read_text()
    assert "### against the float32 reference" in md and "| flashrec-fp8 | fp8 | 16 | 2 | 0 |" in md
    # --resume (a call's time limit ended the stage): the finished cell and every server's
    # saved answers are read back, nothing is launched, the table is the same
    assert main([str(matrix), "--out", str(tmp_path / "run"), "--resume"]) == 0
    again = json.loads((tmp_path / "run" / "parity" / "parity.json").read_text())
    assert again["resumed"] == ["flashrec-bf16", "flashrec-fp8", "hf-bf16", "reference"]
    assert again["table"] == parity["table"]


def test_resume_reads_back_the_servers_that_answered(synth_model, tmp_path):
    """An interrupted stage (the last candidate's answers never written) rerun with resume:
    the reference and the finished candidate are read back, not launched; only the missing
    one runs; the table is the uninterrupted run's. Without resume, or with other cases,
    every server is asked again."""
    path = synth_model("tiny", catalog_size=2000)
    catalog = str(path / "catalog.json")
    spec = {
        "device": "cpu", "reference_dtype": "float32", "ns": [1, 4], "prompts": 2,
        "median_tokens": 24, "system_prompt_tokens": 8, "protocols": ["chat"],
        "candidates": [
            {"name": "flashrec-fp32", "dtype": "float32"},
            {"name": "hf-bf16", "kind": "reference", "dtype": "bfloat16", "gate": False},
        ],
    }  # fmt: skip
    out = tmp_path / "out"

    def run(resume: bool, **changes):
        lines: list[str] = []
        res = run_parity_stage({**spec, **changes}, str(path), catalog, out, lines.append, resume)
        return res, [ln for ln in lines if "read back" in ln]

    first, read = run(False)
    assert first["status"] == "pass" and read == [] and "resumed" not in first
    (out / "answers" / "hf-bf16.json").unlink()  # the run stopped while hf-bf16 answered
    (out / "servers" / "hf-bf16.log").unlink()
    again, read = run(True)
    assert [ln.split(":")[1].strip() for ln in read] == ["reference (float32)", "flashrec-fp32"]
    assert again["resumed"] == ["flashrec-fp32", "reference"]
    assert (out / "servers" / "hf-bf16.log").is_file()  # launched again, alone
    assert again["table"] == first["table"] and again["status"] == "pass"
    verdicts = {c["name"]: c for c in again["candidates"]}
    assert verdicts["flashrec-fp32"]["resumed"] and not verdicts["hf-bf16"].get("resumed")
    md_lines = []
    from harness.report.render_stages import parity_blocks

    for title, (_, rows) in parity_blocks(again):
        md_lines += [" | ".join(r) for r in rows] if title == "candidates" else []
    assert any("read back by --resume" in ln and ln.startswith("flashrec-fp32") for ln in md_lines)
    _, read = run(False)  # a fresh run asks everyone
    assert read == []
    _, read = run(True, ns=[1, 2])  # other cases: nothing to read back
    assert read == []


def test_reference_server_search_flag(synth_model, tmp_path):
    """``reference-server --search shared`` on CPU (where the default is generate): its
    /get_server_info says so, and over HTTP it answers HF generate's ranked beams."""
    import asyncio

    import aiohttp

    from harness.parity.fetch import fetch_beams, request_for
    from harness.servers.hf_reference import HFReference

    path = synth_model("tiny", catalog_size=2000)
    catalog = str(path / "catalog.json")
    msgs = [{"role": "user", "content": "watched " + ", ".join(map(str, range(60)))}]
    hf = HFReference(str(path), catalog, search="generate")
    want = hf.generate(hf.build_prompt(messages=msgs), 16)

    async def ask(url: str):
        async with aiohttp.ClientSession() as session:
            return await fetch_beams(session, url, "chat", request_for(msgs, None, 16, 4), 120)

    log = tmp_path / "reference.log"
    with one_server("reference", {"search": "shared"}, str(path), catalog, log, "cpu") as (
        url,
        info,
    ):
        assert (info["search"], info["prefill_chunk"]) == ("shared", 0)
        got = asyncio.run(ask(url))
    assert [list(b.token_ids) for b in got] == [b.token_ids for b in want] and len(got) == 16
    assert max(abs(b.score - w.sequence_score) for b, w in zip(got, want)) <= 1e-4
