# Sourced by the scripts that download wheels for the GPU machine (peer_wheels.sh,
# router_wheels.sh, witness_wheels.sh): pip's target-platform flags for its Python 3.12 on
# manylinux x86_64, binary wheels only.
# shellcheck disable=SC2034  # used by the sourcing script
platform=(--python-version 3.12 --implementation cp --only-binary=:all:
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform linux_x86_64)
