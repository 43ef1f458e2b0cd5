R=$OUT; W=$R/s15c4; mkdir -p $W
export FLASHREC_SOURCE_COMMIT=$(cat tmpcall/tree)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit,driver_version --format=csv > $W/gpu.txt 2>&1
OUT=$W STAGES=tests TESTS_TIMEOUT_S=400 bash scripts/gpu_bench.sh > $W/bench.log 2>&1
echo "done at $SECONDS s commit $FLASHREC_SOURCE_COMMIT" >> $W/bench.log
tar czf $R/s15c4.tgz -C $R s15c4
tail -4 $W/bench.log; grep -E "^FAILED|^ERROR" $W/gpu_tests.log | head; grep -E "graph_replay_equals_eager|wider_than_the_largest" $W/gpu_tests.log | head
