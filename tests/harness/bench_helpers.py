"""Helpers for the harness tests: the fake server, matrices, process checks."""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
FAKE = str(HERE / "fake_server.py")
REPO = HERE.parent.parent


def fake_engine(*args: str, name: str = "fake", **extra) -> dict:
    """An ``engine:`` section that launches the fake server with ``args``."""
    return {
        "name": name,
        "kind": "command",
        "command": ["python", FAKE, *args],
        "startup_timeout_s": 20,
        "stop_timeout_s": 5,
        **extra,
    }


def fake_catalog(tmp_path: Path, size: int = 60) -> Path:
    """A catalog file (list-of-lists JSON) of ``size`` 3-level SIDs: a fake server given it
    (``--sid-vocab-file``) answers only these, and a matrix given it (``catalog: {path}``)
    checks every beam against them."""
    import json

    path = tmp_path / "fake_catalog.json"
    path.write_text(json.dumps([[i % 8, i // 8 % 8, i] for i in range(size)]))
    return path


def write_matrix(tmp_path: Path, matrix: dict, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    return path


def base_matrix(engine: dict, **overrides) -> dict:
    """A small fast matrix on the fake server (lorem prompts, 3 rounds of 10 requests)."""
    m = {
        "name": "test",
        "engine": engine,
        "workload": {
            "kind": "lorem",
            "requests": 10,
            "warmup_requests": 3,
            "median_tokens": 30,
            "system_prompt_tokens": 10,
        },
        "load": {"rounds": 3, "beam_width": 4, "request_timeout_s": 10},
        "trace": {"cells": "none", "settle_s": 0.3, "timeout_s": 20},
    }
    m.update(overrides)
    return m


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z" and "pytest" not in cmd:
            out.append(int(entry.name))
    return out


def run_cli(*argv: str) -> int:
    """Run ``flashrec-bench`` in-process."""
    from harness.cli import main

    return main(list(argv))
