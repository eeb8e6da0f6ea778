"""`serve deploy` as operators run it (docs/deploy.md, "On a Ray cluster"): `ray start --head`
with Ray 2.60's token authentication, `serve deploy` of a config derived from configs/local.yaml
as the session app's is (tests/conftest.py), `serve status` until the app is RUNNING, one
request, `serve shutdown`, then the node stopped. One Ray start of its own, beside the session
app's cluster (ports, temp folder and token of its own); it uses none of the session fixtures.

Not `ray stop`: it stops every Ray node of this user on the machine (the session app's, and
any other run's on a shared machine). The node is stopped as `ray stop` stops one: SIGTERM to
`ray start --block`, which drains it (for RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, short here:
the app is shut down first) and stops its processes; what its session left is killed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

from tests.conftest import _test_config
from tests.support import API_KEY, REPO, serve_run

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 90
RUNNING_TIMEOUT_S = 180


def cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / args[0]), *args[1:]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def ray_head(env: dict[str, str], folder: Path, dashboard_port: int) -> Iterator[Path]:
    """`ray start --head --block` in a session of its own; yields its log. Stopped with SIGTERM
    (`ray stop`'s signal), then whatever is left of its session is killed."""
    log = folder / "ray_start.log"
    command = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--block",
        f"--port={serve_run.free_port()}",
        f"--dashboard-port={dashboard_port}",
        f"--ray-client-server-port={serve_run.free_port()}",
        "--dashboard-host=127.0.0.1",
        "--num-cpus=4",
        # Its own: a socket path under pytest's tmp_path would pass Unix's 107-byte limit.
        f"--temp-dir={folder / 'ray'}",
        "--disable-usage-stats",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        serve_run.end_leftovers(process.pid)


def status(env: dict[str, str], address: str) -> dict | None:
    """`serve status` as YAML, or None while the cluster cannot answer."""
    result = cli("serve", "status", f"--address={address}", env=env)
    if result.returncode != 0:
        return None
    return yaml.safe_load(result.stdout)


def test_serve_deploy_onto_a_cluster_ray_start_made_with_token_authentication() -> None:
    folder = Path(tempfile.mkdtemp(prefix="sd-", dir="/tmp"))
    dashboard_port, app_port = serve_run.free_port(), serve_run.free_port()
    address = f"http://127.0.0.1:{dashboard_port}"
    # As docs/deploy.md has it: RAY_AUTH_MODE=token and the cluster's token in the environment
    # of `ray start` and of every `serve` command (Ray 2.60 turns token authentication on for a
    # `ray start --head` only where a token exists, and the CLI sends the token only in token
    # mode); the API keys in the environment of the nodes, never in the config.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))},
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "5",
        "SERVE_APP_API_KEYS": API_KEY,
    }
    config = _test_config(folder, app_port, f"sqlite+aiosqlite:///{folder / 'responses.db'}")
    for deployment in config["applications"][0]["deployments"]:
        deployment["num_replicas"] = 1  # one of each: a deploy, not the routing tests
    path = folder / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        with ray_head(env, folder, dashboard_port) as log:
            deadline = time.monotonic() + START_TIMEOUT_S
            while status(env, address) is None:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(2)
            # Without the token the cluster refuses the CLI: what operators met (issue 47).
            tokenless = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
            refused = cli("serve", "status", f"--address={address}", env=tokenless)
            assert refused.returncode != 0 and "Unauthorized" in refused.stderr, refused

            deployed = cli("serve", "deploy", str(path), f"--address={address}", env=env)
            assert deployed.returncode == 0, deployed.stdout + deployed.stderr
            deadline = time.monotonic() + RUNNING_TIMEOUT_S
            while True:
                app = ((status(env, address) or {}).get("applications") or {}).get("serve_app")
                if app and app["status"] == "RUNNING":
                    break
                assert app is None or app["status"] != "DEPLOY_FAILED", app
                assert time.monotonic() < deadline, (app, log.read_text()[-3000:])
                time.sleep(2)

            answer = httpx.post(
                f"http://127.0.0.1:{app_port}/v1/responses",
                headers={"Authorization": f"Bearer {API_KEY}"},
                json={"model": "gpt-oss-120b", "input": "Say hello.", "max_output_tokens": 64},
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["output"], answer.json()

            stopped = cli("serve", "shutdown", "-y", f"--address={address}", env=env)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            deadline = time.monotonic() + 60
            while (status(env, address) or {}).get("applications"):
                assert time.monotonic() < deadline, "serve shutdown left the app"
                time.sleep(2)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
