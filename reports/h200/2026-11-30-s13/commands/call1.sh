R=$OUT; W=$R/s13c1; mkdir -p $W; export PYTHONPATH=$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
[ -f /dev/shm/onerec/synth_info.json ] || (python -m flashrec synth --preset onerec-1.7b --out /dev/shm/onerec --catalog-size 1500000 > $W/synth.log 2>&1; touch $W/synth.done) &
[ -f /tmp/flashrec-site/.installed ] || OUT=$W STAGES=none SAVE_JIT=1 bash scripts/gpu_bench.sh > $W/setup.log 2>&1
export PYTHONPATH=$PWD:/tmp/flashrec-site PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
echo "setup done at $SECONDS s; commit $(cat tmpcall/tree)" >> $W/steps.log
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu_engine.py -k "planned_ahead or flashinfer" > $W/tests_ring.log 2>&1
echo "ring tests rc=$? at $SECONDS s: $(tail -1 $W/tests_ring.log)" >> $W/steps.log
wait; echo "synth done at $SECONDS s" >> $W/steps.log
export MODEL_PATH=/dev/shm/onerec SID_VOCAB_FILE=/dev/shm/onerec/catalog.json
for i in 1 2 3 4; do
  [ $SECONDS -gt 440 ] && break
  timeout $((575-SECONDS)) python -m harness tmpcall/n512.yaml --rounds 10 --out $W/n512_$i > $W/n512_$i.log 2>&1
  echo "n512 run $i (10 rounds) done at $SECONDS s rc=$? $(grep -h 'report:' $W/n512_$i.log)" >> $W/steps.log
done
tar czf $R/s13c1.tgz -C $R s13c1
cat $W/steps.log; tail -5 $W/tests_ring.log; grep -h -A12 "Fatal Python\|Current thread\|Segfault" $W/n512_*/servers/*.log | head -60
grep -h "QPS" $W/n512_*/REPORT.md | cut -c1-220 | head
