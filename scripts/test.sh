#!/usr/bin/env bash
# The test command: sets up what the tests need on a fresh machine, then runs them.
#   ./scripts/test.sh            all tests (starts the app once with `serve run`)
#   ./scripts/test.sh -k render  any pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[test]'

# The Codex CLI versions the end-to-end tests drive (npm; the binary ships in the package).
if [ ! -d tests/codex/node_modules ] || [ tests/codex/package-lock.json -nt tests/codex/node_modules ]; then
  npm ci --prefix tests/codex --no-audit --no-fund --loglevel=error
fi

ruff check serve_app tests loadtests
python -m pytest "$@"
