"""Loading and running a script of ``scripts/probes`` from its CPU tests."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_probe(name: str):
    """``scripts/probes/NAME.py`` as a module (its helpers, without running ``main``)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "probes" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_probe(name: str, *args: str, timeout: float = 120, cpu: bool = False):
    """Run ``scripts/probes/NAME.py ARGS`` from the repository root (``cpu``: no GPU visible);
    the completed process, output captured as text."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    script = ROOT / "scripts" / "probes" / f"{name}.py"
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout, env=env,
    )  # fmt: skip
