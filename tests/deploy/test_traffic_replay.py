"""Every recorded client's bytes through every shipped config (issue 45): each file of the corpus
(tests/fixtures/traffic/, real clients' requests and WebSocket messages, recorded by
scripts/record_traffic.py) replayed byte for byte (tests/support/traffic.py says what a replay
changes) through configs/local.yaml, configs/gpt-oss.yaml and configs/gpt-oss-shared-kv.yaml.

Each config's app is the ingress's own FastAPI app built in this process from the config's
``args`` as the ingress replica builds it (its API keys as its ``http_options.host`` requires,
its reasoning key generated in its store, its tools and limits as shipped, no environment
overrides), with two things replaced: the engine, by the scripted simulated engine
(tests/fixtures/engine_script.yaml, decoding fast), and the store, by a temporary SQLite file.
It is served on uvicorn (real HTTP and WebSockets). A file is answered as recorded (each status
and end the recording's, every event valid as the openai SDK types it), or as
tests/fixtures/traffic/expected.yaml says: a shipped config that refuses a body the table says
it answers fails, naming the file, the config and the error.
"""

from __future__ import annotations

import fnmatch
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from serve_app.config import (
    API_KEYS_ENV,
    API_KEYS_FILE_ENV,
    MCP_ALLOW_ENV,
    REASONING_KEY_ENV,
    STORE_URL_ENV,
    AppArgs,
)
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.serving.engine.client import InProcessEngineClient
from serve_app.serving.http.auth import ApiKeys
from serve_app.serving.http.exposure import Exposure, api_access
from serve_app.serving.ingress import app_store, create_api
from serve_app.serving.reasoning_keys import shared_vault
from tests.support import API_KEY, ENGINE_SCRIPT, REPO
from tests.support.helpers import on_uvicorn
from tests.support.mcp_app import PORTS
from tests.support.traffic import (
    DOCS,
    SHIPPED,
    Deviation,
    corpus_files,
    docs_with_table,
    expected_refusal,
    file_id,
    refusals,
    replay,
    replay_table,
)

# The environment an operator may set, unset here: each config as it ships.
OVERRIDES = [API_KEYS_ENV, API_KEYS_FILE_ENV, MCP_ALLOW_ENV, REASONING_KEY_ENV, STORE_URL_ENV]
# The scripted turns, as fast as the machine goes: the replay is the protocol's, not timing's.
ENGINE = SimulatedEngineConfig(
    script=str(ENGINE_SCRIPT), decode_tokens_per_s=100_000, prefill_tokens_per_s=10_000_000
)
# No test MCP server runs: a config that allows none refuses the tool before reaching it.
ORIGINS = {role: f"http://127.0.0.1:{port}" for role, port in PORTS.items()}
FILES = corpus_files()


def shipped_args(name: str, db: Path) -> tuple[AppArgs, str]:
    """The config's app args with its store on ``db``, and its Serve host."""
    config = yaml.safe_load((REPO / "configs" / name).read_text())
    (app,) = config["applications"]
    args = AppArgs.model_validate(app["args"])
    store = args.store.model_copy(update={"url": f"sqlite+aiosqlite:///{db}"})
    return args.model_copy(update={"store": store}), config["http_options"]["host"]


def required_keys(args: AppArgs, host: str) -> ApiKeys:
    """Keys only where the config cannot start without them (beyond loopback, not open)."""
    beyond = Exposure(host, nodes=1).beyond_loopback()
    return ApiKeys([API_KEY] if beyond and not args.allow_open_api else [])


@pytest.fixture(scope="module", params=SHIPPED)
async def shipped(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[str, str]]:
    """``(config name, URL)``: the config's app on uvicorn, scripted engine, temporary store."""
    with pytest.MonkeyPatch.context() as env:
        for name in OVERRIDES:
            env.delenv(name, raising=False)
        db = tmp_path_factory.mktemp("replay") / "responses.db"
        args, host = shipped_args(request.param, db)
        store = app_store(args.store.resolved_url(), args)
        await store.start()
        engine = SimulatedEngine(ENGINE)
        await engine.start()
        keys = required_keys(args, host)
        api = create_api(
            args,
            InProcessEngineClient(engine),
            await shared_vault(args.secrets.resolved(), store),
            store,
            api_keys=keys,
            access=api_access(keys.enabled, Exposure(host, nodes=1), args.allow_open_api),
        )
        api.state.service.warm()  # its render workers, as the ingress replica starts them
        try:
            async with on_uvicorn(api) as url:
                yield request.param, url
        finally:
            api.state.service.close()
            await engine.shutdown()
            await store.close()


def matches(deviation: Deviation, refusal: dict[str, Any]) -> bool:
    return (deviation.status, deviation.param) == (refusal["status"], refusal["param"])


@pytest.mark.parametrize("path", FILES, ids=file_id)
async def test_every_recorded_body_through_every_shipped_config(
    shipped: tuple[str, str], path: Path
) -> None:
    config, url = shipped
    refusal = expected_refusal(path, config)
    deviation = await replay(path, url, API_KEY, ORIGINS)
    if refusal is None:
        assert deviation is None, f"configs/{config} refuses {file_id(path)}: {deviation}"
    else:
        assert deviation is not None and matches(deviation, refusal), (
            f"configs/{config} on {file_id(path)}: expected {refusal['status']} "
            f"{refusal['param']!r} ({refusal['why']}), got {deviation or 'as recorded'}"
        )


def test_the_table_names_only_recorded_files_and_shipped_configs() -> None:
    names = [file_id(path) for path in FILES]
    for refusal in refusals():
        assert set(refusal["configs"]) <= set(SHIPPED), refusal
        for pattern in refusal["files"]:
            assert fnmatch.filter(names, pattern), f"{pattern} matches no corpus file"


def test_every_shipped_config_is_replayed() -> None:
    shipped = sorted(path.name for path in (REPO / "configs").glob("*.yaml"))
    assert sorted(SHIPPED) == shipped


def test_docs_show_the_replay_table() -> None:
    """docs/testing.md's table is the corpus's and expected.yaml's (`python
    scripts/record_traffic.py --table` writes it)."""
    text = DOCS.read_text()
    assert docs_with_table(text, replay_table(FILES)) == text, "the replay table is stale"
