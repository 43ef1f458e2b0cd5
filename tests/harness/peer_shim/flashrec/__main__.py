"""``python -m flashrec --serve ARGS`` (the public engine's form): this folder leaves
``PYTHONPATH`` and the process becomes ``python -m flashrec serve ARGS`` of this checkout."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    """Drop ``--serve`` and this folder from the path, then exec this checkout's server."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in rest if os.path.abspath(p) != HERE]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(rest)}
    args = [a for a in sys.argv[1:] if a != "--serve"]
    os.execve(sys.executable, [sys.executable, "-m", "flashrec", "serve", *args], env)


main()
