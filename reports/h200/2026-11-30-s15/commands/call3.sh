R=$OUT; W=$R/s15c3; mkdir -p $W; export FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
export FLASHREC_SOURCE_COMMIT=$(cat tmpcall/tree)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit,driver_version --format=csv > $W/gpu.txt 2>&1
OUT=$W STAGES=tests TESTS_TIMEOUT_S=330 bash scripts/gpu_bench.sh > $W/bench.log 2>&1
echo "tests done at $SECONDS s: $(tail -1 $W/gpu_tests.log)" >> $W/steps.log
[ -f /dev/shm/onerec/synth_info.json ] || PYTHONPATH=$PWD python -m flashrec synth --preset onerec-1.7b --out /dev/shm/onerec --catalog-size 1500000 > $W/synth.log 2>&1
echo "synth done at $SECONDS s" >> $W/steps.log
export PYTHONPATH=$PWD:/tmp/flashrec-site PYTHONUNBUFFERED=1
Q="--model-path /dev/shm/onerec --beam-width 512 --concurrency 8 --requests 32 --warmup 8 --rounds 3 --prompt-tokens 2465 --server-arg quantization=fp8 --server-arg kv_cache_dtype=fp8_e4m3 --server-arg max_prefill_tokens=16384 --server-arg kv_pool_tokens=600000 --server-arg respond_workers=4"
for g in 4096 2048; do
  left=$((575-SECONDS)); [ $left -lt 60 ] && { echo "no time for graph $g" >> $W/steps.log; break; }
  timeout $left python -m harness quick $Q --server-arg cuda_graph_max_bs=$g --server-arg batch_slots=4096 --out $W/quick_g$g > $W/quick_g$g.log 2>&1
  echo "quick graphs<=$g rc=$? at $SECONDS s" >> $W/steps.log
done
tar czf $R/s15c3.tgz -C $R s15c3
cat $W/steps.log; grep -E "^FAILED|^ERROR" $W/gpu_tests.log | head; for g in 4096 2048; do grep -h "^| flashrec" $W/quick_g$g/REPORT.md 2>/dev/null | head -1 | cut -c1-200; grep -h "eager decode\|beam rows" $W/quick_g$g/REPORT.md | head -2; done
