#!/usr/bin/env bash
# .ci/run N times in a row on fresh clones of one commit, one CPU-burning process per core beside
# it: the CI must stay green on a loaded machine.   bash scripts/ci_under_load.sh REPO OUTDIR [N]
set -u
repo=$1; out=$2; n=${3:-3}
mkdir -p "$out"
commit=$(git -C "$repo" rev-parse HEAD)
burners=()
for _ in $(seq "$(nproc)"); do (exec sh -c 'while :; do :; done') & burners+=($!); done
trap 'kill "${burners[@]}" 2>/dev/null' EXIT
echo "commit $commit, $(nproc) burners: ${burners[*]}, $(date -u +%FT%TZ)" | tee "$out/summary.txt"
for i in $(seq "$n"); do
  d=$(mktemp -d); git clone -q "$repo" "$d/c"; git -C "$d/c" checkout -q "$commit"
  t0=$(date +%s)
  (cd "$d/c" && CI=true bash .ci/run) > "$out/run$i.log" 2>&1
  rc=$?
  echo "run $i rc=$rc wall=$(( $(date +%s) - t0 ))s load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/summary.txt"
  sed -n '/===== CI summary/,$p' "$out/run$i.log" | sed 's/^/    /' | tee -a "$out/summary.txt"
  rm -rf "$d"
done
