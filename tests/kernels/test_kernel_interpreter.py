"""Runs every ``interpret`` case of the kernel tests in a child pytest with TRITON_INTERPRET=1.

The child must start with the variable set: Triton decides interpreted vs compiled when it is
imported (see conftest.py). Skipped without Triton, on GPU machines (the ``cuda`` cases cover
the kernels there) and inside the child itself.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_SKIP = (
    importlib.util.find_spec("triton") is None
    or torch.cuda.is_available()
    or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
)


@pytest.mark.skipif(_SKIP, reason="needs triton, no GPU, and not already interpreting")
def test_triton_kernels_under_interpreter() -> None:
    here = Path(__file__).resolve().parent
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [
        sys.executable, "-m", "pytest", str(here), "-q", "-p", "no:cacheprovider",
        "-m", "not gpu and not parity", "-k", "interpret", "-rs",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout, report
