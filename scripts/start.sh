#!/usr/bin/env bash
# The start command: on a fresh machine (Python >= 3.11) makes .venv and installs this checkout
# into it, then or on a later run only what changed (scripts/venv.sh: no pip at all when
# pyproject.toml did not), then starts the app with `serve run`.
#   ./scripts/start.sh                         the CPU default, configs/local.yaml: http://127.0.0.1:8000/v1
#   ./scripts/start.sh configs/gpt-oss.yaml    another config (vLLM's needs `.[vllm]`: docs/deploy.md)
#   ./scripts/start.sh --reload                any arguments of `serve run`, after the config
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv.sh
. scripts/venv.sh
venv_ready
if [ $# -eq 0 ] || [[ $1 == -* ]]; then
  set -- configs/local.yaml "$@"
fi
exec serve run "$@"
