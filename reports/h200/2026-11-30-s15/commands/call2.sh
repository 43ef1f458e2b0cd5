R=$OUT; W=$R/s15c2; mkdir -p $W; export PYTHONPATH=$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
export FLASHREC_SOURCE_COMMIT=$(cat tmpcall/tree)
[ -f /dev/shm/onerec/synth_info.json ] || (python -m flashrec synth --preset onerec-1.7b --out /dev/shm/onerec --catalog-size 1500000 > $W/synth.log 2>&1; touch $W/synth.done) &
[ -f /tmp/flashrec-site/.installed ] || OUT=$W STAGES=none bash scripts/gpu_bench.sh > $W/setup.log 2>&1
export PYTHONPATH=$PWD:/tmp/flashrec-site PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
echo "setup done at $SECONDS s; commit $FLASHREC_SOURCE_COMMIT" >> $W/steps.log
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit,driver_version --format=csv > $W/gpu.txt 2>&1
wait; echo "synth done at $SECONDS s" >> $W/steps.log
export MODEL_PATH=/dev/shm/onerec SID_VOCAB_FILE=/dev/shm/onerec/catalog.json
timeout $((585-SECONDS)) python -m harness matrices/h200_targets.yaml --max-wall-s $((575-SECONDS)) --out $W/targets > $W/targets.log 2>&1
echo "targets rc=$? at $SECONDS s: $(grep -h 'report:' $W/targets.log)" >> $W/steps.log
tar czf $R/s15c2.tgz -C $R s15c2
cat $W/steps.log; sed -n '/^## Targets/,/^$/p' $W/targets/REPORT.md | head -12
