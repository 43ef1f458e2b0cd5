R=$OUT; W=$R/s13c3; mkdir -p $W; export PYTHONPATH=$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
[ -f /dev/shm/onerec/synth_info.json ] || (python -m flashrec synth --preset onerec-1.7b --out /dev/shm/onerec --catalog-size 1500000 > $W/synth.log 2>&1; touch $W/synth.done) &
[ -f /tmp/flashrec-site/.installed ] || OUT=$W STAGES=none bash scripts/gpu_bench.sh > $W/setup.log 2>&1
export PYTHONPATH=$PWD:/tmp/flashrec-site PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
wait; echo "setup+synth done at $SECONDS s; commit $(cat tmpcall/tree)" >> $W/steps.log
export MODEL_PATH=/dev/shm/onerec SID_VOCAB_FILE=/dev/shm/onerec/catalog.json
timeout $((590-SECONDS)) python -m harness matrices/h200_n50_ab4.yaml --max-wall-s $((575-SECONDS)) --out $W/ab4 > $W/ab4.log 2>&1
echo "ab4 rc=$? at $SECONDS s: $(grep -h 'report:' $W/ab4.log)" >> $W/steps.log
tar czf $R/s13c3.tgz -C $R s13c3
cat $W/steps.log; grep "^| flashrec" $W/ab4/REPORT.md | cut -c1-260 | head -20
