#!/usr/bin/env bash
# Reproducible GPU run: install carried wheels, build the synthetic onerec-1.7b model + 1.5M-SID
# catalog, run `pytest -m gpu`, the offline benchmark campaign and (optionally) a matrix.
#   OUT=reports/h200/<date> bash scripts/gpu_bench.sh [matrices/onerec_fp8.yaml]
# Wheels: run scripts/gpu_wheels.sh where PyPI is reachable and carry .whl to the GPU machine.
# STAGES (default "tests cells matrix") picks what runs after the setup, so a run can be split
# over several calls of a lent machine that limits one command's time (10 min on the H200):
#   STAGES=tests ...; then STAGES=cells ...; then STAGES=matrix ... matrices/h200_targets.yaml
# PYTEST_ARGS (default "tests") narrows the tests stage to paths / node ids (split on spaces).
# ONLY (space-separated harness --only filters) narrows the matrix stage, e.g. one cell per call:
#   STAGES=matrix ONLY="beam_width=256,concurrency=1" bash scripts/gpu_bench.sh matrices/h200_targets.yaml
# MODEL (default /dev/shm/onerec where /dev/shm is writable, else .cache/onerec) and the FlashInfer
# JIT cache stay between calls of a warm machine; /dev/shm because writing the synthetic 1.7B
# model into the checkout's disk takes minutes.
# TAR=1 also writes $OUT/all.tgz: everything this run wrote under $OUT, in one file (and
# $OUT/matrix.tgz, the report directory alone), for transfers that return only a few files and
# no deep paths.
# STAGES=determinism runs the determinism run of --deterministic (DET_ON=1) or of the defaults
# (DET_PROCESSES, default 3; DET_ARGS adds flags) into $OUT/determinism_on|off.
# STAGES=witness runs `flashrec-bench witness` (GuideLLM beside flashrec-bench) on the n=50 c=32
# FP8 cell into $OUT/witness (carry .whl/witness, from scripts/witness_wheels.sh).
# STAGES=probes runs the side-by-side probe scripts into $OUT: scripts/probes/reorder_probe.py
# (GPU), scripts/probes/respond_probe.py (the host's cores: answer bodies on the loop vs worker
# processes), the qk_norm_rope_store and silu_mul launch-settings sweeps
# (tests/kernels/bench_kernels.py --qk-sweep, --silu-sweep) and the beam-decode attention tile
# sweep beside FlashInfer's paged prefill and cuDNN (--attn-sweep).
# STAGES=attn times the beam-decode attention's candidates (FlashInfer paged / ragged, the layer
# composed from ragged + suffix + merge) beside the engine's kernel, FP8 and BF16 KV.
# STAGES=qk runs only the qk_norm_rope_store sweep of the probes (rounding forms + launch
# settings), e.g. with the kernel's GPU tests and the served A/B:
#   STAGES="tests qk matrix" PYTEST_ARGS="tests/kernels/test_kernel_qk_rope_kv.py -k hardware" \
#     bash scripts/gpu_bench.sh matrices/experiments/h200_qk_rounding_ab.yaml
# STAGES=ab runs A/B pairs, same machine, same call (see docs/baselines.md): the defaults
# (step graph on) against the step graph off, at p=1000 and n=50, and at p=1000 also against
# the prefill graph off (no HF baseline in these runs: the pairs compare FlashRec with itself).
# STAGES=repeat runs the given matrix REPEAT times (default 5), each into $OUT/repeat_<i>, and
# writes $OUT/repeat.txt: one line per run with its exit code, the report's summary line and,
# for a run whose server died, the first fatal line of its server logs. For intermittent faults
# (a server crash in some runs of a cell only):
#   STAGES=repeat REPEAT=6 ONLY="beam_width=512" bash scripts/gpu_bench.sh matrices/h200_targets.yaml
# STAGES=peers runs matrices/h200_peers.yaml: ours beside the public flashrec 0.1.2 (carry
# .whl/peer from scripts/peer_wheels.sh), into $OUT/peers (see the stage below).
# STAGES=soak runs issue 49's GPU soak (n=50 FP8, fixed rate, swaps during it) into $OUT/soak;
# SOAK_DURATION (10m) outlasts one call: run it detached (setsid) and collect it in the next.
# .whl/router (scripts/router_wheels.sh), where carried, installs sglang-router for matrices with
# replicas: STAGES=matrix bash scripts/gpu_bench.sh matrices/h200_router.yaml
# STAGES=gate runs `flashrec-bench gate MATRIX` (this tree against a baseline, interleaved) from
# the two trees of .gate/repo.bundle (scripts/gate_bundle.sh BASE here; carry .gate). Both
# sides' servers share the GPU: a matrix whose pools fit twice (h200_targets' 600,000-token
# pools do not on an 80 GB card):
#   STAGES=gate ONLY="prompt_tokens=1000" bash scripts/gpu_bench.sh matrices/experiments/h200_host_gate.yaml
# To run exactly a commit (not a working tree that others are editing): here
#   git archive --format=tar.gz -o .gate/head.tgz HEAD   (carry .whl and .gate/head.tgz)
# there: unpack it into /tmp/fr, copy .whl beside it, run this script from /tmp/fr with
# FLASHREC_SOURCE_COMMIT set to that commit.
# FLASHREC_SOURCE_COMMIT=<commit>: where this checkout is a working tree copied over another
# .git (the lent H200's is older), the commit its files came from; the reports print it as the
# "declared source commit" beside the files' tree id.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-reports/gpu/$(date +%Y%m%d-%H%M%S)}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# a warm machine: installed by an earlier call, unless that call's wheels lacked orjson or pydantic
[ -f /tmp/flashrec-site/.installed ] \
  && ! PYTHONPATH=/tmp/flashrec-site python3 -c "import orjson, pydantic" 2>/dev/null \
  && rm -f /tmp/flashrec-site/.installed
if [ -f /tmp/flashrec-site/.installed ]; then
  export PYTHONPATH=$PYTHONPATH:/tmp/flashrec-site
elif ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/flashrec-site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/flashrec-site
  # pip stamps what it installs with the install time, so FlashInfer's headers would look newer
  # than a carried JIT build (below) and ninja would rebuild it all: age them instead
  find /tmp/flashrec-site -exec touch -h -d '2000-01-01' {} + && touch /tmp/flashrec-site/.installed
fi
# sglang-router and its launcher's needs (.whl/router from scripts/router_wheels.sh, carried):
# a folder of their own on every process's path, for matrices with replicas behind the router
if ls .whl/router/*.whl >/dev/null 2>&1 && [ ! -f /tmp/router-site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/router-site \
    .whl/router/*.whl && touch /tmp/router-site/.installed
fi
[ -f /tmp/router-site/.installed ] && export PYTHONPATH=$PYTHONPATH:/tmp/router-site
if [ -z "${MODEL:-}" ] && [ -w /dev/shm ]; then MODEL=/dev/shm/onerec; fi
MODEL=${MODEL:-$PWD/.cache/onerec}
STAGES=" ${STAGES:-tests cells matrix} "
# FlashInfer JIT builds once per machine (minutes); never under a timeout (a build killed
# half-way restarts from scratch in the next process). Kept across calls of a warm machine.
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$PWD/.cache/fi}
# A JIT build carried from an earlier machine (.fijit/fi.tgz, written there by SAVE_JIT=1 into
# $OUT; carry .fijit): reused when its paths match (this checkout's path, the site above) and
# its inputs look older than its outputs; FlashInfer rebuilds whatever does not match.
# Unpacked before anything imports flashinfer (check_env does: the import creates the workspace
# directory, which is why this tests for built ops, not for the directory), and only where no
# op is built yet, so a warm machine's own builds are kept.
if [ -f .fijit/fi.tgz ] && ! find "$FLASHINFER_WORKSPACE_BASE" -name '*.so' 2>/dev/null | grep -q .; then
  mkdir -p "$(dirname "$FLASHINFER_WORKSPACE_BASE")"
  tar xzf .fijit/fi.tgz -C "$(dirname "$FLASHINFER_WORKSPACE_BASE")"
fi
python -m flashrec.check_env --require gpu,fp8,triton | tee "$OUT/check_env.txt"
# the server's answer bodies need orjson and flashrec-bench needs pydantic; the image has
# neither: stop here, before the setup spends the call, if the carried wheels lacked them
if ! python -c "import orjson, pydantic" 2>/dev/null; then
  echo "gpu_bench: orjson or pydantic missing: run scripts/gpu_wheels.sh here and carry .whl" >&2
  exit 2
fi
# FI_HEAD_DIMS: the head dims built before anything runs (~70 s each on a fresh machine): 128
# (onerec-1.7b) and, where the GPU tests run, 64 (tiny test models); other dims build on first use
case $STAGES in *" tests "*) fi_dims=${FI_HEAD_DIMS:-128 64};; *) fi_dims=${FI_HEAD_DIMS:-128};; esac
python -c "import flashinfer" 2>/dev/null && python scripts/flashinfer_warmup.py --head-dims $fi_dims | tee "$OUT/flashinfer_warmup.txt"
[ "${SAVE_JIT:-0}" = 1 ] && tar czf "$OUT/fi.tgz" -C "$(dirname "$FLASHINFER_WORKSPACE_BASE")" "$(basename "$FLASHINFER_WORKSPACE_BASE")"
case $STAGES in *" cells "*|*" ab "*|*" matrix "*|*" witness "*|*" gate "*|*" determinism "*|*" peers "*|*" soak "*)  # tests: own models
  # SYNTH_ARGS adds synth flags, e.g. "--sid-entropy 3.0" (the confident model; give it a MODEL of its own)
  [ -f "$MODEL/synth_info.json" ] || python -m flashrec synth --preset onerec-1.7b --out "$MODEL" --catalog-size 1500000 ${SYNTH_ARGS:-} > "$OUT/synth.log" 2>&1;; esac
case $STAGES in *" tests "*)  # -v: one line per test as it ends, so a run cut short (a call's
  # time limit) still names what passed and failed; -rf: the failures' one-line summaries.
  # TESTS_TIMEOUT_S (default none) bounds the stage, e.g. a call's limit minus the setup.
  ${TESTS_TIMEOUT_S:+timeout $TESTS_TIMEOUT_S} python -m pytest -v -rf -p no:cacheprovider \
    -m gpu ${PYTEST_ARGS:-tests} > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "^FAILED|^ERROR" "$OUT/gpu_tests.log" | head -20
  tail -1 "$OUT/gpu_tests.log";; esac
case $STAGES in *" qk "*)  # the fused q/k norm + RoPE kernel alone: its rounding forms and launch
  # settings timed side by side (--qk-rope-rounding emulated / hardware)
  python tests/kernels/bench_kernels.py --qk-sweep | tee "$OUT/qk_sweep.txt";; esac
case $STAGES in *" probes "*)  # kernel-level A/Bs, both forms side by side in one process
  python scripts/probes/reorder_probe.py | tee "$OUT/reorder_probe.jsonl"
  python scripts/probes/respond_probe.py --workers 2 4 8 | tee "$OUT/respond_probe.jsonl"
  python tests/kernels/bench_kernels.py --qk-sweep | tee "$OUT/qk_sweep.txt"
  python tests/kernels/bench_kernels.py --silu-sweep | tee "$OUT/silu_sweep.txt"
  python tests/kernels/bench_kernels.py --attn-sweep | tee "$OUT/attn_sweep.txt";; esac
case $STAGES in *" attn "*)  # the beam-decode attention's candidates beside the engine's kernel
  # (launches of FP8 and BF16 KV): FlashInfer's paged prefill over the pool (fa2, fa3), its
  # ragged fa3 over a dense BF16 copy, and the whole layer composed from it (docs/baselines.md)
  ATTN_TILES="64x128x4x2x1 64x64x4x3" ATTN_PAGED="fa2 fa3" ATTN_RAGGED="fa3" ATTN_GRAPH=1 \
    python tests/kernels/bench_kernels.py --attn-sweep | tee "$OUT/attn_candidates.txt";; esac
case $STAGES in *" determinism "*)  # 120 requests x DET_PROCESSES (3) fresh processes, sequential
  # and at concurrency 16, widths 1-32, FP8 W8A8 + FP8 KV; DET_ON=1: with --deterministic, where
  # any drift (across processes, or concurrent against sequential) fails; DET_ARGS adds flags
  det=off; strict=(); [ "${DET_ON:-0}" = 1 ] && det=on strict=(--strict-concurrent --server-arg deterministic=true)
  python -m harness determinism --model-path "$MODEL" --sid-vocab-file "$MODEL/catalog.json" \
    --device cuda --requests 120 --processes "${DET_PROCESSES:-3}" --mode both --concurrency 16 \
    --no-localise --server-arg quantization=fp8 --server-arg kv_cache_dtype=fp8_e4m3 \
    --server-arg cuda_graph_max_bs=512 --server-arg batch_slots=512 \
    --server-arg kv_pool_tokens=200000 "${strict[@]}" ${DET_ARGS:-} --out "$OUT/determinism_$det" \
    > "$OUT/determinism_$det.log" 2>&1
  echo "determinism (mode $det) rc=$?"; tail -2 "$OUT/determinism_$det.log";; esac
case $STAGES in *" soak "*)  # issue 49's GPU soak: n=50 FP8 at a fixed rate (SOAK_RATE, default 60/s,
  # ~60% of the n=50 c=32 cell's rate) for SOAK_DURATION (10m), histories of ~2,465 tokens from
  # 4,096 prompts (too many for the radix cache to hold), the probe every 15 s, a cache flush, a
  # catalog reload and a weight update from the served checkpoint during it; SOAK_ARGS adds
  # flags. Longer than one call: start it detached (setsid) and collect $OUT/soak later.
  # Probe tolerance 0.5: without --deterministic an FP8 answer's scores move with prefix-cache
  # hits and batch (docs/baselines.md, "Soak ... GPU"); wrong weights or catalogs move more.
  cp "$MODEL/catalog.json" /dev/shm/soak_catalog_copy.json
  bench="python -m harness"; command -v flashrec-bench >/dev/null && bench=flashrec-bench
  $bench soak --model-path "$MODEL" --device cuda --server-arg quantization=fp8 \
    --server-arg kv_cache_dtype=fp8_e4m3 --server-arg cuda_graph_max_bs=1600 \
    --server-arg batch_slots=1600 --server-arg kv_pool_tokens=600000 --server-arg engine_process=on \
    --duration "${SOAK_DURATION:-10m}" --rate "${SOAK_RATE:-60}" --interval 30s --probe-every 15s --probe-score-tol 0.5 \
    --beam-width 50 --prompt-tokens 2465 --prompts 4096 --max-tokens 4 --startup-timeout-s 900 \
    --every 2m flush_cache --every 3m update_catalog=default=/dev/shm/soak_catalog_copy.json \
    --every 4m update_weights="$MODEL" ${SOAK_ARGS:-} --out "$OUT/soak" > "$OUT/soak.log" 2>&1
  echo "soak rc=$?"; tail -3 "$OUT/soak.log";; esac
case $STAGES in *" cells "*) OUT=$OUT bash scripts/h200_bench.sh "$MODEL";; esac
case $STAGES in *" witness "*)  # flashrec-bench and GuideLLM on the n=50 c=32 FP8 cell, one run
  # (.whl/witness from scripts/witness_wheels.sh; WITNESS_ARGS adds or overrides flags)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/witness-site .whl/witness/*.whl \
    > "$OUT/witness_install.log" 2>&1
  PYTHONPATH=$PYTHONPATH:/tmp/witness-site PATH=$PATH:/tmp/witness-site/bin python -m harness witness \
    --model-path "$MODEL" --device cuda --beam-width 50 --concurrency 32 --requests 320 --warmup 32 \
    --rounds 3 --prompt-tokens 2465 --server-arg quantization=fp8 --server-arg kv_cache_dtype=fp8_e4m3 \
    --server-arg cuda_graph_max_bs=1600 --server-arg batch_slots=1600 \
    --server-arg max_prefill_tokens=16384 --server-arg kv_pool_tokens=600000 \
    --server-arg engine_process=on ${WITNESS_ARGS:-} --out "$OUT/witness" > "$OUT/witness.log" 2>&1
  echo "witness rc=$?"; tail -12 "$OUT/witness.log";; esac
case $STAGES in *" ab "*)
  for cells in ${AB_CELLS:-p1000_n256_c1_bf16 n50_c32_fp8}; do
    OUT=$OUT CELLS=$cells EXTRA="--hf-requests 0" bash scripts/h200_bench.sh "$MODEL"
    OUT=$OUT CELLS=$cells EXTRA="--hf-requests 0 --set enable_step_graph=false" SUFFIX=_nostep \
      bash scripts/h200_bench.sh "$MODEL"
    [ "$cells" = p1000_n256_c1_bf16 ] && OUT=$OUT CELLS=$cells SUFFIX=_noprefill \
      EXTRA="--hf-requests 0 --set prefill_graph_max_tokens=0" bash scripts/h200_bench.sh "$MODEL"
  done;; esac
case $STAGES in *" gate "*)  # flashrec-bench gate MATRIX: this tree against a baseline commit,
  # both served here, rounds interleaved. The lent machine's .git is older than the checkout, so
  # the two trees come in .gate/repo.bundle (scripts/gate_bundle.sh BASE; carry .gate), cloned
  # to /tmp; GATE_ARGS adds flags (--pairs, --sessions, --metrics; --max-wall-s to stay inside a
  # call's limit and still compare the pairs done), ONLY narrows the cells.
  rm -rf /tmp/gate-repo && git clone -q .gate/repo.bundle /tmp/gate-repo && git -C /tmp/gate-repo checkout -q candidate
  only=(); for f in ${ONLY:-}; do only+=(--only "$f"); done
  (cd /tmp/gate-repo && PYTHONPATH=/tmp/gate-repo:/tmp/flashrec-site MODEL_PATH=$MODEL SID_VOCAB_FILE=$MODEL/catalog.json \
    python -m harness gate "$1" --baseline-ref baseline --out "$OUT/gate" "${only[@]}" ${GATE_ARGS:-}) \
    > "$OUT/gate.log" 2>&1
  echo "gate rc=$? ($(cat .gate/commits))"; tail -15 "$OUT/gate.log";; esac
case $STAGES in *" peers "*)  # ours beside the public flashrec 0.1.2 (issue 45): .whl/peer from
  # scripts/peer_wheels.sh (carry .whl) installed into PEER_DIR (default /tmp/peer-site), a
  # folder only the public server's PYTHONPATH names (its package is also called flashrec);
  # sgl-kernel parts, where carried (SGL_KERNEL=1 there), joined with Python's lzma beside it.
  # Then matrices/h200_peers.yaml (both servers on the card, rounds interleaved; its parity
  # stage unless PEERS_PARITY=false) into $OUT/peers; ONLY, MAX_WALL_S, RESUME as for matrix
  # (MATRIX_DIR: PEERS_DIR), PEER_MAX_TOKENS = the catalog's depth (3 for the synthetic model).
  export PEER_DIR=${PEER_DIR:-/tmp/peer-site}
  if [ ! -f "$PEER_DIR/.installed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$PEER_DIR" .whl/peer/*.whl \
      > "$OUT/peer_install.log" 2>&1 && touch "$PEER_DIR/.installed"
    if ls .whl/peer/sgl_kernel/*.part* >/dev/null 2>&1; then
      python3 - "$PEER_DIR" <<'PY'
import glob, io, lzma, sys, tarfile
parts = sorted(glob.glob(".whl/peer/sgl_kernel/sgl_kernel.tar.xz.part*"))
data = lzma.decompress(b"".join(open(p, "rb").read() for p in parts))
tarfile.open(fileobj=io.BytesIO(data)).extractall(sys.argv[1])
PY
    fi
  fi
  # which flashrec the peer imports, and whether sgl-kernel loads (else: PyTorch fallbacks)
  (cd /tmp && PYTHONPATH=$PEER_DIR:$PYTHONPATH python -P -c \
    "import flashrec; print('peer flashrec', flashrec.__version__, flashrec.__file__)"
   PYTHONPATH=$PEER_DIR:$PYTHONPATH python -P -c "import sgl_kernel; print('sgl_kernel loads')" 2>&1 \
    | tail -1) | tee "$OUT/peer_check.txt"
  bench="python -m harness"; command -v flashrec-bench >/dev/null && bench=flashrec-bench
  only=(); for f in ${ONLY:-}; do only+=(--only "$f"); done
  pdir=${PEERS_DIR:-$OUT/peers}
  MODEL_PATH=$MODEL SID_VOCAB_FILE=$MODEL/catalog.json $bench matrices/h200_peers.yaml --out "$pdir" \
    "${only[@]}" ${MAX_WALL_S:+--max-wall-s "$MAX_WALL_S"} $([ "${RESUME:-0}" = 1 ] && echo --resume) \
    > "$OUT/peers.log" 2>&1
  echo "peers rc=$?"; tail -8 "$OUT/peers.log"
  [ "$pdir" != "$OUT/peers" ] && rm -rf "$OUT/peers" && cp -r "$pdir" "$OUT/peers";; esac
if [ $# -ge 1 ] && case $STAGES in *" repeat "*) true;; *) false;; esac; then
  bench="python -m harness"; command -v flashrec-bench >/dev/null && bench=flashrec-bench
  only=(); for f in ${ONLY:-}; do only+=(--only "$f"); done
  for i in $(seq 1 "${REPEAT:-5}"); do
    MODEL_PATH=$MODEL SID_VOCAB_FILE=$MODEL/catalog.json $bench "$1" --out "$OUT/repeat_$i" "${only[@]}" \
      > "$OUT/repeat_$i.log" 2>&1
    rc=$?
    fatal=$(grep -h -m1 -E "Segfault|Fatal Python error|illegal|CUDA error" "$OUT/repeat_$i"/servers/*.log 2>/dev/null | head -1)
    echo "run $i rc=$rc $(grep -h '^report:' "$OUT/repeat_$i.log") ${fatal:+| $fatal}" | tee -a "$OUT/repeat.txt"
  done
fi
if [ $# -ge 1 ] && case $STAGES in *" matrix "*) true;; *) false;; esac; then
  bench="python -m harness"; command -v flashrec-bench >/dev/null && bench=flashrec-bench
  only=(); for f in ${ONLY:-}; do only+=(--only "$f"); done  # ONLY="beam_width=256,concurrency=1 ..."
  # MAX_WALL_S: the matrix's time budget (flashrec-bench --max-wall-s), e.g. a call's limit
  # minus the setup: cells that would not finish are not started, and the report is written
  # MATRIX_DIR (default $OUT/matrix): where the report is written. A matrix longer than one call
  # runs into a directory that outlives the call on a warm machine (e.g. /tmp/q) with MAX_WALL_S,
  # then again with RESUME=1 (--resume: the finished cells are kept); a copy lands in $OUT/matrix.
  # Nothing else should run beside it (a model being synthesized): cells measured on a busy
  # host carry a "busy host" note in the report
  mdir=${MATRIX_DIR:-$OUT/matrix}
  MODEL_PATH=$MODEL SID_VOCAB_FILE=$MODEL/catalog.json $bench "$1" --out "$mdir" "${only[@]}" \
    ${MAX_WALL_S:+--max-wall-s "$MAX_WALL_S"} $([ "${RESUME:-0}" = 1 ] && echo --resume) 2>&1 | tail -5
  [ "$mdir" != "$OUT/matrix" ] && rm -rf "$OUT/matrix" && cp -r "$mdir" "$OUT/matrix"
  # TAR=1: also one archive of the report directory (traces and per-cell folders included),
  # for transfers that drop deep or oddly named paths (the lent device's does); without a
  # generated quality dataset's sid2pid.json (the whole catalog: over the transfer's size
  # limit at 1.5M SIDs; plant.json and the parquet stay)
  [ "${TAR:-0}" = 1 ] && tar czf "$OUT/matrix.tgz" --exclude=matrix/quality/dataset/sid2pid.json -C "$OUT" matrix
fi
if [ "${TAR:-0}" = 1 ]; then  # last: the archive holds every file above
  tar czf "/tmp/all.$$.tgz" -C "$OUT" --exclude=all.tgz --exclude=sid2pid.json . && mv "/tmp/all.$$.tgz" "$OUT/all.tgz"
fi
echo "results in $OUT"
