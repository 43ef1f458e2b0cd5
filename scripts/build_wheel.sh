#!/usr/bin/env bash
# Build the flashrec wheel (engine + harness) into DIR (default dist/) and print its path.
#
#   scripts/build_wheel.sh [DIR]
#
# The wheel is built from a clean copy of the checkout (tracked files plus untracked ones git
# does not ignore), so stale build/ or *.egg-info directories never leak into it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
(cd "$root" && git ls-files -z --cached --others --exclude-standard |
  xargs -0 -I{} sh -c 'test -e "{}" && printf "%s\0" "{}"' | tar --null -T - -cf -) |
  tar -xf - -C "$src"
rm -f "$out"/flashrec-*.whl
python -m pip wheel -q --no-deps -w "$out" "$src" >&2
ls "$out"/flashrec-*.whl
