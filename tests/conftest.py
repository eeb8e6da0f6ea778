"""Session fixtures: the app runs once per test session, exactly as users start it.

`serve run` is given configs/local.yaml with two changes only: a free port, and the scripted
engine turns in tests/fixtures/engine_script.yaml. One Ray start-up serves every app test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helpers import REPO

ENGINE_SCRIPT = REPO / "tests" / "fixtures" / "engine_script.yaml"
STARTUP_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _test_config(tmp: Path, port: int) -> Path:
    config = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    app = config["applications"][0]
    app["args"]["engine"]["options"]["script"] = str(ENGINE_SCRIPT)
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="session")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("serve")
    port = _free_port()
    config = _test_config(tmp, port)
    log_path = tmp / "serve.log"
    env = {
        **os.environ,
        "SERVE_APP_REASONING_KEY": "test-reasoning-key",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "serve"), "run", str(config)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, log_path)
        yield url
    finally:
        _stop(process)


def _wait_healthy(url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"serve run exited:\n{log_path.read_text()[-5000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    _stop(process)
    raise RuntimeError(f"the app did not become healthy:\n{log_path.read_text()[-5000:]}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    # Ctrl-C is how users stop `serve run`: it shuts the app and its local Ray down.
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
