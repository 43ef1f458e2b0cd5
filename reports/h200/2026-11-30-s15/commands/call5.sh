R=$OUT; W=$R/s15c5; mkdir -p $W; export PYTHONPATH=$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
export FLASHREC_SOURCE_COMMIT=$(cat tmpcall/tree)
(python -m flashrec synth --preset onerec-1.7b --out /dev/shm/onerec --catalog-size 1500000 > $W/synth.log 2>&1) &
OUT=$W STAGES=none bash scripts/gpu_bench.sh > $W/setup.log 2>&1
wait; echo "setup+synth done at $SECONDS s" >> $W/steps.log
export PYTHONPATH=$PWD:/tmp/flashrec-site PYTHONUNBUFFERED=1 MODEL_PATH=/dev/shm/onerec SID_VOCAB_FILE=/dev/shm/onerec/catalog.json
timeout $((225-SECONDS)) python -m harness matrices/h200_engine_process_ab.yaml --only beam_width=256 --max-wall-s $((215-SECONDS)) --out $W/ab > $W/ab.log 2>&1
echo "ab rc=$? at $SECONDS s" >> $W/steps.log
tar czf $R/s15c5.tgz -C $R s15c5
cat $W/steps.log; grep -h "^| flashrec" $W/ab/REPORT.md | head -2 | cut -c1-200; sed -n '/Where the latency goes/,/^## /p' $W/ab/REPORT.md | grep "^| flashrec" | cut -c1-250
