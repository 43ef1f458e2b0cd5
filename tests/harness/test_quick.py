"""``flashrec-bench quick``: one benchmark from flags -> OUT/matrix.yaml -> the usual run."""

from __future__ import annotations

import json

import pytest
import yaml
from bench_helpers import run_cli

from harness.spec.matrix import parse_spec


def test_print_matrix_is_the_matrix_the_flags_describe(capsys):
    argv = ["--url", "http://127.0.0.1:9", "--beam-width", "50,100", "--concurrency", "1,8",
            "--prompt-tokens", "1000", "--radix", "warm", "--print-matrix"]  # fmt: skip
    assert run_cli("quick", *argv) == 0
    text = capsys.readouterr().out
    spec, _ = parse_spec(text)
    assert spec.engine.kind == "external" and spec.engine.url == "http://127.0.0.1:9"
    m = yaml.safe_load(text)
    assert m["axes"] == {"beam_width": [50, 100], "concurrency": [1, 8]}
    assert m["workload"]["median_tokens"] == 1000 and m["load"]["radix"] == "warm"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--url", "http://h:1", "--server-arg", "quantization=fp8"], "need --model-path"),
        (["--url", "http://h:1", "--beam-width", "0"], "integers >= 1"),
        (["--url", "http://h:1", "--beam-width", "fifty"], "expected integers"),
        (["--url", "http://h:1", "--requests", "0"], "--requests must be >= 1"),
        (["--model-path", "/nonexistent/model", "--print-matrix"], None),  # checked at run time
        ([], "one of the arguments --url --model-path is required"),
    ],
)
def test_bad_flags_exit_2_and_say_why(capsys, argv, needle):
    try:
        code = run_cli("quick", *argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err
    if needle is None:
        assert code == 0
    else:
        assert code == 2 and needle in err, err


@pytest.mark.parametrize("protocol", ["chat", "generate"])
def test_quick_run_against_a_server_writes_a_rerunnable_matrix(tmp_path, fake_url, protocol):
    out = tmp_path / "q"
    argv = ["--url", fake_url, "--beam-width", "4", "--concurrency", "1,2", "--requests", "6",
            "--warmup", "2", "--prompt-tokens", "40", "--timeout-s", "10", "--out", str(out),
            "--protocol", protocol]  # fmt: skip
    assert run_cli("quick", *argv) == 0
    assert yaml.safe_load((out / "matrix.yaml").read_text())["engine"]["protocol"] == protocol
    rep = json.loads((out / "report.json").read_text())
    cells = {c["id"]: c for c in rep["cells"]}
    assert sorted(cells) == [
        "server,beam_width=4,concurrency=1",
        "server,beam_width=4,concurrency=2",
    ]
    for c in cells.values():
        assert c["status"] == "ok" and c["metrics"]["qps"]["n"] == 3
        assert c["metrics"]["beams_mean"]["median"] == 4
    # no --catalog: invalid SIDs were not checked, so that gate has no data (never a pass)
    gates = {g["name"]: g for g in rep["gates"]["results"]}
    assert gates["no-errors"]["status"] == "pass"
    assert gates["no-invalid-sids"]["status"] == "no_data" and rep["gates"]["status"] == "no_data"
    # the written matrix is an ordinary matrix: it runs again as it is
    again = tmp_path / "again"
    assert run_cli(str(out / "matrix.yaml"), "--out", str(again), "--rounds", "1") == 0
    assert json.loads((again / "report.json").read_text())["summary"]["ok"] == 2


def test_quick_launches_flashrec_on_a_model_path(tmp_path, tiny_model, marker):
    """--model-path: a FlashRec server launched on the checkpoint (its catalog.json found),
    the --server-arg flags passed to it, torn down after."""
    from bench_helpers import processes_with

    out = tmp_path / "q"
    argv = ["--model-path", str(tiny_model), "--device", "cpu", "--beam-width", "4",
            "--requests", "4", "--warmup", "1", "--prompt-tokens", "48",
            "--server-arg", "batch_slots=8", "--server-arg", f"served-model-name={marker}",
            "--out", str(out)]  # fmt: skip
    assert run_cli("quick", *argv) == 0
    m = yaml.safe_load((out / "matrix.yaml").read_text())
    assert m["catalog"]["path"].endswith("catalog.json")
    assert m["engine"]["args"] == {"batch_slots": 8, "served_model_name": marker}
    (cell,) = json.loads((out / "report.json").read_text())["cells"]
    assert cell["status"] == "ok" and cell["metrics"]["invalid_rate"]["median"] == 0
    assert cell["server"]["info"]["config"]["batch_slots"] == 8
    assert processes_with(marker) == []


def test_quick_on_a_model_without_a_catalog_does_not_pass_invalid_sids(tmp_path, synth_model):
    """The reproducer: a tiny model synthesised without a catalog serves unconstrained; quick
    on it shows invalid SIDs as '-' (not 0.0%) and the no-invalid-sids gate as no_data with
    the reason, not pass; the error gate, which was checked, still passes."""
    model = synth_model("tiny")
    assert not (model / "catalog.json").exists()
    out = tmp_path / "q"
    argv = ["--model-path", str(model), "--device", "cpu", "--beam-width", "4",
            "--requests", "4", "--warmup", "1", "--rounds", "1", "--prompt-tokens", "48",
            "--out", str(out)]  # fmt: skip
    assert run_cli("quick", *argv) == 0
    assert "catalog" not in yaml.safe_load((out / "matrix.yaml").read_text())
    rep = json.loads((out / "report.json").read_text())
    (cell,) = rep["cells"]
    assert cell["status"] == "ok" and "invalid_rate" not in cell["metrics"]
    assert "no catalog" in cell["unchecked"]["invalid_rate"]
    gates = {g["name"]: g for g in rep["gates"]["results"]}
    assert gates["no-invalid-sids"]["status"] == "no_data"
    assert "no catalog: invalid SIDs not checked" in gates["no-invalid-sids"]["reason"]
    assert gates["no-errors"]["status"] == "pass"
    md = (out / "REPORT.md").read_text()
    assert "| no-invalid-sids | no_data | no catalog: invalid SIDs not checked" in md
    assert "no-invalid-sids | pass" not in md
    lines = md.splitlines()
    head = next(i for i, line in enumerate(lines) if "| invalid SIDs |" in line)
    cols, row = [x.strip() for x in lines[head].split("|")], lines[head + 2]
    assert row.startswith(f"| {cell['id']} |")
    assert [x.strip() for x in row.split("|")][cols.index("invalid SIDs")] == "-"


def test_help_shows_the_defaults(capsys):
    """--help states what an unset flag means (a 2,465-token prompt is not a guess a new user
    makes), and the defaults shown are the ones the matrix gets."""
    from harness.cli.quick import parser
    from harness.quick import build_matrix

    with pytest.raises(SystemExit):
        run_cli("quick", "--help")
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: 2465)", "(default: 50)", "(default: 1)", "(default: 64)",
                  "(default: cold)", "(default: chat)", "(default: 4)"):  # fmt: skip
        assert shown in text, shown
    assert "(default: None)" not in text and "(default: False)" not in text
    m = build_matrix(parser().parse_args(["--url", "http://h:1"]))
    assert m["workload"]["median_tokens"] == 2465 and m["workload"]["requests"] == 64
    assert m["axes"] == {"beam_width": [50], "concurrency": [1]} and m["load"]["radix"] == "cold"


def test_quick_whose_every_cell_failed_never_says_gates_pass(tmp_path, capsys):
    """Nothing listens on the URL: the one cell fails, the gates had nothing to check
    (``no_data``), and the run exits 3 saying so, not "gates pass"."""
    from harness.servers.launch import free_port

    out = tmp_path / "q"
    argv = ["--url", f"http://127.0.0.1:{free_port()}", "--beam-width", "4", "--requests", "2",
            "--warmup", "1", "--rounds", "1", "--prompt-tokens", "20", "--timeout-s", "2",
            "--out", str(out)]  # fmt: skip
    assert run_cli("quick", *argv) == 3
    err = capsys.readouterr().err
    assert "gates no_data" in err and "gates pass" not in err
    rep = json.loads((out / "report.json").read_text())
    assert rep["summary"]["failed"] == 1 and rep["gates"]["status"] == "no_data"
    assert {g["status"] for g in rep["gates"]["results"]} == {"no_data"}
