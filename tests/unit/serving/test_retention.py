"""Retention through the API, on the in-process app (SQLite file and PostgreSQL): a response
older than ``store.retention_days`` answers every route as an unknown id does (404, OpenAI's
error shape), before any sweep; the replica's sweep then deletes it and keeps the fresh."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from serve_app.config import AppArgs, StoreConfig
from serve_app.serving.retention import RetentionSweep
from tests.support import MODEL
from tests.support.helpers import in_process_api
from tests.unit.store.test_sql import postgres_url, store_url  # noqa: F401 - fixtures

DAY = 86400


@pytest.fixture
async def app(store_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, object]]:  # noqa: F811
    args = AppArgs(store=StoreConfig(retention_days=30, sweep_batch=2))
    async with in_process_api(store_url, args) as api:
        transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            yield client, api


async def age(store_url: str, response_id: str, seconds: int) -> None:  # noqa: F811
    """Move a stored response's creation back by ``seconds`` (the clock forward, for it)."""
    engine = create_async_engine(store_url)
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE responses SET created_at = created_at - :s WHERE id = :id"),
            {"s": seconds, "id": response_id},
        )
    await engine.dispose()


async def create(client: httpx.AsyncClient, previous: str | None = None) -> str:
    body = {"model": MODEL, "input": "hello", "store": True}
    if previous:
        body["previous_response_id"] = previous
    answer = await client.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def without_id(body: dict, response_id: str) -> dict:
    """An error body with the id it names blanked, to compare with another id's."""
    error = dict(body["error"])
    error["message"] = error["message"].replace(response_id, "ID")
    return {**body, "error": error}


async def routes(client: httpx.AsyncClient, response_id: str) -> list[httpx.Response]:
    return [
        await client.get(f"/v1/responses/{response_id}"),
        await client.get(f"/v1/responses/{response_id}/input_items"),
        await client.delete(f"/v1/responses/{response_id}"),
        await client.post(
            "/v1/responses",
            json={"model": MODEL, "input": "more", "previous_response_id": response_id},
        ),
    ]


async def test_an_expired_response_is_an_unknown_id_on_every_route(app, store_url) -> None:  # noqa: F811
    client, _ = app
    old, fresh = await create(client), await create(client)
    await age(store_url, old, 30 * DAY - 60)  # a minute short of 30 days: still there
    for path in (f"/v1/responses/{old}", f"/v1/responses/{old}/input_items"):
        assert (await client.get(path)).status_code == 200
    await age(store_url, old, 120)  # now a minute past
    expired = await routes(client, old)
    unknown = await routes(client, "resp_0123456789abcdef0123456789abcdef")
    assert [answer.status_code for answer in expired] == [404, 404, 404, 404]
    for got, reference in zip(expired, unknown, strict=True):
        assert got.status_code == reference.status_code
        assert without_id(got.json(), old) == without_id(
            reference.json(), "resp_0123456789abcdef0123456789abcdef"
        )
    assert (await client.get(f"/v1/responses/{fresh}")).status_code == 200


async def test_the_sweep_deletes_expired_chains_and_keeps_the_fresh(app, store_url) -> None:  # noqa: F811
    client, api = app
    chain = [await create(client)]
    for _ in range(4):
        chain.append(await create(client, chain[-1]))
    store = api.state.background._store  # the app's own store
    config = StoreConfig(retention_days=30, sweep_batch=2)
    await RetentionSweep(store, config).sweep()  # what other tests left on PostgreSQL
    for response_id in chain[:3]:
        await age(store_url, response_id, 31 * DAY)
    assert await RetentionSweep(store, config).sweep() == 3  # in batches of 2: 2, then 1
    kept = set(await store.ids())  # (PostgreSQL's also holds other tests' responses)
    assert set(chain[3:]) <= kept and not set(chain[:3]) & kept
    # The rest of the chain continues from where it now starts.
    answer = await client.post(
        "/v1/responses", json={"model": MODEL, "input": "go on", "previous_response_id": chain[-1]}
    )
    assert answer.status_code == 200, answer.text
    assert await RetentionSweep(store, config).sweep() == 0
