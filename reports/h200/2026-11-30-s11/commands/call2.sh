R=$OUT; W=$R/w; mkdir -p $W; export PYTHONPATH=$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
(python -m flashrec synth --preset onerec-1.7b --out /dev/shm/onerec --catalog-size 1500000 > $W/synth.log 2>&1; touch $W/synth.done) &
OUT=$W STAGES=none bash scripts/gpu_bench.sh > $W/setup.log 2>&1
export PYTHONPATH=$PWD:/tmp/flashrec-site
echo "setup done at $SECONDS s" >> $W/steps.log
timeout 90 python tests/kernels/bench_kernels.py --silu-sweep > $W/silu_sweep.txt 2>&1
echo "silu done at $SECONDS s" >> $W/steps.log
while [ ! -f $W/synth.done ]; do sleep 1; done; echo "synth done at $SECONDS s" >> $W/steps.log
MODEL_PATH=/dev/shm/onerec SID_VOCAB_FILE=/dev/shm/onerec/catalog.json timeout 360 python -m harness matrices/h200_targets.yaml --out $W/targets > $W/targets.log 2>&1
echo "targets done at $SECONDS s rc=$?" >> $W/steps.log
timeout $((575-SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu tests/gpu tests/kernels/test_kernel_beam_attention.py > $W/gpu_tests.log 2>&1
echo "tests done at $SECONDS s rc=$?" >> $W/steps.log
tar czf $R/call2.tgz -C $R w
cat $W/steps.log; tail -3 $W/gpu_tests.log
