R=$OUT; W=$R/w; mkdir -p $W; export PYTHONPATH=$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
(python -m flashrec synth --preset onerec-1.7b --out /dev/shm/onerec --catalog-size 1500000 > $W/synth.log 2>&1; touch $W/synth.done) &
[ -f /tmp/flashrec-site/.installed ] || OUT=$W STAGES=none bash scripts/gpu_bench.sh > $W/setup.log 2>&1
export PYTHONPATH=$PWD:/tmp/flashrec-site PYTHONUNBUFFERED=1
echo "setup done at $SECONDS s; tree $(cat tmpcall/tree 2>/dev/null)" >> $W/steps.log
while [ ! -f $W/synth.done ]; do sleep 1; done; echo "synth done at $SECONDS s" >> $W/steps.log
export MODEL_PATH=/dev/shm/onerec SID_VOCAB_FILE=/dev/shm/onerec/catalog.json
timeout 330 python -m harness matrices/h200_targets.yaml --out $W/targets > $W/targets.log 2>&1
echo "targets done at $SECONDS s rc=$?" >> $W/steps.log
timeout $((575-SECONDS)) python -m harness matrices/h200_host_ab2.yaml --out $W/ab2 > $W/ab2.log 2>&1
echo "ab2 done at $SECONDS s rc=$?" >> $W/steps.log
tar czf $R/call.tgz -C $R w
cat $W/steps.log; tail -4 $W/targets.log; tail -4 $W/ab2.log
grep -A8 "^| cell | QPS\|^| cell |" $W/targets/REPORT.md | head -30; grep -A8 "^| cell |" $W/ab2/REPORT.md | head -24
