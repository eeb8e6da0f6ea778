"""Server secrets in the store (serve_app/store/server_secrets.py, `shared_secret`): one value
per name, whatever the order in which replicas starting at once propose theirs, on SQLite and
on PostgreSQL."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
import uuid
from concurrent.futures import ProcessPoolExecutor

from serve_app.store.sql import SqlResponseStore
from tests.unit.store.test_sql import postgres_url, store_url  # noqa: F401 - fixtures

STORES = 8  # store instances, each its own engine and connections: replicas on one database
ROUNDS = 12  # names raced for, each with its own random start offsets
PROCESSES = 4  # replicas as processes: no event loop or GIL in common


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


def test_replica_processes_proposing_at_once_all_end_with_one_key(
    store_url: str,  # noqa: F811
) -> None:
    """The same race between processes, each with its store, proposing for the same names from
    one moment on (after each one's start-up), each name after a random pause of its own."""
    names = [f"processes-{uuid.uuid4().hex}" for _ in range(ROUNDS)]
    start_at = time.time() + 4  # after every process has imported and started its store
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(PROCESSES, mp_context=context) as pool:
        runs = [
            pool.submit(propose_in_a_process, store_url, names, f"p{index}", start_at, index)
            for index in range(PROCESSES)
        ]
        kept = [run.result(timeout=120) for run in runs]
    for round_index, name in enumerate(names):
        values = {process_kept[round_index] for process_kept in kept}
        assert len(values) == 1, (name, values)
        assert values.pop().startswith(f"{name}-p")


def propose_in_a_process(
    url: str, names: list[str], tag: str, start_at: float, seed: int
) -> list[str | None]:
    return asyncio.run(_propose_all(url, names, tag, start_at, random.Random(seed)))


async def _propose_all(
    url: str, names: list[str], tag: str, start_at: float, rng: random.Random
) -> list[str | None]:
    store = SqlResponseStore(url)
    await store.start()
    try:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        kept = []
        for name in names:
            await asyncio.sleep(rng.uniform(0, 0.01))
            kept.append(await store.shared_secret(name, f"{name}-{tag}"))
        return kept
    finally:
        await store.close()
