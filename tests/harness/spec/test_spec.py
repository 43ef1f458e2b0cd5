"""harness.spec.matrix: YAML -> MatrixSpec, errors with file, line and field."""

from __future__ import annotations

import pytest

from harness.spec.load import load_cells
from harness.spec.matrix import SpecError, load_spec, parse_spec

GOOD = """\
name: t
engine: {kind: external, url: "http://127.0.0.1:1", protocol: generate}
axes:
  beam_width: [4, 16]
  concurrency: [1, 4]
load: {rounds: 3}
"""


def test_valid_spec_parses():
    spec, locations = parse_spec(GOOD, "m.yaml")
    assert spec.engine_list[0].protocol == "generate"
    assert spec.axes == {"beam_width": [4, 16], "concurrency": [1, 4]}
    assert spec.load.rounds == 3 and spec.load.radix == "warm"
    assert locations[("load", "rounds")] == 6


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        (GOOD.replace("rounds: 3", "rounds: three"), 6, "load.rounds", "valid integer"),
        (GOOD.replace("rounds: 3", "roundz: 3"), 6, "load.roundz", "Extra inputs"),
        (GOOD + "load: {rounds: 2}\n", 7, "load", "duplicate key"),
        (GOOD.replace("concurrency: [1, 4]", "concurrency: []"), 1, "", "no values"),
        (GOOD.replace("protocol: generate", "protocol: grpc"), 2, "engine.protocol", "chat"),
        (GOOD + "gates:\n  - {metric: qps}\n", 8, "gates.0", "op"),
        (GOOD + "trace: {cells: [x], num_steps: 0}\n", 7, "trace.num_steps", "greater"),
        (GOOD + "trace: {cells: [x], spans: [a, a]}\n", 7, "trace.spans", "no blanks or repeats"),
        (GOOD + "trace: {cells: [x], spans: [' ']}\n", 7, "trace.spans", "no blanks or repeats"),
        (GOOD.replace("axes:", "axes: [\n"), 6, "", "expected"),
    ],
)
def test_errors_name_file_line_and_field(text, line, field, words):
    with pytest.raises(SpecError) as info:
        parse_spec(text, "m.yaml")
    err = info.value
    assert err.file == "m.yaml"
    assert err.line == line, str(err)
    assert err.field == field, str(err)
    assert words in str(err)
    assert str(err).startswith(f"m.yaml:{line}:")


def test_all_validation_errors_are_reported():
    text = GOOD.replace("rounds: 3", "rounds: 0, concurrency: x")
    with pytest.raises(SpecError) as info:
        parse_spec(text, "m.yaml")
    msg = str(info.value)
    assert "load.rounds" in msg and "load.concurrency" in msg


def test_env_vars_expand_with_defaults(monkeypatch):
    monkeypatch.setenv("HB_URL", "http://example:9")
    text = (
        GOOD.replace('"http://127.0.0.1:1"', '"${HB_URL}"')
        + "model: {path: '${HB_NOPE:-}', preset: tiny}\n"
    )
    spec, _ = parse_spec(text)
    assert spec.engine.url == "http://example:9"
    assert spec.model.path is None and spec.model.preset == "tiny"


def test_unset_env_var_is_an_error():
    text = GOOD + "model:\n  path: ${HB_SURELY_UNSET}\n"
    with pytest.raises(SpecError) as info:
        parse_spec(text, "m.yaml")
    assert info.value.line == 8 and info.value.field == "model.path"
    assert "HB_SURELY_UNSET" in str(info.value)


def test_flashrec_engine_needs_a_model():
    with pytest.raises(SpecError, match="need 'model'"):
        parse_spec("engine: {kind: flashrec}\n")


def test_engine_kind_requirements():
    with pytest.raises(SpecError, match="needs 'command"):
        parse_spec("engine: {kind: command}\n")
    with pytest.raises(SpecError, match="needs 'url"):
        parse_spec("engine: {kind: external}\n")
    with pytest.raises(SpecError, match="exactly one of 'engine' or 'engines'"):
        parse_spec("load: {rounds: 2}\n")


def test_link_and_exclude_errors_have_lines(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(GOOD + "link:\n  batch_slots: '16 * beam_widht'\n")
    with pytest.raises(SpecError) as info:
        load_cells(str(path))
    assert info.value.line == 8 and info.value.field == "link.batch_slots"
    assert "unknown name 'beam_widht'" in str(info.value)
    path.write_text(GOOD + "exclude:\n  - {beam_width: 4}\n  - {concurency: 4}\n")
    with pytest.raises(SpecError) as info:
        load_cells(str(path))
    assert info.value.line == 9 and info.value.field == "exclude.1.concurency"


def test_missing_file():
    with pytest.raises(SpecError, match="no such matrix file"):
        load_spec("/nonexistent/m.yaml")


def test_shipped_matrices_are_valid(monkeypatch):
    from pathlib import Path

    monkeypatch.delenv("MODEL_PATH", raising=False)
    root = Path(__file__).resolve().parents[3] / "matrices"
    files = sorted(root.rglob("*.yaml"))  # the standing matrices and experiments/
    assert {f.name for f in files} >= {
        "smoke_cpu.yaml",
        "onerec_fp8.yaml",
        "wide_beam.yaml",
        "sid_gr_latency.yaml",
        "ci_gate.yaml",
        "h200_targets.yaml",
    }
    for f in files:
        spec, cells = load_cells(str(f))
        assert cells, f
