#!/usr/bin/env bash
# Download (where PyPI is reachable) GuideLLM, the load generator of `flashrec-bench witness`,
# and the dependencies the GPU image lacks into ./.whl/witness, for Python 3.12 manylinux
# x86_64 (the H200 has no network). Carry .whl/witness to the GPU machine and install there:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/witness-site .whl/witness/*.whl \
#     && export PYTHONPATH=$PYTHONPATH:/tmp/witness-site PATH=$PATH:/tmp/witness-site/bin
# (appended after the image's packages: it never shadows them).
# Left out: what the image has (torch, transformers and theirs; numpy, aiohttp; pandas and pyarrow,
# which write the H200 reports' records.parquet), pydantic (scripts/gpu_wheels.sh carries it)
# and sanic with its own dependencies (GuideLLM's mock server only; `guidellm run` never imports it).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
GUIDELLM=${GUIDELLM:-guidellm==0.8.1}
dest=.whl/witness
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dest"
source scripts/wheel_platform.sh  # platform=(pip's target-platform flags)
skip='^(torch|transformers|triton|nvidia-.*|numpy|huggingface[-_]hub|hf-xet|tokenizers|safetensors|'
skip+='filelock|fsspec|packaging|pyyaml|regex|requests|urllib3|charset[-_]normalizer|tqdm|'
skip+='typing[-_]extensions|setuptools|jinja2|markupsafe|sympy|mpmath|networkx|'
skip+='aiohttp|multidict|yarl|frozenlist|aiosignal|propcache|attrs|aiohappyeyeballs|'
skip+='pandas|pyarrow|python-dateutil|six|tzdata|pytz|'
skip+='pydantic|pydantic[-_]core|annotated-types|typing-inspection|'
skip+='sanic|sanic-routing|tracerite|html5tagger|httptools|ujson|aiofiles)$'
# GuideLLM's own requirements less torch / transformers, resolved for the target platform
python3 -m pip download -q --no-deps "${platform[@]}" -d "$work" "$GUIDELLM"
unzip -p "$work"/guidellm-*.whl '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: //p' \
  | grep -v 'extra ==' | grep -v -E '^(torch|transformers)\b' > "$work/reqs.txt"
python3 -m pip install -q --dry-run --ignore-installed --report "$work/plan.json" --target "$work/t" \
  "${platform[@]}" -r "$work/reqs.txt"
python3 - "$work/plan.json" "$skip" > "$work/specs.txt" <<'PY'
import json, re, sys
plan, skip = json.load(open(sys.argv[1])), re.compile(sys.argv[2], re.I)
for item in plan["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if not skip.match(name):
        print(f"{name}=={version}")
PY
cp "$work"/guidellm-*.whl "$dest/"
xargs -a "$work/specs.txt" python3 -m pip download -q --no-deps "${platform[@]}" -d "$dest"
ls -la "$dest"
du -sh "$dest"
