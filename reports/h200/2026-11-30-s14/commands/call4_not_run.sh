R=$OUT; W=$R/s14c4; mkdir -p $W; export PYTHONPATH=$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.cache/fi
export FLASHREC_SOURCE_COMMIT=$(cat tmpcall/tree)
[ -f /tmp/flashrec-site/.installed ] || OUT=$W STAGES=none bash scripts/gpu_bench.sh > $W/setup.log 2>&1
export PYTHONPATH=$PWD:/tmp/flashrec-site PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
echo "setup done at $SECONDS s; commit $FLASHREC_SOURCE_COMMIT" >> $W/steps.log
timeout 110 python -m pytest -q -p no:cacheprovider -m gpu -rf tests/kernels/test_kernel_qk_rope_kv.py::test_hardware_rounding_equals_the_emulated_rounding_bit_for_bit "tests/kernels/test_kernel_fp8.py::test_to_fp8_rounds_like_torch_bit_for_bit" tests/server/test_server_gpu.py tests/sid/test_trie.py tests/kernels/test_kernel_rms_fp8.py tests/kernels/test_kernel_silu_fp8.py > $W/tests.log 2>&1
echo "tests rc=$? at $SECONDS s: $(tail -1 $W/tests.log)" >> $W/steps.log
cat $W/steps.log; grep -E "^FAILED|passed|failed" $W/tests.log | tail -6
