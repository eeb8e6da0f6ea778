# shellcheck shell=bash
# The project's environment, for scripts/start.sh and scripts/test.sh (both source this from the
# repository's root). `venv_ready [EXTRA]` makes .venv if it is missing (Python >= 3.11), puts it
# first on PATH, and installs this checkout into it (`pip install -e .`, or `.[EXTRA]`) only when
# that install was never done or pyproject.toml changed since: a stamp inside .venv per install
# (the `test` extra's holds the base install too; delete them to force one). SERVE_APP_VENV names
# another environment.

venv_ready() {
  local extra=${1:-} venv=${SERVE_APP_VENV:-.venv}
  local spec=. stamp="$venv/.serve_app-installed"
  if [ -n "$extra" ]; then
    spec=".[$extra]"
    stamp="$stamp-$extra"
  fi
  if [ ! -x "$venv/bin/python" ]; then
    if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "serve_app needs Python >= 3.11, and python3 is $(python3 -V 2>/dev/null || echo missing):" \
        "make $venv with one (e.g. python3.12 -m venv $venv), then run this again" >&2
      return 1
    fi
    python3 -m venv "$venv"
  fi
  VIRTUAL_ENV=$(cd "$venv" && pwd)
  export VIRTUAL_ENV PATH="$VIRTUAL_ENV/bin:$PATH"
  unset PYTHONHOME
  if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then
    return 0
  fi
  echo "Installing serve_app ($spec) into $venv" >&2
  python -m pip install -q --upgrade pip
  python -m pip install -q -e "$spec"
  # One distribution of harmony's module, in an environment kept from before too.
  ./scripts/one_harmony.sh python
  touch "$stamp" "$venv/.serve_app-installed"
}
