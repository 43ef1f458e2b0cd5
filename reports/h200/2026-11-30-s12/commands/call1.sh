R=$OUT; W=$R/w; mkdir -p $W; export PYTHONPATH=$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
OUT=$W STAGES=none bash scripts/gpu_bench.sh > $W/setup.log 2>&1
export PYTHONPATH=$PWD:/tmp/flashrec-site PYTHONUNBUFFERED=1
echo "setup done at $SECONDS s; tree $(cat tmpcall/tree 2>/dev/null)" >> $W/steps.log
timeout 240 python scripts/fp8_prefill_probe.py > $W/fp8_prefill.jsonl 2> $W/fp8_prefill.err
echo "fp8 probe done at $SECONDS s rc=$?" >> $W/steps.log
tar czf $R/fi.tgz -C $PWD/.cache fi
ATTN_FI=0 ATTN_KV=bf16 ATTN_SHAPES="1x256x1000" ATTN_TILES="64x64x4x3 64x128x4x3 32x64x4x3" ATTN_SPLITS="1 2 3 4 5 6 8" timeout 120 python tests/kernels/bench_kernels.py --attn-sweep > $W/attn_splits.txt 2>&1
echo "attn splits done at $SECONDS s rc=$?" >> $W/steps.log
timeout $((560-SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu tests > $W/gpu_tests.log 2>&1
echo "tests done at $SECONDS s rc=$?" >> $W/steps.log
tar czf $R/call.tgz -C $R w
cat $W/steps.log; cat $W/fp8_prefill.jsonl; tail -5 $W/fp8_prefill.err; grep -h "beam_attn" $W/attn_splits.txt | cut -c1-160; tail -3 $W/gpu_tests.log
