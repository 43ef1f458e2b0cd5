#!/usr/bin/env bash
# Download (on a machine with PyPI access) the wheels a bare GPU image lacks for FlashRec and its
# harness into ./.whl: pydantic (+ its deps) for flashrec-bench, orjson for the answer bodies. Python 3.12, manylinux x86_64.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .whl
for spec in pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.8.0 typing-inspection==0.4.5 orjson==3.13.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$spec"
done
ls -la .whl
