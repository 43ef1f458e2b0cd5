R=$OUT; W=$R/w3; rm -rf $R/w; mkdir -p $W; export PYTHONPATH=$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
[ -f /dev/shm/onerec/synth_info.json ] || (python -m flashrec synth --preset onerec-1.7b --out /dev/shm/onerec --catalog-size 1500000 > $W/synth.log 2>&1; touch $W/synth.done) &
[ -f /tmp/flashrec-site/.installed ] || OUT=$W STAGES=none bash scripts/gpu_bench.sh > $W/setup.log 2>&1
export PYTHONPATH=$PWD:/tmp/flashrec-site PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
echo "setup done at $SECONDS s; tree $(cat tmpcall/tree 2>/dev/null)" >> $W/steps.log
wait; echo "synth done at $SECONDS s" >> $W/steps.log
export MODEL_PATH=/dev/shm/onerec SID_VOCAB_FILE=/dev/shm/onerec/catalog.json
timeout 200 python -m harness matrices/h200_targets.yaml --only prompt_tokens=5000 --out $W/p5000 > $W/p5000.log 2>&1
echo "p5000 done at $SECONDS s rc=$?" >> $W/steps.log
for i in 1 2 3 4 5; do
  [ $SECONDS -gt 470 ] && break
  timeout $((560-SECONDS)) python -m harness tmpcall/n512.yaml --out $W/n512_$i > $W/n512_$i.log 2>&1
  echo "n512 run $i done at $SECONDS s rc=$? $(grep -h 'report:' $W/n512_$i.log)" >> $W/steps.log
done
tar czf $R/call3.tgz -C $R w3
cat $W/steps.log; grep -h -A12 "Fatal Python\|Current thread" $W/n512_*/servers/*.log | head -60
sed -n '/^## Targets/,/^$/p' $W/p5000/REPORT.md | tail -3; grep -h "n=512\|QPS median" $W/n512_*/REPORT.md | cut -c1-200 | head
