"""State that stays bounded: responses expire after the store's retention (not found at once,
deleted by the sweep in batches, by several sweepers at once), and a chain is loaded in one
query that gives what the loop of one read per link gave. On SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import func, select

from serve_app.config import StoreConfig
from serve_app.serving.retention import RetentionSweep
from serve_app.store.base import ResponseStore, StoredConversation, StoredResponse
from serve_app.store.sql import SqlResponseStore
from serve_app.store.tables import EventRow, ItemRow, ResponseRow, RunRow
from tests.unit.store.test_sql import postgres_url, store_url  # noqa: F401 - fixtures

RETENTION_S = 1000.0
NOW = 1_000_000.0


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def clock() -> Clock:
    return Clock()


async def open_store(url: str, clock: Clock, **options: Any) -> SqlResponseStore:
    """A started store on ``url`` whose responses expire after `RETENTION_S` by ``clock``;
    ``options``: more of `SqlResponseStore`'s."""
    store = SqlResponseStore(url, retention_s=RETENTION_S, clock=clock, **options)
    await store.start()
    return store


@pytest.fixture
async def store(store_url: str, clock: Clock) -> AsyncIterator[SqlResponseStore]:  # noqa: F811
    store = await open_store(store_url, clock)
    await wipe(store)
    yield store
    await wipe(store)
    await store.close()


async def wipe(store: SqlResponseStore) -> None:
    """The PostgreSQL server is shared by the session: start from an empty store."""
    async with store._write() as session, session.begin():
        for table in (ResponseRow, ItemRow, EventRow, RunRow):
            await session.execute(table.__table__.delete())


def response(
    response_id: str, created_at: float, previous: str | None = None, owner: str | None = None
) -> StoredResponse:
    body = {
        "id": response_id,
        "status": "completed",
        "created_at": int(created_at),
        "output": [
            {
                "type": "message",
                "id": f"msg_{response_id}",
                "role": "assistant",
                "content": [{"type": "output_text", "text": response_id}],
            }
        ],
    }
    inputs = [{"id": f"in_{response_id}", "type": "message", "role": "user", "content": "x"}]
    return StoredResponse(response_id, previous, body, inputs, owner)


async def count(store: SqlResponseStore, column) -> int:
    async with store._session() as session:
        return await session.scalar(select(func.count(column)))


async def test_an_expired_response_is_not_found_before_any_sweep(store, clock) -> None:
    await store.put(response("r_old", NOW - 10))
    await store.put(response("r_next", NOW - 5, previous="r_old"))
    assert await store.get("r_old") is not None
    assert [s.id for s in await store.chain("r_next")] == ["r_old", "r_next"]
    assert set(await store.find_items(["in_r_old", "msg_r_old"], None)) == {
        "in_r_old",
        "msg_r_old",
    }
    clock.now = NOW - 10 + RETENTION_S  # r_old is exactly as old as the retention
    assert await store.get("r_old") is None
    assert await store.chain("r_old") is None
    # An expired ancestor ends the chain, as a deleted one does.
    assert [s.id for s in await store.chain("r_next")] == ["r_next"]
    assert await store.find_items(["in_r_old", "msg_r_old"], None) == {}
    assert await count(store, ResponseRow.id) == 2  # not swept: only hidden


async def test_the_sweep_deletes_the_expired_in_batches_and_keeps_the_fresh(store) -> None:
    for index in range(7):
        await store.put(response(f"r_old{index}", NOW - RETENTION_S - index))
        await store.append_events(f"r_old{index}", [(0, '{"type":"a"}')])
        await store.claim_run(f"r_old{index}", "replica", 10)
    for index in range(3):
        await store.put(response(f"r_new{index}", NOW - index))
        await store.append_events(f"r_new{index}", [(0, '{"type":"a"}')])
    await store.put_conversation(StoredConversation("conv_old", 1, {}), [{"id": "c_item"}])
    assert [await store.sweep_expired(3) for _ in range(4)] == [3, 3, 1, 0]
    assert sorted(await store.ids()) == ["r_new0", "r_new1", "r_new2"]
    assert await count(store, EventRow.response_id) == 3
    assert await count(store, RunRow.response_id) == 0
    # Two items (input and output) of each fresh response, and the conversation's item.
    assert await count(store, ItemRow.row_id) == 7
    # Conversations do not expire (nor their items).
    assert await store.get_conversation("conv_old") is not None
    assert list(await store.find_items(["c_item"], None)) == ["c_item"]
    await store.delete_conversation("conv_old")


async def test_a_store_keeping_everything_sweeps_nothing(store_url: str) -> None:  # noqa: F811
    store = SqlResponseStore(store_url)  # retention None
    await store.start()
    await wipe(store)
    await store.put(response("r_ancient", 1))
    assert await store.sweep_expired(10) == 0
    assert await store.get("r_ancient") is not None
    await wipe(store)
    await store.close()


async def old_loop_chain(store: SqlResponseStore, response_id: str):
    """The chain as the store loaded it before: one read per link."""
    return await ResponseStore.chain(store, response_id)


async def test_the_one_query_chain_is_the_loop_s_chain(store, clock) -> None:
    """Random forests of chains with forks, deleted links, expired links and links of
    another owner: for every id, the chain (and what history makes of it) is the loop's."""
    from serve_app.serving.turn import history

    rng = random.Random(38)
    for forest in range(3):
        await wipe(store)
        ids: list[str] = []
        for index in range(40):
            response_id = f"f{forest}_r{index}"
            previous = rng.choice(ids) if ids and rng.random() < 0.9 else None
            owner = "b" if rng.random() < 0.05 else "a"
            created = NOW - rng.uniform(0, 2 * RETENTION_S)
            await store.put(response(response_id, created, previous, owner))
            ids.append(response_id)
        for response_id in rng.sample(ids, 5):
            await store.delete(response_id)
        for response_id in [*ids, "unknown"]:
            chain = await store.chain(response_id)
            assert chain == await old_loop_chain(store, response_id), response_id
            for owner in ("a", "b"):
                assert await history._chain(store, response_id, owner) == await loop_history(
                    store, response_id, owner
                )


async def loop_history(store: SqlResponseStore, response_id: str, owner: str):
    """history._chain on the old loop."""
    from serve_app.serving.turn import history

    class Loop:
        async def chain(self, next_id: str):
            return await old_loop_chain(store, next_id)

    return await history._chain(Loop(), response_id, owner)  # type: ignore[arg-type]


async def test_a_chain_s_load_is_one_statement_whatever_its_length(store) -> None:
    from sqlalchemy import event

    previous = None
    for index in range(60):
        await store.put(response(f"r{index}", NOW, previous))
        previous = f"r{index}"
    statements: list[str] = []
    engine = store._engine.sync_engine
    listener = lambda *args: statements.append(args[2])  # noqa: E731 - the statement
    event.listen(engine, "before_cursor_execute", listener)
    try:
        for length in (5, 60):
            statements.clear()
            chain = await store.chain(f"r{length - 1}")
            assert [s.id for s in chain] == [f"r{index}" for index in range(length)]
            assert len([s for s in statements if s.lstrip().upper().startswith("WITH")]) == 1
            assert len(statements) <= 2, statements  # the query (and SQLite's BEGIN)
    finally:
        event.remove(engine, "before_cursor_execute", listener)


@pytest.mark.parametrize("round_", range(8))
async def test_sweepers_on_two_replicas_at_once_delete_each_expired_response_once(
    store_url: str,  # noqa: F811
    store,
    clock,
    round_: int,
) -> None:
    """Two replicas (two stores on one database), each with two sweepers, sweep at the same
    moment while new responses are written: none fails, every expired response is deleted
    and counted once, every fresh one is kept. Batch sizes and start delays vary by round,
    so the transactions interleave differently each time."""
    rng = random.Random(round_)
    other = await open_store(store_url, clock)
    expired = [f"x{round_}_{index}" for index in range(60)]
    for response_id in expired:
        await store.put(response(response_id, NOW - RETENTION_S - rng.uniform(0, 50)))
        await store.append_events(response_id, [(0, '{"type":"a"}')])

    async def sweeper(replica: SqlResponseStore) -> int:
        await asyncio.sleep(rng.uniform(0, 0.02))
        config = StoreConfig(sweep_batch=rng.choice([1, 3, 7, 16]))
        return await RetentionSweep(replica, config).sweep()

    async def writer(replica: SqlResponseStore, index: int) -> None:
        await asyncio.sleep(rng.uniform(0, 0.02))
        await replica.put(response(f"fresh{round_}_{index}", NOW))

    try:
        results = await asyncio.gather(
            *(sweeper(replica) for replica in (store, other, store, other)),
            *(writer(replica, index) for index, replica in enumerate((store, other) * 3)),
        )
    finally:
        await other.close()
    assert sum(results[:4]) == len(expired)
    assert sorted(await store.ids()) == sorted(f"fresh{round_}_{index}" for index in range(6))
    assert await count(store, EventRow.response_id) == 0
