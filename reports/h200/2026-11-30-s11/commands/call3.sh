R=$OUT; W=$R/w; mkdir -p $W; export PYTHONPATH=$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
(python -m flashrec synth --preset onerec-1.7b --out /dev/shm/onerec --catalog-size 1500000 > $W/synth.log 2>&1; touch $W/synth.done) &
OUT=$W STAGES=none bash scripts/gpu_bench.sh > $W/setup.log 2>&1
export PYTHONPATH=$PWD:/tmp/flashrec-site
while [ ! -f $W/synth.done ]; do sleep 1; done; echo "setup+synth done at $SECONDS s" >> $W/steps.log
MODEL_PATH=/dev/shm/onerec SID_VOCAB_FILE=/dev/shm/onerec/catalog.json timeout 170 python -m harness matrices/h200_targets.yaml --only beam_width=512 --out $W/n512 > $W/n512.log 2>&1
echo "n512 done at $SECONDS s rc=$?" >> $W/steps.log
if grep -q "failed" $W/n512.log; then
  cp flashrec/layers/attention.py /tmp/attention_new.py; cp tmpcall/attention_old.py flashrec/layers/attention.py
  MODEL_PATH=/dev/shm/onerec SID_VOCAB_FILE=/dev/shm/onerec/catalog.json timeout 170 python -m harness matrices/h200_targets.yaml --only beam_width=512 --out $W/n512_oldprefill > $W/n512_oldprefill.log 2>&1
  echo "n512 old prefill done at $SECONDS s rc=$?" >> $W/steps.log
  cp /tmp/attention_new.py flashrec/layers/attention.py
fi
git diff --stat > $W/tree_diff.txt 2>&1
timeout $((570-SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu tests > $W/gpu_tests.log 2>&1
echo "tests done at $SECONDS s rc=$?" >> $W/steps.log
tar czf $R/call3.tgz -C $R w
cat $W/steps.log; tail -3 $W/gpu_tests.log
