"""The ingress's FastAPI app on uvicorn, without Ray: a fast loop for the app tests.

    python -m tests.local_app --port 8123 &
    SERVE_APP_TEST_URL=http://127.0.0.1:8123 python -m pytest tests/clients/test_openai_sdk.py

Same API, the same scripted simulated engine (tests/fixtures/engine_script.yaml) and API keys
(tests/support's ``API_KEY`` and ``OTHER_API_KEY``; $SERVE_APP_API_KEYS overrides them) as the
session app of tests/conftest.py, and as there the reasoning key the store generates (or
$SERVE_APP_REASONING_KEY); one process, a store in a temporary folder. Tests that look inside
Ray (``engine_handle``, ``app_cluster``) still need the real app.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from serve_app.config import AppArgs, SecretArgs, ToolArgs
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.serving.engine.client import InProcessEngineClient
from serve_app.serving.http.auth import ApiKeys
from serve_app.serving.ingress import app_store, create_api
from serve_app.serving.reasoning_keys import shared_vault
from tests.support import API_KEY, ENGINE_SCRIPT, MCP_TEST_BOUNDS, OTHER_API_KEY


@contextlib.asynccontextmanager
async def local_api(
    decode_tokens_per_s: float, tools: ToolArgs | None = None
) -> AsyncIterator[FastAPI]:
    """The app this module serves, unserved: scripts/record_traffic.py wraps it in its recorder."""
    folder = Path(tempfile.mkdtemp(prefix="serve_app_local_"))
    # The MCP tests' short timeouts, beside the tool servers the command line names.
    tools = (tools or ToolArgs()).model_copy(update=MCP_TEST_BOUNDS)
    args = AppArgs(default_max_output_tokens=4096, tools=tools)
    store = app_store(f"sqlite+aiosqlite:///{folder / 'responses.db'}", args)
    await store.start()
    engine = SimulatedEngine(
        SimulatedEngineConfig(script=str(ENGINE_SCRIPT), decode_tokens_per_s=decode_tokens_per_s)
    )
    await engine.start()
    api = create_api(
        args,
        InProcessEngineClient(engine),
        await shared_vault(SecretArgs().resolved(), store),
        store,
        api_keys=ApiKeys.from_env(SecretArgs(api_keys=[API_KEY, OTHER_API_KEY])),
    )
    try:
        yield api
    finally:
        api.state.service.close()  # its render workers
        await engine.shutdown()
        await store.close()


async def serve(port: int, decode_tokens_per_s: float, tools: ToolArgs | None = None) -> None:
    async with local_api(decode_tokens_per_s, tools) as api:
        config = uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning")
        await uvicorn.Server(config).serve()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--decode-tokens-per-s", type=float, default=2000)
    # gpt-oss's browser and python: the MCP tool servers that run them (AppArgs.tools).
    parser.add_argument("--browser-server-url")
    parser.add_argument("--python-server-url")
    args = parser.parse_args()
    tools = ToolArgs(
        browser_server_url=args.browser_server_url, python_server_url=args.python_server_url
    )
    asyncio.run(serve(args.port, args.decode_tokens_per_s, tools))


if __name__ == "__main__":
    main()
