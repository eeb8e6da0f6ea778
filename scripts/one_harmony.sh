#!/usr/bin/env bash
# Leaves oss-harmony the one distribution of the `openai_harmony` module in the environment of
# the given Python (serve_app/harmony/distribution.py says why). A fresh install needs nothing;
# an environment kept from before this project depended on oss-harmony still has
# openai-harmony, and uninstalling it deletes the module files both installed: so oss-harmony
# is reinstalled after.
#   scripts/one_harmony.sh .venv/bin/python
set -euo pipefail
py=${1:?usage: one_harmony.sh PYTHON}
if "$py" -m pip show -q openai-harmony >/dev/null 2>&1; then
  version=$("$py" -c 'import importlib.metadata as m; print(m.version("oss-harmony"))')
  "$py" -m pip uninstall -q -y openai-harmony
  "$py" -m pip install -q --force-reinstall --no-deps "oss-harmony==$version"
fi
"$py" -m serve_app.harmony.distribution >/dev/null
