#!/usr/bin/env bash
# The H200 benchmark campaign of docs/baselines.md (offline engine, closed loop, same process
# HF baselines). Usage: OUT=dir bash scripts/h200_bench.sh [model_dir]
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
OUT=${OUT:-reports/h200/run}; mkdir -p "$OUT"
M=${1:-/tmp/onerec}
[ -f "$M/synth_info.json" ] || python -m flashrec synth --preset onerec-1.7b --out "$M" --catalog-size 1500000 > "$OUT/synth.log" 2>&1
B="python scripts/engine_bench.py --model-path $M --sid-vocab-file $M/catalog.json"
# CELLS selects cells (default: all four); TRACE=1 adds one traced round per cell;
# EXTRA adds engine_bench arguments to every cell and SUFFIX to its label and file name, e.g.
#   EXTRA="--set enable_step_graph=false" SUFFIX=_nostep CELLS="p1000_n256_c1_bf16" bash ...
CELLS=${CELLS:-"n50_c32_fp8 n512_c8_fp8 p1000_n256_c1_bf16 p5000_n256_c8_bf16"}
run() { local name=$1; shift; case " $CELLS " in *" $name "*) ;; *) return;; esac
  set -- "$@" ${EXTRA:-}; name=$name${SUFFIX:-}
  [ "${TRACE:-0}" = 1 ] && set -- "$@" --trace-dir "$OUT"
  timeout ${T:-150} $B --label "$name" "$@" > "$OUT/$name.json" 2>> "$OUT/bench.log"; echo "== $name rc=$?"; python - "$OUT/$name.json" <<'PY'
import json, sys
try:
    d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception as e:
    print("no result", e); sys.exit()
keys = ["qps_median", "lat_ms_p50_median", "hf_ms_per_request", "speedup_vs_hf", "prompt_tokens_mean"]
print({k: round(d[k], 2) for k in keys if k in d})
t = d.get("trace") or {}
print("trace:", {k: t.get(k) for k in ("gpu", "steps")} if t else None)
PY
}
run n50_c32_fp8 --n 50 --concurrency 32 --requests 96 --rounds 3 --prompt-median 2465 --hf-requests 2
run n512_c8_fp8 --n 512 --concurrency 8 --requests 32 --rounds 3 --prompt-median 2465 --cuda-graph-max-bs 4096 --hf-requests 0
run p1000_n256_c1_bf16 --n 256 --concurrency 1 --requests 12 --rounds 3 --prompt-median 1000 --quantization none --kv-cache-dtype auto --cuda-graph-max-bs 512 --hf-requests 2
run p5000_n256_c8_bf16 --n 256 --concurrency 8 --requests 16 --rounds 3 --prompt-median 5000 --quantization none --kv-cache-dtype auto --cuda-graph-max-bs 2048 --max-prefill-tokens 40960 --hf-requests 0
