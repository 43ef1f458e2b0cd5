"""CLI wiring and docs that must match the code."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from flashrec.cli import build_parser
from flashrec.config import EngineConfig, ServerConfig

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_docs_are_fresh():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_config_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_every_config_field_is_a_flag():
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    serve_flags = {o for a in sub["serve"]._actions for o in a.option_strings}
    gen_flags = {o for a in sub["generate"]._actions for o in a.option_strings}
    for f in dataclasses.fields(ServerConfig):
        assert "--" + f.name.replace("_", "-") in serve_flags
    for f in dataclasses.fields(EngineConfig):
        assert "--" + f.name.replace("_", "-") in gen_flags


def test_generate_json_cli_and_aliases(tiny_model):
    cmd = [
        sys.executable,
        "-m",
        "flashrec",
        "--model-path",
        str(tiny_model),
        "--sid-vocab-file",
        str(tiny_model / "catalog.json"),
        "--prompt",
        "hello",
        "--beam-width",
        "5",
        "--max-tokens",
        "5",
        "--json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    assert len(res["choices"]) == 5
    assert set(res["choices"][0]) == {
        "index",
        "text",
        "output_ids",
        "sequence_score",
        "cum_logprob",
        "finish_reason",
    }
    assert res["choices"][0]["finish_reason"] == "stop"
    scores = [c["sequence_score"] for c in res["choices"]]
    assert scores == sorted(scores, reverse=True)
    assert res["usage"]["completion_tokens"] == sum(len(c["output_ids"]) for c in res["choices"])


def test_check_env_reports_and_fails_for_missing_gpu():
    ok = subprocess.run(
        [sys.executable, "-m", "flashrec.check_env"], capture_output=True, text=True
    )
    assert ok.returncode == 0 and "torch" in ok.stdout
    import torch

    if not torch.cuda.is_available():
        bad = subprocess.run(
            [sys.executable, "-m", "flashrec.check_env", "--require", "gpu"],
            capture_output=True,
            text=True,
        )
        assert bad.returncode == 1 and "MISSING: gpu" in bad.stdout


def test_bad_input_ids_clear_error(tiny_model):
    cmd = [
        sys.executable,
        "-m",
        "flashrec",
        "generate",
        "--model-path",
        str(tiny_model),
        "--input-ids",
        "1,999999",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 2 and "out of vocabulary" in r.stderr


def test_serve_help_prints_every_field_help_verbatim():
    """argparse formats help strings with %: a literal % (e.g. '4%') must come out as is."""
    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
    raw = sub["serve"].format_help()
    assert "option_strings" not in raw  # what '% a' expands to: the argparse action's dict
    text = "".join(raw.split())  # wrapped lines may break at a hyphen
    for f in dataclasses.fields(ServerConfig):
        want = "".join(f.metadata["help"].split())
        assert want in text, f.name


def test_a_literal_percent_in_help_comes_out_as_is():
    """add_config_args escapes % for argparse: a help with '4%' prints '4%', not an error."""
    import argparse

    from flashrec.config import add_config_args

    @dataclasses.dataclass(frozen=True)
    class Knobs:
        share: float = dataclasses.field(default=0.5, metadata={"help": "at most 4% of rows"})

    parser = argparse.ArgumentParser()
    add_config_args(parser, Knobs)
    assert "at most 4% of rows" in " ".join(parser.format_help().split())


def test_env_choice_reads_and_refuses(monkeypatch):
    from flashrec.config.flags import env_choice

    monkeypatch.delenv("FLASHREC_TEST_KNOB", raising=False)
    assert env_choice("FLASHREC_TEST_KNOB", "a", ("a", "b")) == "a"
    monkeypatch.setenv("FLASHREC_TEST_KNOB", "b")
    assert env_choice("FLASHREC_TEST_KNOB", "a", ("a", "b")) == "b"
    monkeypatch.setenv("FLASHREC_TEST_KNOB", "c")
    try:
        env_choice("FLASHREC_TEST_KNOB", "a", ("a", "b", "d"))
    except ValueError as exc:
        assert str(exc) == "FLASHREC_TEST_KNOB must be a, b or d, got 'c'"
    else:
        raise AssertionError("an unknown value was accepted")
