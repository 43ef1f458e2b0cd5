#!/usr/bin/env bash
# Install a flashrec wheel into a fresh virtual environment and run its entry points from
# outside the source tree: `flashrec --help`, `flashrec-bench --help`,
# `python -m flashrec.check_env`; fail if flashrec or harness is imported from anywhere else.
#
#   scripts/check_wheel.sh WHEEL
#
# torch is installed first (CPU, the version CI pins; TORCH_SPEC overrides), as in .ci/run.
set -euo pipefail
wheel=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
test -f "$wheel" || { echo "no such wheel: $1" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset PYTHONPATH PYTHONHOME
python -m venv "$tmp/venv"
py=$tmp/venv/bin/python
"$py" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
"$py" -m pip install -q "$wheel"
cd "$tmp"
"$tmp/venv/bin/flashrec" --help >/dev/null
"$tmp/venv/bin/flashrec-bench" --help >/dev/null
"$py" -m flashrec.check_env
"$py" - "$tmp/venv" <<'PY'
import sys
from pathlib import Path

import flashrec
import harness

venv = Path(sys.argv[1]).resolve()
for mod in (flashrec, harness):
    where = Path(mod.__file__).resolve()
    if venv not in where.parents:
        sys.exit(f"{mod.__name__} imported from {where}, not from the installed wheel")
print(f"wheel OK: flashrec {flashrec.__version__} from {Path(flashrec.__file__).parent}")
PY
