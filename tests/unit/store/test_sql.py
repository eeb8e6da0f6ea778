"""The response store's contract, on SQLite and on PostgreSQL (when a server can be started)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from sqlalchemy import inspect, make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from serve_app.store.base import StoredResponse
from serve_app.store.sql import SqlResponseStore
from tests.support import postgres


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    try:
        url, data = postgres.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", "") or error
        pytest.skip(f"PostgreSQL not available, its store tests are skipped: {detail}")
    yield url
    postgres.stop(data)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'responses.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[SqlResponseStore]:
    store = SqlResponseStore(store_url)
    await store.start()
    for response_id in await store.ids():  # the PostgreSQL server is shared by the session
        await store.delete(response_id)
    yield store
    await store.close()


def response(response_id: str, previous: str | None = None, text: str = "x") -> StoredResponse:
    body = {
        "id": response_id,
        "status": "completed",
        "created_at": 1,
        "output": [
            {
                "type": "message",
                "id": f"msg_{response_id}",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text}],
            }
        ],
    }
    return StoredResponse(
        response_id,
        previous,
        body,
        [{"id": f"in_{response_id}", "type": "message", "role": "user", "content": text}],
    )


async def test_put_get_round_trip(store: SqlResponseStore) -> None:
    await store.put(response("resp_a", text="hello ünïcode"))
    stored = await store.get("resp_a")
    assert stored == response("resp_a", text="hello ünïcode")
    assert await store.get("resp_missing") is None


async def test_chain_walks_to_the_root_and_forks_keep_both_branches(store) -> None:
    for item in (
        response("r1"),
        response("r2", "r1"),
        response("r3a", "r2"),
        response("r3b", "r2"),
    ):
        await store.put(item)
    assert [s.id for s in await store.chain("r3a")] == ["r1", "r2", "r3a"]
    assert [s.id for s in await store.chain("r3b")] == ["r1", "r2", "r3b"]
    assert await store.chain("nope") is None


async def test_delete_removes_only_that_response(store: SqlResponseStore) -> None:
    await store.put(response("r1"))
    await store.put(response("r2", "r1"))
    assert await store.delete("r1") is True
    assert await store.delete("r1") is False
    assert [s.id for s in await store.chain("r2")] == ["r2"]


async def test_events_come_back_in_order_after_a_sequence_number(store) -> None:
    await store.put(response("bg"))
    await store.append_events("bg", [(0, '{"type":"a"}'), (1, '{"type":"b"}')])
    await store.append_events("bg", [(2, '{"type":"c"}')])
    assert [n for n, _ in await store.events_after("bg", -1)] == [0, 1, 2]
    assert await store.events_after("bg", 1) == [(2, '{"type":"c"}')]


async def test_cancel_flag_survives_later_snapshots(store: SqlResponseStore) -> None:
    await store.put(response("bg"))
    assert not await store.cancel_requested("bg")
    await store.request_cancel("bg")
    await store.put(response("bg", text="later snapshot"))
    assert await store.cancel_requested("bg")


async def test_concurrent_writes_lose_nothing(store: SqlResponseStore) -> None:
    await asyncio.gather(*(store.put(response(f"resp_{index}")) for index in range(60)))
    assert sorted(await store.ids()) == sorted(f"resp_{index}" for index in range(60))


async def test_a_new_store_on_the_same_database_sees_everything(store_url: str, store) -> None:
    await store.put(response("durable"))
    await store.close()
    reopened = SqlResponseStore(store_url)
    await reopened.start()
    assert (await reopened.get("durable")) == response("durable")
    await reopened.close()


async def test_conversation_items_keep_their_order_across_appends(store) -> None:
    from serve_app.store.base import StoredConversation

    await store.put_conversation(StoredConversation("conv_1", 5, {"a": "b"}))
    await store.append_items("conv_1", [{"id": "i1"}, {"id": "i2"}])
    await store.append_items("conv_1", [{"id": "i3"}])
    assert [item["id"] for item in await store.conversation_items("conv_1")] == ["i1", "i2", "i3"]
    assert await store.delete_item("conv_1", "i2") is True
    await store.append_items("conv_1", [{"id": "i4"}])
    assert [item["id"] for item in await store.conversation_items("conv_1")] == ["i1", "i3", "i4"]
    assert (await store.get_conversation("conv_1")).metadata == {"a": "b"}
    assert await store.delete_conversation("conv_1") is True
    assert await store.get_conversation("conv_1") is None
    assert await store.conversation_items("conv_1") == []


async def test_items_are_found_by_id_and_owner(store) -> None:
    from serve_app.store.base import StoredConversation

    # A response's input and output items, of owner "a"; the latest item with an id wins.
    # Ids may be long (clients choose some).
    owned = response("r_items", text="first")
    long_id = "item_" + "x" * 500
    inputs = [*owned.input_items, {"id": long_id, "type": "message"}]
    await store.put(StoredResponse(owned.id, None, owned.response, inputs, "a"))
    await store.put(StoredResponse("r_again", None, owned.response, [], "a"))
    found = await store.find_items(["in_r_items", "msg_r_items", "missing"], "a")
    assert set(found) == {"in_r_items", "msg_r_items"}
    assert found["msg_r_items"]["content"][0]["text"] == "first"
    assert await store.find_items(["msg_r_items"], "b") == {}
    assert await store.find_items(["msg_r_items"], None) == {}
    assert list(await store.find_items([long_id], "a")) == [long_id]
    # Conversation items, of the conversation's owner.
    await store.put_conversation(StoredConversation("conv_items", 1, {}, owner="a"))
    await store.append_items("conv_items", [{"id": "ci_1", "type": "message"}])
    assert list(await store.find_items(["ci_1"], "a")) == ["ci_1"]
    assert await store.find_items(["ci_1"], None) == {}
    # Deleting what holds an item removes it from the index.
    assert await store.delete_item("conv_items", "ci_1")
    assert await store.find_items(["ci_1"], "a") == {}
    await store.delete("r_items")
    assert list(await store.find_items(["in_r_items", "msg_r_items"], "a")) == ["msg_r_items"]
    await store.delete("r_again")
    assert await store.find_items(["msg_r_items"], "a") == {}
    await store.delete_conversation("conv_items")


async def test_a_new_snapshot_of_a_response_replaces_its_items(store) -> None:
    early = response("r_snap", text="early")
    early.response["output"][0]["id"] = "msg_early"
    await store.put(early)
    await store.put(response("r_snap", text="final"))
    found = await store.find_items(["msg_r_snap", "msg_early"], None)
    assert list(found) == ["msg_r_snap"]
    assert found["msg_r_snap"]["content"][0]["text"] == "final"
    await store.delete("r_snap")


def assert_each_call_contiguous(stored_ids: list[str], calls: list[list[str]]) -> None:
    """Every item of every call kept once, each call's items together and in its order."""
    assert sorted(stored_ids) == sorted(item_id for call in calls for item_id in call)
    for call in calls:
        start = stored_ids.index(call[0])
        assert stored_ids[start : start + len(call)] == call


async def test_concurrent_appends_keep_every_item_in_call_order(store) -> None:
    from serve_app.store.base import StoredConversation

    await store.put_conversation(StoredConversation("conv_race", 1, {}))
    calls = [[f"c{call}_{index}" for index in range(3)] for call in range(50)]
    results = await asyncio.gather(
        *(
            store.append_items("conv_race", [{"id": item_id, "type": "message"} for item_id in ids])
            for ids in calls
        ),
        return_exceptions=True,
    )
    failed = [result for result in results if isinstance(result, BaseException)]
    stored_ids = [item["id"] for item in await store.conversation_items("conv_race")]
    assert not failed, f"{len(failed)} of 50 appends failed ({failed[0]!r}); {len(stored_ids)} kept"
    assert_each_call_contiguous(stored_ids, calls)
    await store.delete_conversation("conv_race")


# Client-chosen ids may be long and may repeat (a client resends an item, a reference names
# one already there): paging still ends and visits every item once, in both orders.
LONG_ID = "msg_" + "x" * 196
REPEATING_IDS = ["a", "b", "a", "a", LONG_ID, "b", "c", LONG_ID, "a", "d", "d"]


async def walk_pages(fetch, limit: int) -> list[str]:
    """Follow ``after`` = the last id of each page until ``has_more`` is false (or give up)."""
    seen: list[str] = []
    after = None
    for _ in range(3 * len(REPEATING_IDS)):
        page = await fetch(after, limit)
        assert page.items or not page.has_more
        seen += [item["id"] for item in page.items]
        if not page.has_more:
            return seen
        after = page.items[-1]["id"]
    raise AssertionError(f"paging never ended: {len(seen)} items seen")


@pytest.mark.parametrize("order", ["asc", "desc"])
@pytest.mark.parametrize("limit", [1, 2, 3, 20])
async def test_long_and_repeated_ids_page_to_the_end_once_each(store, order, limit) -> None:
    from serve_app.store.base import StoredConversation

    await store.put_conversation(StoredConversation("conv_ids", 1, {}))
    items = [{"id": item_id, "type": "message", "n": n} for n, item_id in enumerate(REPEATING_IDS)]
    await store.append_items("conv_ids", items[:4])
    await store.append_items("conv_ids", items[4:])

    async def fetch(after, limit):
        return await store.conversation_page("conv_ids", after=after, limit=limit, order=order)

    expected = REPEATING_IDS if order == "asc" else REPEATING_IDS[::-1]
    assert await walk_pages(fetch, limit) == expected
    assert await store.conversation_page("conv_ids", after="nope", limit=1, order=order) is None
    await store.delete_conversation("conv_ids")


async def test_a_store_from_before_long_ids_opens_and_takes_them(store_url: str) -> None:
    """Conversation item ids were VARCHAR(64): such a store still opens, keeps its items, and
    takes long ids (PostgreSQL's column is widened; SQLite never enforced the length)."""
    from serve_app.store.base import StoredConversation

    engine = create_async_engine(store_url)
    async with engine.begin() as connection:
        await connection.execute(text("DROP TABLE IF EXISTS conversation_items"))
        await connection.execute(
            text(
                "CREATE TABLE conversation_items (conversation_id VARCHAR(64) NOT NULL, "
                "position INTEGER NOT NULL, item_id VARCHAR(64) NOT NULL, item_json TEXT NOT "
                "NULL, PRIMARY KEY (conversation_id, position))"
            )
        )
        await connection.execute(
            text("CREATE INDEX ix_conversation_items_item_id ON conversation_items (item_id)")
        )
        old_item = "('conv_old', 0, 'i_old', '{\"id\": \"i_old\"}')"
        await connection.execute(text(f"INSERT INTO conversation_items VALUES {old_item}"))
    await engine.dispose()
    store = SqlResponseStore(store_url)
    await store.start()
    await store.put_conversation(StoredConversation("conv_old", 1, {}))
    await store.append_items("conv_old", [{"id": LONG_ID}])
    assert [item["id"] for item in await store.conversation_items("conv_old")] == ["i_old", LONG_ID]
    await store.delete_conversation("conv_old")
    await store.close()


async def test_replicas_starting_at_once_on_a_fresh_database_all_start(
    store_url: str, tmp_path
) -> None:
    """Replicas of a new deployment start together on an empty database, each creating the
    schema. On PostgreSQL, CREATE TABLEs racing on the catalog fail one another
    (``pg_type_typname_nsp_index``), which no retry is for: the schema's creators take turns
    (``tables.take_schema_turn``). Each round a fresh database and other start orders."""
    rng = random.Random(40)
    postgresql = make_url(store_url).get_backend_name() == "postgresql"
    admin = create_async_engine(store_url, isolation_level="AUTOCOMMIT") if postgresql else None

    async def fresh_database(round_: int) -> str:
        if admin is None:
            return f"sqlite+aiosqlite:///{tmp_path / f'fresh-{round_}.db'}"
        name = f"fresh_{uuid.uuid4().hex[:12]}"
        async with admin.connect() as connection:
            await connection.execute(text(f"CREATE DATABASE {name}"))
        return make_url(store_url).set(database=name).render_as_string(hide_password=False)

    async def start_after(url: str, delay: float) -> SqlResponseStore:
        await asyncio.sleep(delay)
        store = SqlResponseStore(url)
        await store.start()
        return store

    try:
        for round_ in range(6):
            url = await fresh_database(round_)
            stores = await asyncio.gather(
                *(start_after(url, rng.random() / 100) for _ in range(4)), return_exceptions=True
            )
            failed = [store for store in stores if isinstance(store, BaseException)]
            for store in stores:
                if isinstance(store, SqlResponseStore):
                    await store.close()
            assert not failed, failed
            engine = create_async_engine(url)
            async with engine.connect() as connection:
                tables = await connection.run_sync(lambda sync: inspect(sync).get_table_names())
            await engine.dispose()
            assert {"responses", "conversation_items"} <= set(tables)
            if admin is not None:
                async with admin.connect() as connection:
                    name = make_url(url).database
                    await connection.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    finally:
        if admin is not None:
            await admin.dispose()
