"""A store made by the code before prompt-cache diagnostics, on SQLite and on PostgreSQL: the
schema and rows that code (commit 6307006^, no ``responses.prompt_fingerprint``) created and
wrote, frozen in tests/fixtures/old_store/before_fingerprint.json by its make.py. The current
code migrates it when it starts (once, whoever starts at the same time), keeps every row, and
answers diagnostics: a response kept without a fingerprint is ``unavailable`` (it exists, but
there is nothing to compare), another key's is ``comparison_response_not_found``.

PostgreSQL: the session's throwaway server (tests/unit/store/test_sql.py's ``postgres_url``,
skipped with its reason when there is none), a database of its own per test."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai.types.responses.response import (
    PromptCacheDiagnosticsCacheHit,
    PromptCacheDiagnosticsComparisonResponseNotFound,
    PromptCacheDiagnosticsUnavailable,
)
from sqlalchemy import MetaData, inspect, make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from serve_app.serving.http.auth import ApiKeys
from serve_app.store.base import PromptRecord, StoredResponse
from serve_app.store.sql import SqlResponseStore
from tests.support import API_KEY, MODEL, OTHER_API_KEY, REPO
from tests.support.helpers import in_process_api, sdk_client
from tests.unit.store.test_sql import postgres_url, store_url  # noqa: F401 - fixtures

FIXTURE = json.loads((REPO / "tests/fixtures/old_store/before_fingerprint.json").read_text())
IDS: dict[str, str] = FIXTURE["ids"]
OLD_RESPONSES: list[dict[str, Any]] = FIXTURE["rows"]["responses"]
INSTRUCTIONS = "Answer briefly and precisely. " * 40  # make.py's


async def load_old_store(url: str) -> None:
    """The old code's tables (its DDL) and rows, at ``url``."""
    engine = create_async_engine(url)
    dialect = engine.dialect.name
    async with engine.begin() as connection:
        for statement in FIXTURE["schema"][dialect]:
            await connection.execute(text(statement))
        tables = MetaData()
        await connection.run_sync(tables.reflect)
        for name, rows in FIXTURE["rows"].items():
            if rows:
                await connection.execute(tables.tables[name].insert(), rows)
        if dialect == "postgresql":  # as a restore does: new item rows number on after these
            await connection.execute(
                text(
                    "SELECT setval(pg_get_serial_sequence('items', 'row_id'), "
                    "(SELECT max(row_id) FROM items))"
                )
            )
    await engine.dispose()


@pytest.fixture
async def old_store(store_url: str) -> AsyncIterator[str]:  # noqa: F811
    """The URL of a store as the old code left it: a fresh SQLite file, or a fresh database
    on the session's PostgreSQL server."""
    if make_url(store_url).get_backend_name() == "sqlite":
        await load_old_store(store_url)
        yield store_url
        return
    name = f"old_{uuid.uuid4().hex[:12]}"
    admin = create_async_engine(store_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as connection:
        await connection.execute(text(f"CREATE DATABASE {name}"))
    url = make_url(store_url).set(database=name).render_as_string(hide_password=False)
    try:
        await load_old_store(url)
        yield url
    finally:
        async with admin.connect() as connection:
            await connection.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        await admin.dispose()


async def response_columns(url: str) -> list[str]:
    engine = create_async_engine(url)
    async with engine.connect() as connection:
        columns = await connection.run_sync(
            lambda sync: [column["name"] for column in inspect(sync).get_columns("responses")]
        )
    await engine.dispose()
    return columns


async def started(url: str) -> SqlResponseStore:
    store = SqlResponseStore(url)
    await store.start()
    return store


async def test_an_old_store_gains_the_column_at_start_and_keeps_its_rows(old_store: str) -> None:
    assert "prompt_fingerprint" not in await response_columns(old_store)
    store = await started(old_store)
    try:
        assert (await response_columns(old_store)).count("prompt_fingerprint") == 1
        for row in OLD_RESPONSES:
            stored = await store.get(row["id"])
            assert stored is not None and stored.owner == row["owner"]
            assert stored.response == json.loads(row["response_json"])
            assert stored.input_items == json.loads(row["input_items_json"])
            assert await store.prompt_record(row["id"], row["owner"]) == PromptRecord(None)
            assert await store.prompt_record(row["id"], "another owner") is None
        chain = await store.chain(IDS["chained"])
        assert [stored.id for stored in chain] == [IDS["base"], IDS["chained"]]
        old_items = [json.loads(row["item_json"]) for row in FIXTURE["rows"]["conversation_items"]]
        assert await store.conversation_items(IDS["conversation"]) == old_items
        # A response written since keeps its fingerprint (and its items new rows).
        owner = chain[-1].owner
        body = {"id": "resp_new", "status": "completed", "created_at": 1, "output": []}
        inputs = [{"id": "msg_new", "type": "message", "role": "user", "content": "new"}]
        await store.put(StoredResponse("resp_new", IDS["chained"], body, inputs, owner, '{"v": 1}'))
        assert await store.prompt_record("resp_new", owner) == PromptRecord('{"v": 1}')
        assert [stored.id for stored in await store.chain("resp_new")][-2:] == [
            IDS["chained"],
            "resp_new",
        ]
    finally:
        await store.close()
    # Started again (a restart, a replica scaled up later): nothing to do, nothing lost.
    again = await started(old_store)
    try:
        assert await again.prompt_record("resp_new", owner) == PromptRecord('{"v": 1}')
        assert await again.prompt_record(IDS["base"], owner) == PromptRecord(None)
    finally:
        await again.close()


async def test_replicas_starting_at_once_on_an_old_store_migrate_it_once(old_store: str) -> None:
    """Four stores (replicas) start together on the old schema, in staggered orders; each
    round starts from the old schema again."""
    rng = random.Random(7)
    engine = create_async_engine(old_store)

    async def start_after(delay: float) -> SqlResponseStore:
        await asyncio.sleep(delay)
        return await started(old_store)

    try:
        for _ in range(5):
            stores = await asyncio.gather(*(start_after(rng.random() / 50) for _ in range(4)))
            for store in stores:
                await store.close()
            assert (await response_columns(old_store)).count("prompt_fingerprint") == 1
            async with engine.begin() as connection:
                await connection.execute(
                    text("ALTER TABLE responses DROP COLUMN prompt_fingerprint")
                )
    finally:
        await engine.dispose()


def _compare(comparison_id: str) -> dict[str, Any]:
    return {"prompt_cache_options": {"comparison_response_id": comparison_id}}


async def test_an_old_stores_responses_answer_diagnostics_through_the_sdk(old_store: str) -> None:
    """The app started on the old store (in process, the two keys make.py's app had)."""
    keys = ApiKeys([API_KEY, OTHER_API_KEY])
    async with in_process_api(old_store, api_keys=keys) as api:
        client = sdk_client(api, API_KEY)
        assert (await client.responses.retrieve(IDS["chained"])).id == IDS["chained"]
        turn = {"model": MODEL, "instructions": INSTRUCTIONS, "input": "And then?"}
        continued = await client.responses.create(
            **turn, previous_response_id=IDS["chained"], **_compare(IDS["chained"])
        )
        assert continued.status == "completed"
        diagnostics = continued.prompt_cache_diagnostics
        assert isinstance(diagnostics, PromptCacheDiagnosticsUnavailable), diagnostics
        theirs = await client.responses.create(**turn, **_compare(IDS["other_key"]))
        assert isinstance(
            theirs.prompt_cache_diagnostics, PromptCacheDiagnosticsComparisonResponseNotFound
        )
        # The response made since keeps its fingerprint: the same turn again is a hit.
        again = await client.responses.create(
            **turn, previous_response_id=IDS["chained"], **_compare(continued.id)
        )
        assert isinstance(again.prompt_cache_diagnostics, PromptCacheDiagnosticsCacheHit)
        # The old conversation goes on.
        in_conversation = await client.responses.create(
            model=MODEL, input="Still there?", conversation=IDS["conversation"]
        )
        assert in_conversation.status == "completed"
