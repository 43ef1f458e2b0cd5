"""A misspelled name in a matrix is reported at its own line with the closest known name: an
axis (or link, cell entry, engine arg) that is neither a client setting nor a ``flashrec serve``
flag, and an unknown key of any section."""

from __future__ import annotations

import pytest

from harness.spec.load import load_cells
from harness.spec.matrix import SpecError

HEAD = """\
# a matrix with a comment first, so that line 1 is not
# where any of its fields is
name: hints
"""
FLASHREC = HEAD + "engine: {name: fr, kind: flashrec, device: cpu}\nmodel: {preset: tiny}\n"


def _error(tmp_path, text: str) -> SpecError:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_cells(str(path))
    return info.value


@pytest.mark.parametrize(
    ("body", "line", "field", "what"),
    [
        ("axes:\n  beam_width: [4]\n  concurency: [1, 4]\n", 8, "axes.concurency", "axis"),
        ("axes:\n  beam_width: [4]\nlink:\n  concurency: '2 * beam_width'\n", 9,
         "link.concurency", "link"),
        ("cells:\n  - {beam_width: 4}\n  - {beam_width: 4, concurency: 4}\n", 8,
         "cells.1.concurency", "cell parameter"),
    ],
)  # fmt: skip
def test_misspelled_client_setting_is_named_at_its_line_with_the_close_match(
    tmp_path, body, line, field, what
):
    """``concurency`` is no client setting, so it was taken for a server flag and failed as
    "flashrec serve: unrecognized arguments" at line 1 (the document); now at its own line."""
    err = _error(tmp_path, FLASHREC + body)
    assert (err.line, err.field) == (line, field), str(err)
    assert f"{what} 'concurency' is neither a client setting nor a flashrec serve flag" in (
        err.message
    )
    assert "did you mean 'concurrency'?" in err.message
    assert str(err).startswith(f"{tmp_path / 'm.yaml'}:{line}: {field}: ")


def test_misspelled_engine_arg_is_named_at_its_line(tmp_path):
    text = FLASHREC.replace("device: cpu}", "device: cpu, args: {batch_slts: 8}}")
    err = _error(tmp_path, text + "axes:\n  beam_width: [4]\n")
    assert (err.line, err.field) == (4, "engine.args.batch_slts"), str(err)
    assert "did you mean 'batch_slots'?" in err.message


def test_server_axis_with_only_external_engines_is_an_error_not_dropped(tmp_path):
    """An external server takes client settings only: a server-scope axis would be dropped
    from every cell, so a misspelled ``concurency`` silently measured concurrency 1 once."""
    text = HEAD + (
        "engine: {kind: external, url: 'http://127.0.0.1:1'}\n"
        "axes:\n  beam_width: [4]\n  concurency: [1, 4]\n"
    )
    err = _error(tmp_path, text)
    assert (err.line, err.field) == (7, "axes.concurency"), str(err)
    assert "did you mean 'concurrency'?" in err.message
    assert "no engine launches a server" in err.message


def test_unknown_key_is_named_at_the_key_line_with_the_close_match(tmp_path):
    """A section key whose value is a block below it is reported at the key's line, not the
    first line of its value."""
    text = HEAD + (
        "engine: {kind: external, url: 'http://127.0.0.1:1'}\n"
        "loda:\n  rounds: 3\n"
        "gates:\n  - {metric: qps, op: '>', value: 1, requird: true}\n"
    )
    err = _error(tmp_path, text)
    issues = {(err.line, err.field, err.message), *err.more}
    assert (5, "loda", "Extra inputs are not permitted (did you mean 'load'?)") in issues, issues
    assert (8, "gates.0.requird", "Extra inputs are not permitted (did you mean 'required'?)") in (
        issues
    ), issues
