"""Session fixtures: the app runs once per test session, exactly as users start it.

`serve run` is given configs/local.yaml with six changes only: a free port, the scripted
engine turns in tests/fixtures/engine_script.yaml, two replicas of each deployment (so
routing and the shared store are tested), small engine limits (so overload is reachable), a
response store in the session's temp folder, and the moderation model its config comments out
(the simulated engine playing gpt-oss-safeguard, tests/fixtures/moderation_script.yaml);
and two API keys (``API_KEY`` and ``OTHER_API_KEY`` of tests/support: two tenants), so the app
runs closed, as on a cluster, and every test sends a key. One Ray start-up serves every app
test (started, awaited, joined and stopped by tests/support/serve_run.py), but one:
tests/app/test_serve_deploy.py starts a Ray node of its own (`ray start`, then `serve deploy`,
as operators run it).

Two tiers, chosen by folder: every test under ``tests/app/`` and ``tests/clients/``
(``SERVE_FOLDERS`` below) is marked ``serve`` at collection, so ``pytest -m "not serve"`` runs the
rest without starting Ray, and plain ``pytest`` runs all. A test elsewhere that asks for the
running app (``APP_FIXTURES``) is a collection error, unless it is marked ``serve`` itself
(tests/vllm_cpu, a stage of its own). With ``SERVE_APP_TEST_URL`` set, the ``app_url`` tests run
against an app already running there (``python -m tests.local_app``) without Ray too.

With ``SERVE_APP_TEST_ENGINE=vllm`` (the vLLM stage of scripts/test.sh, in its own environment
with vllm-cpu) the engine is the real vLLM engine instead, on a tiny random gpt-oss checkpoint
written by scripts/tiny_gpt_oss.py, one replica.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml
from fastapi import FastAPI
from openai import OpenAI

from serve_app.serving.http.auth import ApiKeys
from tests.support import (
    API_KEY,
    ENGINE_SCRIPT,
    MCP_TEST_BOUNDS,
    MODERATION_SCRIPT,
    OTHER_API_KEY,
    REPO,
    # Imported for its effect: it names the MCP test servers' ports in $SERVE_APP_MCP_ALLOW
    # before the session app starts (the app inherits it), whichever tests this run collects
    # (the PostgreSQL stage's Agents SDK test imports it only when it runs).
    mcp_app,  # noqa: F401
    postgres,
    serve_run,
)
from tests.support.fast_path import fast_path_env
from tests.support.helpers import in_process_api

REPLICAS = 2  # of the ingress and of the engine
ENGINE_MAX_ONGOING = 8
ENGINE_MAX_QUEUED = 4  # per ingress replica (each holds its own handle)
VLLM_MAX_FREE_TOKENS = 16  # the vLLM stage's constraint_max_free_tokens
# The app's response store: "sqlite" (a file) or "postgresql" (a throwaway local server).
STORE_BACKEND = os.environ.get("SERVE_APP_TEST_STORE", "sqlite")
# The app's engine: "simulated" (scripted turns) or "vllm" (vLLM on CPU, random weights).
ENGINE = os.environ.get("SERVE_APP_TEST_ENGINE", "simulated")
# With SERVE_APP_TEST_FAST_PATH=1 (the fast-path stage of scripts/test.sh) `serve run` gets
# configs/fast-path.env: HAProxy in front, direct ingress (tests/support/fast_path.py).


# How many examples the property tests draw (tests/unit/serving/http/test_ingress_fuzz.py takes its
# volume from here): `thorough`, what scripts/test.sh (and so CI) runs, sends the fuzz tests
# over 10,000 requests; the default keeps the fast tier (`pytest -m "not serve"`) fast with 50
# per test. Pick one with pytest's `--hypothesis-profile`.
# (The vLLM stage's environment has no Hypothesis, nor a test that uses it.)
with contextlib.suppress(ImportError):
    from hypothesis import settings

    settings.register_profile("thorough", max_examples=2600)
    settings.register_profile("quick", max_examples=50)
    settings.load_profile("quick")


def _test_config(tmp: Path, port: int, store_url: str) -> dict:
    config = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    app = config["applications"][0]
    if ENGINE == "vllm":
        app["args"]["engine"] = _vllm_engine(tmp)
    else:
        app["args"]["engine"]["options"]["script"] = str(ENGINE_SCRIPT)
    app["args"]["store"] = {"url": store_url}
    app["args"]["tools"] = MCP_TEST_BOUNDS
    # The moderation model (tests/app/test_moderation.py), the simulated engine playing
    # gpt-oss-safeguard on a deployment of its own: one replica that reserves no CPU (the
    # ingress and engine replicas reserve the machine's two cores; a tenth more left the second
    # ingress replica unscheduled, and every two-replica test ran on one).
    app["args"]["moderation"] = {
        "engine": {"kind": "simulated", "options": {"script": str(MODERATION_SCRIPT)}},
        "timeout_s": 10,
    }
    app["deployments"].append(
        {"name": "ModerationEngine", "num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}
    )
    for deployment in app["deployments"]:
        if deployment["name"] == "ModerationEngine":
            continue
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
    return config


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
def _serve_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[serve_run.ServeRun]:
    tmp = tmp_path_factory.mktemp("serve")
    postgres_data = None
    if STORE_BACKEND == "postgresql":
        try:
            store_url, postgres_data = postgres.start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            pytest.skip(f"PostgreSQL not available, app tests on it skipped: {error}")
    else:
        store_url = f"sqlite+aiosqlite:///{tmp / 'responses.db'}"
    env = {
        "SERVE_APP_API_KEYS": f"{API_KEY},{OTHER_API_KEY}",
        "RAY_USAGE_STATS_ENABLED": "0",
        # vllm-cpu: KV cache size in GiB (CPU memory), no pinning of its threads to cores.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        **fast_path_env(serve_run.free_port),
    }
    try:
        config = _test_config(tmp, serve_run.free_port(), store_url)
        with serve_run.running(config, tmp, env) as run:
            _every_ingress_replica_answers(run)
            yield run
    finally:
        if postgres_data is not None:
            postgres.stop(postgres_data)


def _every_ingress_replica_answers(run: serve_run.ServeRun) -> None:
    """`/health` answers once one ingress replica does; the tests that need two would fail one
    by one, far from the cause (a replica the cluster cannot place): the session fails here."""
    from tests.support.replicas import wait_for_ingress_replicas

    try:
        wait_for_ingress_replicas(run.url, REPLICAS, timeout_s=90)
    except AssertionError as error:
        pytest.fail(f"{error} at start (resources?):\n{run.log_tail()}")


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


@pytest.fixture(scope="session")
def app_cluster(app_url: str, _serve_run: serve_run.ServeRun) -> Iterator[None]:
    """This test process joined to the app's Ray cluster, to look inside or break replicas: by
    its address, not ``"auto"`` (the newest cluster on the machine, maybe another's)."""
    import ray

    serve_run.join(_serve_run)
    yield
    ray.shutdown()


@pytest.fixture
def client(app_url: str) -> OpenAI:
    """The openai SDK on the running app; no retries, so a 429 or a 5xx is seen, not hidden."""
    return OpenAI(base_url=f"{app_url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def engine_handle(app_cluster: None):
    from ray import serve

    return serve.get_deployment_handle("EngineDeployment", app_name="serve_app")


# The folders (under tests/) whose tests run against the running app: the `serve` tier.
SERVE_FOLDERS = frozenset({"app", "clients"})
# The fixtures that reach the running app (directly or through a fixture of their own).
APP_FIXTURES = frozenset({"app_url", "app_cluster", "engine_handle", "_serve_run"})
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test in a serve folder as ``serve``, so ``pytest -m "not serve"`` is the tier
    that never starts Ray; a test elsewhere that needs the app is misplaced: it would start Ray
    in the fast tier. So is a test module directly in tests/: the folders say what a test is
    (docs/testing.md). Fault tests kill replicas of the shared app: run them last."""
    needs_app, loose = [], set()
    for item in items:
        parts = item.path.relative_to(TESTS).parts if item.path.is_relative_to(TESTS) else ()
        if len(parts) == 1:
            loose.add(parts[0])
        if parts and parts[0] in SERVE_FOLDERS:
            item.add_marker(pytest.mark.serve)
        elif item.get_closest_marker("serve") is None and APP_FIXTURES.intersection(
            getattr(item, "fixturenames", ())  # the fixture closure: fixtures built on app_url too
        ):
            needs_app.append(item.nodeid)
    if needs_app:
        raise pytest.UsageError(
            "these tests use the running app: move them to tests/app/ or tests/clients/ "
            f"(or mark them serve): {', '.join(needs_app)}"
        )
    if loose:
        raise pytest.UsageError(
            f"test modules directly in tests/: {', '.join(sorted(loose))}; a module's tests go "
            "in tests/unit/<package>/test_<module>.py, the running app's in tests/app/, the "
            "real clients' in tests/clients/ (docs/testing.md)"
        )
    items.sort(key=lambda item: item.get_closest_marker("faults") is not None)
