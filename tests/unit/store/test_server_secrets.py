"""Server secrets in the store (serve_app/store/server_secrets.py, `shared_secret`): one value
per name, whatever the order in which replicas starting at once propose theirs, on SQLite and
on PostgreSQL."""

from __future__ import annotations

import asyncio
import random
import uuid

from serve_app.store.sql import SqlResponseStore
from tests.unit.store.test_sql import postgres_url, store_url  # noqa: F401 - fixtures

STORES = 8  # store instances, each its own engine and connections: replicas on one database
ROUNDS = 12  # names raced for, each with its own random start offsets


async def test_a_secret_is_stored_once_and_never_replaced(store_url: str) -> None:  # noqa: F811
    store = SqlResponseStore(store_url)
    await store.start()
    name = f"key-{uuid.uuid4().hex}"
    try:
        assert await store.shared_secret(name, None) is None  # a read makes nothing
        assert await store.shared_secret(name, None) is None
        assert await store.shared_secret(name, "first") == "first"
        assert await store.shared_secret(name, "second") == "first"
        assert await store.shared_secret(name, None) == "first"
    finally:
        await store.close()
    reopened = SqlResponseStore(store_url)  # a restart keeps it
    await reopened.start()
    try:
        assert await reopened.shared_secret(name, "third") == "first"
    finally:
        await reopened.close()


async def test_replicas_proposing_at_once_all_end_with_one_key(store_url: str) -> None:  # noqa: F811
    """Many store instances (separate connection pools, as separate replicas have) propose
    different values for each name at once, each after a random pause of its own, so the
    inserts and reads interleave differently each round; every one of them gets the same
    value, one of those proposed, and it is the value stored."""
    stores = [SqlResponseStore(store_url) for _ in range(STORES)]
    # Started at once too: replicas on one fresh database create the schema together.
    await asyncio.gather(*(store.start() for store in stores))
    rng = random.Random(38)
    try:
        for _ in range(ROUNDS):
            name = f"race-{uuid.uuid4().hex}"
            proposals = [f"{name}-{index}" for index in range(STORES)]
            pauses = [rng.uniform(0, 0.02) for _ in stores]

            kept = await asyncio.gather(
                *(
                    propose(store, name, value, pause)
                    for store, value, pause in zip(stores, proposals, pauses, strict=True)
                )
            )
            assert len(set(kept)) == 1, kept
            assert kept[0] in proposals
            assert {await store.shared_secret(name, None) for store in stores} == {kept[0]}
    finally:
        await asyncio.gather(*(store.close() for store in stores))


async def propose(store: SqlResponseStore, name: str, value: str, pause: float) -> str | None:
    await asyncio.sleep(pause)
    return await store.shared_secret(name, value)
