"""A job run by a child interpreter: ``python -m MODULE`` as a plain subprocess (a daemonic
engine process may start one; never a fork of a process holding threads and CUDA), the job as
JSON on its stdin, its answer as the last JSON line of its stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])  # the directory holding flashrec/


def run_json_child(module: str, job: dict[str, Any], what: str) -> dict[str, Any]:
    """The child's answer (``{"error", "message"}`` when it refused the job); ValueError
    naming ``what`` when it died or answered nothing."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", module],
        input=json.dumps(job), capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise ValueError(f"{what} process failed (exit {proc.returncode}): {tail[0]}") from None
