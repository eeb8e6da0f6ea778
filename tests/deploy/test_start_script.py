"""The README's start command, scripts/start.sh, decides what to install as it says: on a
fresh environment it installs this checkout, on a second run nothing (no pip at all) until
pyproject.toml is newer than its last install, and then it starts `serve run` on
configs/local.yaml (or the config it is given, with any other arguments passed on). Run
against a stand-in environment (SERVE_APP_VENV): its `python` and `serve` only say what they
were asked, so nothing is installed or started; the serve tier starts the real app."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support import REPO

START = REPO / "scripts" / "start.sh"
STAMP = ".serve_app-installed"

# Each says what it was asked on a line of $CALLS; `pip show` finds nothing installed twice
# (scripts/one_harmony.sh then leaves the environment alone).
STAND_IN = """#!/usr/bin/env bash
echo "{name} $*" >> "$CALLS"
[ "$*" != "-m pip show -q openai-harmony" ]
"""


def stand_in_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("python", "serve"):
        exe = venv / "bin" / name
        exe.write_text(STAND_IN.format(name=name))
        exe.chmod(0o755)
    return venv


def start(venv: Path, *args: str) -> list[str]:
    """Run the script; what the stand-ins were asked, in order."""
    calls = venv.parent / "calls"
    calls.unlink(missing_ok=True)
    environment = {**os.environ, "SERVE_APP_VENV": str(venv), "CALLS": str(calls)}
    subprocess.run([str(START), *args], env=environment, check=True, timeout=60)
    return calls.read_text().splitlines()


def pip_installs(calls: list[str]) -> list[str]:
    return [call for call in calls if call.startswith("python -m pip install") and "-e" in call]


def test_a_fresh_environment_is_installed_then_the_app_started(tmp_path: Path) -> None:
    venv = stand_in_venv(tmp_path)
    calls = start(venv)
    assert pip_installs(calls) == ["python -m pip install -q -e ."]
    assert calls[-1] == "serve run configs/local.yaml"
    assert (venv / STAMP).is_file()


def test_a_second_run_calls_no_pip(tmp_path: Path) -> None:
    venv = stand_in_venv(tmp_path)
    start(venv)
    assert start(venv) == ["serve run configs/local.yaml"]


def test_a_newer_pyproject_is_installed_again(tmp_path: Path) -> None:
    venv = stand_in_venv(tmp_path)
    start(venv)
    os.utime(venv / STAMP, (0, 0))  # pyproject.toml changed since the last install
    assert pip_installs(start(venv)) == ["python -m pip install -q -e ."]
    assert start(venv) == ["serve run configs/local.yaml"]


def test_a_config_replaces_the_default_and_options_follow_it(tmp_path: Path) -> None:
    venv = stand_in_venv(tmp_path)
    start(venv)
    assert start(venv, "configs/gpt-oss.yaml") == ["serve run configs/gpt-oss.yaml"]
    assert start(venv, "--reload", "--port", "9000") == [
        "serve run configs/local.yaml --reload --port 9000"
    ]


def ready_for_tests(venv: Path) -> list[str]:
    """scripts/test.sh's `venv_ready test`; what the stand-ins were asked."""
    calls = venv.parent / "calls"
    calls.unlink(missing_ok=True)
    environment = {**os.environ, "SERVE_APP_VENV": str(venv), "CALLS": str(calls)}
    script = ". scripts/venv.sh && venv_ready test"
    subprocess.run(["bash", "-c", script], cwd=REPO, env=environment, check=True, timeout=60)
    return calls.read_text().splitlines() if calls.exists() else []


def test_the_tests_install_their_extra_once_and_it_holds_the_base_install(
    tmp_path: Path,
) -> None:
    started_first = stand_in_venv(tmp_path / "a")
    start(started_first)
    assert pip_installs(ready_for_tests(started_first)) == ["python -m pip install -q -e .[test]"]
    assert ready_for_tests(started_first) == []
    tested_first = stand_in_venv(tmp_path / "b")
    assert pip_installs(ready_for_tests(tested_first)) == ["python -m pip install -q -e .[test]"]
    assert start(tested_first) == ["serve run configs/local.yaml"]


def test_a_python_older_than_3_11_makes_no_environment(tmp_path: Path) -> None:
    old = tmp_path / "bin"
    old.mkdir()
    (old / "python3").write_text(
        "#!/bin/sh\n[ \"$1\" = -V ] && echo 'Python 3.10.12' && exit 0\nexit 1\n"
    )
    (old / "python3").chmod(0o755)
    venv = tmp_path / "venv"
    result = subprocess.run(
        [str(START)],
        env={**os.environ, "SERVE_APP_VENV": str(venv), "PATH": f"{old}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "Python >= 3.11" in result.stderr and "3.10.12" in result.stderr
    assert not venv.exists()
