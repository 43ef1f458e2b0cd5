#!/usr/bin/env bash
# Download (where PyPI is reachable) sglang-router 0.3.2 and what the GPU image lacks to run
# it into ./.whl/router (git-ignored, like all of .whl/), for Python 3.12 manylinux x86_64.
# Carry .whl/router to the GPU machine; scripts/gpu_bench.sh installs it there into
# /tmp/router-site (on every process's PYTHONPATH) so that matrices/h200_router.yaml can start
# `python -m sglang_router.launch_router`. Its launcher imports the Python load balancer
# (fastapi, uvicorn, orjson, aiohttp) and setproctitle; the image has aiohttp, anyio, click and
# h11, and pydantic comes with scripts/gpu_wheels.sh.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
dest=.whl/router
mkdir -p "$dest"
source scripts/wheel_platform.sh  # platform=(pip's target-platform flags)
specs=(
  sglang-router==0.3.2 setproctitle==1.3.6 orjson==3.11.3
  fastapi==0.115.14 starlette==0.46.2 uvicorn==0.34.3 sniffio==1.3.1
)
for spec in "${specs[@]}"; do
  python3 -m pip download -q --no-deps "${platform[@]}" -d "$dest" "$spec"
done
# the launcher the harness starts, checked from the wheel itself
unzip -l "$dest"/sglang_router-0.3.2-*.whl | grep -q 'sglang_router/launch_router.py'
ls -la "$dest"
du -sh "$dest"
