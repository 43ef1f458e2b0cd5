#!/usr/bin/env bash
# A small git bundle for `flashrec-bench gate` where the checkout's .git cannot travel (the lent
# GPU machine): two commits, the trees of BASE and of HEAD (history left out), as .gate/repo.bundle.
#   bash scripts/gate_bundle.sh BASE    then, there:  STAGES=gate bash scripts/gpu_bench.sh MATRIX
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
base=$(git rev-parse "${1:?usage: gate_bundle.sh BASE}^{commit}"); head=$(git rev-parse HEAD)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
git init -q "$tmp/r"
export GIT_AUTHOR_NAME=gate GIT_AUTHOR_EMAIL=gate@localhost GIT_COMMITTER_NAME=gate GIT_COMMITTER_EMAIL=gate@localhost
git archive "$base" | tar x -C "$tmp/r"
git -C "$tmp/r" add -A && git -C "$tmp/r" commit -qm "baseline: $base" && git -C "$tmp/r" tag baseline
find "$tmp/r" -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} +
git archive "$head" | tar x -C "$tmp/r"
git -C "$tmp/r" add -A && git -C "$tmp/r" commit -qm "candidate: $head" && git -C "$tmp/r" tag candidate
mkdir -p .gate && git -C "$tmp/r" bundle create -q "$PWD/.gate/repo.bundle" --all
echo "$base $head" > .gate/commits
ls -l .gate/repo.bundle
