"""Run one scenario of a script in tests/js (a real JavaScript client) against the app.

Each script prints one JSON object as its last line: ``ok``, its ``result`` (or ``error``)
and the ``requests`` it sent with the app's statuses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import pytest

from tests.support.helpers import JS_DIR

TIMEOUT_S = 300


def run(
    script: str, scenario: str, app_url: str, timeout_s: float = TIMEOUT_S, **env: str
) -> dict[str, Any]:
    """The scenario's output; the test fails when the client threw, skips without Node or
    ``tests/js/node_modules`` (``npm ci --prefix tests/js``)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the JS client tests need Node.js 20")
    if not (JS_DIR / "node_modules").is_dir():
        pytest.skip("tests/js/node_modules is missing: run `npm ci --prefix tests/js`")
    result = subprocess.run(
        [node, str(JS_DIR / script), scenario, app_url],
        cwd=JS_DIR,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **env},
    )
    try:
        output = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        exit_code = result.returncode
        pytest.fail(f"no JSON from {script} {scenario} (exit {exit_code}):\n{result.stderr}")
    assert output["ok"], (
        f"the client failed: {json.dumps(output['error'], indent=1)}\n"
        f"requests sent: {json.dumps(output['requests'], indent=1)[:4000]}"
    )
    assert result.returncode == 0, result.stderr
    return output
