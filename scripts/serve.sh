#!/usr/bin/env bash
# Start the FlashRec HTTP server (one process: HTTP, tokenizer, scheduler, weights, KV pool).
#
#   MODEL_PATH=/path/to/model SID_VOCAB_FILE=catalog.json bash scripts/serve.sh
#
# Settings come from scripts/serve.env (copy scripts/serve.env.example), or from the file
# named by $SERVE_ENV; variables already set in the environment win over the file. Only the
# variables that are set become flags; everything else keeps the server's defaults (see
# `python -m flashrec serve --help` and docs/configuration.md).
#
#   SERVE_DRY_RUN=1   print the command (shell-quoted, one line) instead of running it
#   PYTHON            interpreter to use (default: python)
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/.." && pwd)"

# name of the variable -> flag of `flashrec serve`
flag_vars=(MODEL_PATH SID_VOCAB_FILE SID HOST PORT QUANTIZATION KV_CACHE_DTYPE
           MEM_FRACTION_STATIC CUDA_GRAPH_MAX_BS BATCH_SLOTS BEAM_WIDTH LPM_AGING_MS)
file_vars=("${flag_vars[@]}" CUDA_VISIBLE_DEVICES EXTRA_SERVER_ARGS PYTHON)

env_file="${SERVE_ENV:-$script_dir/serve.env}"
if [[ -n "${SERVE_ENV:-}" && ! -f "$env_file" ]]; then
  echo "serve.sh: SERVE_ENV=$env_file does not exist" >&2
  exit 2
fi
if [[ -f "$env_file" ]]; then
  # Remember what the caller set, read the file, then put the caller's values back.
  declare -A caller=()
  for v in "${file_vars[@]}"; do
    if [[ -n "${!v+x}" ]]; then caller[$v]="${!v}"; fi
  done
  set -a
  # shellcheck disable=SC1090
  source "$env_file"
  set +a
  for v in "${!caller[@]}"; do
    printf -v "$v" '%s' "${caller[$v]}"
    export "${v?}"
  done
fi

HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8000}"
if [[ -z "${MODEL_PATH:-}" ]]; then
  echo "serve.sh: MODEL_PATH is not set (in the environment or $env_file)" >&2
  exit 2
fi

args=()
for v in "${flag_vars[@]}"; do
  if [[ -n "${!v:-}" ]]; then
    flag="--$(tr '[:upper:]_' '[:lower:]-' <<< "$v")"
    args+=("$flag" "${!v}")
  fi
done
if [[ -n "${EXTRA_SERVER_ARGS:-}" ]]; then
  read -r -a extra <<< "$EXTRA_SERVER_ARGS"  # split on whitespace; no shell quoting inside
  args+=("${extra[@]}")
fi

export PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}"
python_bin="${PYTHON:-python}"
envs=("PYTHONPATH=$PYTHONPATH")
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  export CUDA_VISIBLE_DEVICES
  envs+=("CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES")
fi
cmd=("$python_bin" -m flashrec serve "${args[@]}")

if [[ "${SERVE_DRY_RUN:-0}" != "0" ]]; then
  printf '%q ' env "${envs[@]}" "${cmd[@]}"
  printf '\n'
  exit 0
fi
cd "$repo_root"
exec "${cmd[@]}"
