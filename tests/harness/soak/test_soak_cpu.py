"""``flashrec-bench soak`` against real CPU servers (tiny synthetic model): a short soak with an
engine process and two front ends passes (flat trends, 0 errors, the probe unchanged, every
process sampled); a catalog swapped mid-run changes the probe's answer and a reload of a
missing file fails: both are caught and the soak exits 1; bad flags exit 2."""

from __future__ import annotations

import csv
import json

import pytest
from bench_helpers import run_cli

SHORT = ["--duration", "30s", "--interval", "3s", "--probe-every", "3s", "--rate", "5"]


def _soak(tmp_path, model, *extra: str) -> tuple[int, dict, list[dict]]:
    out = tmp_path / "soak"
    code = run_cli("soak", "--model-path", str(model), "--device", "cpu", *SHORT, *extra,
                   "--out", str(out))  # fmt: skip
    doc = json.loads((out / "soak.json").read_text())
    with open(out / "samples.csv") as f:
        rows = list(csv.DictReader(f))
    assert (out / "REPORT.md").read_text().startswith("# Soak")
    return code, doc, rows


def test_a_short_soak_passes_flat_with_an_unchanged_probe(tmp_path, tiny_model, capsys):
    code, doc, rows = _soak(
        tmp_path, tiny_model,
        "--server-arg", "engine_process=on", "--server-arg", "api_server_count=2",
        "--every", "10s", f"update_catalog={tiny_model / 'catalog.json'}",
        "--every", "12s", "flush_cache",
    )  # fmt: skip
    assert code == 0, doc["failures"]
    assert doc["passed"] and doc["errors"] == 0 and doc["failures"] == []
    assert doc["requests"] >= 100  # 5/s for 30 s, on a loaded machine
    probe = doc["probe"]
    assert probe["changes"] == 0 and probe["errors"] == 0 and probe["sent"] >= 5
    # the same catalog reloaded twice and the cache flushed twice, each answered 200
    assert [a["action"] for a in doc["actions"]] == [
        "update_catalog", "flush_cache", "update_catalog", "flush_cache"
    ] and all(a["ok"] for a in doc["actions"])  # fmt: skip
    # a catalog reload's answer times kept beside it (flush_cache answers none)
    reload = doc["actions"][0]["timings_ms"]
    assert {"load_ms", "build_ms", "swap_ms", "swap_wait_ms", "release_ms"} <= set(reload), reload
    assert doc["actions"][1]["timings_ms"] == {}
    # and the phase of the reload its slowest request started in, counted back from the answer
    around = doc["around_actions"][0]["during"]
    assert around["requests"] > 0 and around["slowest_phase"] in {
        "before", "load", "build", "swap_wait", "release"
    }, around  # fmt: skip
    assert "slowest_phase" not in doc["around_actions"][1]["during"]  # a flush has no phases
    assert all(t["verdict"] != "grows" for t in doc["trends"])
    assert {t["resource"].split("[")[0] for t in doc["trends"]} >= {
        "rss_mib", "fds", "conns", "fds_other", "threads", "processes", "slots_used",
        "kv_tokens_used", "p99_ms",
    }  # fmt: skip
    # every process of the group, named by its role: two front ends and the engine
    roles = {name for name in doc["processes"].values()}
    assert {"frontend-0", "frontend-1", "engine"} <= roles, roles
    assert len(rows) >= 8 and rows[-1]["final"] == "1" and rows[0]["warmup"] == "1"
    engine_col = [c for c in rows[0] if c.startswith("rss_mib[engine-")]
    assert engine_col and float(rows[-1][engine_col[0]]) > 10  # MiB: a live process
    assert doc["idle_after"] == {k: 0.0 for k in doc["idle_after"]}
    out = capsys.readouterr().out
    assert out.count("probe ok") >= len(rows) - 1  # one progress line per interval
    assert "0 errors, probe unchanged" in out and ": PASS" in out


def test_a_swapped_catalog_and_a_failed_action_are_caught(
    tmp_path, tiny_model, synth_model, capsys
):
    other = synth_model("tiny", catalog_size=500, seed=1) / "catalog.json"
    code, doc, _ = _soak(
        tmp_path, tiny_model,
        "--every", "12s", f"update_catalog={other}",
        "--every", "20s", f"update_catalog={tmp_path / 'nowhere.json'}",
    )  # fmt: skip
    assert code == 1 and not doc["passed"]
    changes = doc["probe"]["change_log"]
    assert changes and changes[0]["t_s"] >= 12  # seen after the swap, never before
    assert any(line.startswith("catalog_hash") for line in changes[0]["diff"])
    failed = [a for a in doc["actions"] if not a["ok"]]
    assert failed and "HTTP 400" in failed[0]["detail"] and doc["errors"] >= 1
    assert any("probe's answer changed" in f for f in doc["failures"])
    assert any("error(s)" in f for f in doc["failures"])
    assert ": FAIL" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--duration", "soon"],
        ["--duration", "30s", "--every", "10s", "restart"],
        ["--duration", "30s", "--every", "10s", "update_catalog"],
        ["--duration", "30s", "--tolerance", "rss=1"],
        ["--duration", "30s", "--warmup", "1m"],
        ["--duration", "30s", "--rate", "0"],
    ],
)
def test_bad_flags_exit_2_before_any_server_starts(argv, tmp_path, capsys):
    out = tmp_path / "never"
    try:
        code = run_cli("soak", "--model-path", str(tmp_path), *argv, "--out", str(out))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2 and not out.exists()


def test_pgid_without_url_is_refused(tmp_path):
    code = run_cli("soak", "--model-path", str(tmp_path), "--pgid", "1", "--duration", "30s")
    assert code == 2


def test_an_interrupted_soak_writes_its_report_and_exits_130(fake_url, tmp_path):
    """``--url`` (an external server, here the harness's fake one, its processes unsampled):
    Ctrl-C after the first rows stops the load; the report of what ran is written and says
    it was interrupted."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "soak"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "soak", "--url", fake_url, "--duration", "10m",
         "--interval", "1s", "--probe-every", "1s", "--rate", "4", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (out / "samples.csv").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.5)
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, text
    doc = json.loads((out / "soak.json").read_text())
    assert doc["summary"].endswith("INTERRUPTED") and doc["requests"] >= 4
    assert any(f.startswith("interrupted after") for f in doc["failures"])
    assert doc["meta"]["process_group"] is None and "processes" not in doc["samples"][0]
    assert "probe ok" in text
