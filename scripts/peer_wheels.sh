#!/usr/bin/env bash
# Download (where PyPI is reachable) the public FlashRec 0.1.2 (sohu-mptc) and what the GPU
# image lacks to run it into ./.whl/peer (git-ignored, like all of .whl/), for Python 3.12
# manylinux x86_64. Carry .whl/peer to the GPU machine; `STAGES=peers bash scripts/gpu_bench.sh`
# installs it there with
#   python3 -m pip install --no-index --no-deps --target /tmp/peer-site .whl/peer/*.whl
# into a folder that only the public server's PYTHONPATH names (it imports the package name
# `flashrec`, like ours), and runs matrices/h200_peers.yaml.
# Its own pins the image breaks: transformers<5 (with the image's 5.x every chat request
# fails: ../shared/gpu/README.md), so transformers 4.57.1 with its tokenizers and hub come
# along; fastapi 0.115.x needs starlette<0.47. What the image has and the peer takes as is:
# torch, triton, numpy, safetensors, flashinfer-python / apache-tvm-ffi (scripts' .whl).
# SGL_KERNEL=1 also fetches sgl-kernel 0.3.21 (a 535 MB wheel) and keeps only what the public
# engine calls: sgl_kernel/*.py and sgl_kernel/sm90/common_ops.abi3.so, xz -6 compressed and
# split into parts under 30 MB (.whl/peer/sgl_kernel/); the GPU stage joins them with Python's
# lzma. Off by default: on the lent machines it cannot load (it links CUDA 12 libraries, the
# image has CUDA 13 only, and was built for torch 2.9), and the public engine then runs on
# its PyTorch / Triton fallbacks; the report says so next to every number.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
dest=.whl/peer
mkdir -p "$dest"
source scripts/wheel_platform.sh  # platform=(pip's target-platform flags)
specs=(
  flashrec==0.1.2
  fastapi==0.115.14 starlette==0.46.2 uvicorn==0.34.3 h11==0.16.0 anyio==4.9.0 sniffio==1.3.1
  click==8.2.1 pydantic==2.11.7 pydantic_core==2.33.2 annotated-types==0.7.0
  typing-inspection==0.4.1 typing_extensions==4.14.1
  transformers==4.57.1 tokenizers==0.22.1 huggingface_hub==0.36.0 hf-xet==1.1.10
  requests==2.32.4 urllib3==2.5.0 idna==3.10 certifi==2025.7.14 charset_normalizer==3.4.2
  fsspec==2025.7.0 filelock==3.18.0 packaging==25.0 pyyaml==6.0.2 regex==2024.11.6
  safetensors==0.5.3 tqdm==4.67.1
)
for spec in "${specs[@]}"; do
  python3 -m pip download -q --no-deps "${platform[@]}" -d "$dest" "$spec"
done
# the public engine's CLI, endpoints and answer format, checked from the wheel itself
unzip -p "$dest"/flashrec-0.1.2-*.whl flashrec/cli.py | grep -q -- '"--serve"'
unzip -p "$dest"/flashrec-0.1.2-*.whl flashrec/server/api.py | grep -q '"sequence_score"'
if [ "${SGL_KERNEL:-0}" = 1 ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download -q --no-deps "${platform[@]}" -d "$work" sgl-kernel==0.3.21
  mkdir -p "$dest/sgl_kernel"
  (cd "$work" && unzip -q sgl_kernel-*.whl 'sgl_kernel/*.py' 'sgl_kernel/sm90/common_ops.abi3.so')
  tar cf - -C "$work" sgl_kernel | xz -6 -T0 | split -b 25M -d - "$dest/sgl_kernel/sgl_kernel.tar.xz.part"
  (cd "$dest/sgl_kernel" && sha256sum sgl_kernel.tar.xz.part* > SHA256SUMS)
fi
ls -la "$dest"
du -sh "$dest"
