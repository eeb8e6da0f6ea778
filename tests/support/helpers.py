"""Shared test helpers: Codex capture fixtures, harmony decoding, the app in-process (formerly
tests/support/helpers.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import uvicorn
from fastapi import FastAPI
from openai import AsyncOpenAI
from starlette.types import ASGIApp

from serve_app.config import AppArgs
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.encoding import get_encoding
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.serving.engine.client import EngineClient, InProcessEngineClient
from serve_app.serving.ingress import app_store, create_api
from tests.support import API_KEY, API_KEY_ENV, REPO

if TYPE_CHECKING:
    import httpx2

# The JavaScript clients (npm, installed by scripts/test.sh): the AI SDK, zod.
JS_DIR = REPO / "tests" / "js"
# Real Codex requests (0.169 and 0.63), captured against a local server: by scenario, in order.
CODEX_CAPTURES = REPO / "tests" / "fixtures" / "codex"
CAPTURES = sorted(CODEX_CAPTURES.glob("*/req_*.json"))
# Codex's shell tool, as the scripted turns that call it (``SUM-CALLS``) name it.
EXEC_TOOL = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
# The function tool the scripted engine calls on "SDK-TOOL" and "REF-TOOL" turns.
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def capture_body(name: str) -> dict[str, Any]:
    """The request body of a capture, e.g. ``capture_body("tool/req_002")``."""
    return json.loads((CODEX_CAPTURES / f"{name}.json").read_text())["body"]


def decode(token_ids: list[int]) -> str:
    return get_encoding().decode_utf8(token_ids)


@contextlib.asynccontextmanager
async def in_process_api(
    db: Path | str,
    args: AppArgs | None = None,
    *,
    engine: SimulatedEngineConfig | None = None,
    engine_client: Callable[[EngineClient], EngineClient] | None = None,
    **options: Any,
) -> AsyncIterator[FastAPI]:
    """The ingress's own FastAPI app (the one every ingress replica serves) in this process.

    ``db``: an SQLite file, or a store URL (e.g. the session's PostgreSQL). ``engine``: the
    simulated engine's config (default: fast and unscripted); the engine itself is the app's
    ``state.engine``, for tests that look inside it. With ``args.moderation``, its engine (the
    simulated one, playing gpt-oss-safeguard) runs here too, as ``state.moderation_engine``,
    unless ``options`` bring a ``moderation`` client of their own. ``engine_client``: wraps the
    in-process engine client (a test's refusals, delays). ``options`` go to ``create_api``.
    """
    args = args or AppArgs()
    store = app_store(db if isinstance(db, str) else f"sqlite+aiosqlite:///{db}", args)
    await store.start()
    simulated = SimulatedEngine(engine or SimulatedEngineConfig(decode_tokens_per_s=50_000))
    await simulated.start()
    classifier = None
    if args.moderation is not None and "moderation" not in options:
        classifier = SimulatedEngine(
            SimulatedEngineConfig.model_validate(args.moderation.engine.options)
        )
        await classifier.start()
        options["moderation"] = InProcessEngineClient(classifier)
    try:
        client: EngineClient = InProcessEngineClient(simulated)
        api = create_api(
            args,
            engine_client(client) if engine_client else client,
            ReasoningVault("k"),
            store,
            **options,
        )
        api.state.engine = simulated
        api.state.moderation_engine = classifier
        try:
            yield api
        finally:
            await api.state.service.aclose()
    finally:
        await simulated.shutdown()
        if classifier is not None:
            await classifier.shutdown()
        await store.close()


@contextlib.asynccontextmanager
async def on_uvicorn(app: ASGIApp, **options: Any) -> AsyncIterator[str]:
    """``app`` served by uvicorn on a free port of 127.0.0.1 (real HTTP and WebSockets); its
    http:// URL. ``options``: more of uvicorn's Config."""
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="off", **options
        )
    )
    # Signals stay the test runner's (uvicorn would take SIGINT and SIGTERM for itself).
    server.capture_signals = contextlib.nullcontext
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = server.force_exit = True
        await serving


def sdk_client(api: FastAPI, key: str = "unused") -> AsyncOpenAI:
    """The openai SDK talking to an in-process app."""
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://app")
    return AsyncOpenAI(base_url="http://app/v1", api_key=key, http_client=http, max_retries=0)


def scrape_metrics(app_url: str, replicas: int = 2, tries: int = 40) -> dict[str, str]:
    """/metrics of every ingress replica (each keeps its own counters), by replica id."""
    import httpx

    pages: dict[str, str] = {}
    for _ in range(tries):
        response = httpx.get(f"{app_url}/metrics", timeout=30)
        pages[response.headers["x-serve-app-replica"]] = response.text
        if len(pages) == replicas:
            break
    return pages


def run_locust(
    app_url: str, prefix: Path, users: int, seconds: int, **env: str
) -> subprocess.CompletedProcess[str]:
    """Replay the sample Codex traces with loadtests/locustfile.py, headless; CSVs at ``prefix``.
    Its requests carry the session app's ``API_KEY``."""
    locust = Path(sys.executable).parent / "locust"
    command = [str(locust), "-f", str(REPO / "loadtests" / "locustfile.py"), "--headless"]
    command += ["-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--stop-timeout", "60"]
    command += ["--host", app_url, "--csv", str(prefix), "--only-summary"]
    return subprocess.run(
        command,
        env={**os.environ, API_KEY_ENV: API_KEY, **env},
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )


def recording_http_client(
    bodies: list[dict[str, Any]], *, asynchronous: bool = False
) -> httpx2.Client | httpx2.AsyncClient:
    """An HTTP client that appends the JSON body of every request it sends to ``bodies``: the
    transport to give a Python client built on the openai SDK (LangChain, pydantic-ai), to see
    what it sent. It changes nothing of what is sent: it is the SDK's own kind of client
    (httpx2, the transport of openai 3.5x; pydantic-ai needs it too)."""
    import httpx2

    def record(request: httpx2.Request) -> None:
        if request.content:
            bodies.append(json.loads(request.content))

    if asynchronous:

        async def record_async(request: httpx2.Request) -> None:
            record(request)

        return httpx2.AsyncClient(event_hooks={"request": [record_async]}, timeout=60)
    return httpx2.Client(event_hooks={"request": [record]}, timeout=60)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def node_json(script: str, needs: str) -> Any:
    """Run the ES module ``script`` with node and parse the JSON it prints. It is written beside
    tests/js/node_modules so its imports resolve there; skipped where node or the npm package
    ``needs`` is missing."""
    import shutil
    import tempfile

    import pytest

    node = shutil.which("node")
    if node is None or not (JS_DIR / "node_modules" / needs).is_dir():
        pytest.skip(f"needs node and {needs} in tests/js/node_modules (npm ci in tests/js)")
    with tempfile.NamedTemporaryFile("w", suffix=".mjs", dir=JS_DIR, prefix=".run_") as file:
        file.write(script)
        file.flush()
        done = subprocess.run([node, file.name], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
