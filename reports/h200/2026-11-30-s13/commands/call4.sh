R=$OUT; W=$R/s13c4; mkdir -p $W; export PYTHONPATH=$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
[ -f /dev/shm/onerec/synth_info.json ] || (python -m flashrec synth --preset onerec-1.7b --out /dev/shm/onerec --catalog-size 1500000 > $W/synth.log 2>&1; touch $W/synth.done) &
[ -f /tmp/flashrec-site/.installed ] || OUT=$W STAGES=none bash scripts/gpu_bench.sh > $W/setup.log 2>&1
export PYTHONPATH=$PWD:/tmp/flashrec-site PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
echo "setup done at $SECONDS s; commit $(cat tmpcall/tree)" >> $W/steps.log
timeout 110 python -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu_engine.py -k "last_rows or hf_parity" > $W/tests.log 2>&1
echo "tests rc=$? at $SECONDS s: $(tail -1 $W/tests.log)" >> $W/steps.log
wait; echo "synth done at $SECONDS s" >> $W/steps.log
export MODEL_PATH=/dev/shm/onerec SID_VOCAB_FILE=/dev/shm/onerec/catalog.json
timeout $((445-SECONDS)) python -m harness matrices/h200_lastrows_ab.yaml --max-wall-s $((435-SECONDS)) --out $W/ab > $W/ab.log 2>&1
echo "ab rc=$? at $SECONDS s: $(grep -h 'report:' $W/ab.log)" >> $W/steps.log
tar czf $R/s13c4.tgz -C $R s13c4
cat $W/steps.log; grep -E "passed|failed|Error" $W/tests.log | tail -5; grep "^| flashrec" $W/ab/REPORT.md | cut -c1-200 | head -8; sed -n '/^## Targets/,/^## Engine/p' $W/ab/REPORT.md | grep "^| n=\|^| prompt"
