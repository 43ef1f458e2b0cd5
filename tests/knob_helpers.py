"""The A/B environment knobs read at import (``flashrec.config.flags.env_choice``), checked in
a fresh interpreter: what a module reads with the variable unset or set."""

from __future__ import annotations

import os
import subprocess
import sys


def import_with(module: str, attr: str, var: str, value: str | None = None):
    """Import ``module`` with ``var`` unset (None) or set to ``value`` and print its ``attr``;
    the finished process (a refused value fails the import: its message is in stderr)."""
    env = {k: v for k, v in os.environ.items() if k != var}
    if value is not None:
        env[var] = value
    code = f"import {module} as m; print(m.{attr})"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
