"""Input items stored by reference (serve_app/store/references.py), on SQLite and PostgreSQL:
an input item that is a stored item already is stored as a marker naming its row, and every
read (a response, a chain, an item reference) gives what the copy stored before gave, through
deletions of what held the row (a response, a conversation or its item, the retention sweep),
concurrent ones included. A store from the previous version (copies, no ``item_refs``) reads
as it did and takes references."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from serve_app.serving.turn.references import as_stored_input
from serve_app.store import writes
from serve_app.store.base import PromptRecord, StoredConversation, StoredResponse
from serve_app.store.sql import SqlResponseStore
from serve_app.store.tables import ItemRefRow, ItemRow, ResponseRow
from tests.unit.store.test_sql import postgres_url, store_url  # noqa: F401 - fixtures
from tests.unit.store.test_sql_retention import NOW, RETENTION_S, Clock, wipe
from tests.unit.store.test_sql_retention import open_store as open_expiring_store

CONVERSATIONS = "conv_refs"


@pytest.fixture
async def clock() -> Clock:
    return Clock()


async def open_store(url: str, clock: Clock) -> SqlResponseStore:
    return await open_expiring_store(url, clock, as_input=as_stored_input)


@pytest.fixture
async def store(store_url: str, clock: Clock) -> AsyncIterator[SqlResponseStore]:  # noqa: F811
    store = await open_store(store_url, clock)
    await wipe_all(store)
    yield store
    await wipe_all(store)
    await store.close()


async def wipe_all(store: SqlResponseStore) -> None:
    await wipe(store)
    async with store._write() as session, session.begin():
        await session.execute(ItemRefRow.__table__.delete())
    for index in range(4):
        await store.delete_conversation(f"{CONVERSATIONS}{index}")


def message(item_id: str, text: str, role: str = "assistant") -> dict[str, Any]:
    """An output message as a response stores it (fields an input item drops included)."""
    part = "output_text" if role == "assistant" else "input_text"
    return {
        "id": item_id,
        "type": "message",
        "role": role,
        "status": "completed",
        "content": [{"type": part, "text": text, "annotations": []}],
    }


def response(
    response_id: str,
    inputs: list[dict[str, Any]],
    created_at: float = NOW,
    previous: str | None = None,
    owner: str | None = "a",
) -> StoredResponse:
    body = {
        "id": response_id,
        "status": "completed",
        "created_at": int(created_at),
        "output": [message(f"msg_{response_id}", f"answer of {response_id}")],
    }
    return StoredResponse(response_id, previous, body, inputs, owner)


def referenced(item: dict[str, Any]) -> dict[str, Any]:
    """What the input of a response referencing ``item`` held as a copy (and reads now)."""
    as_input = as_stored_input(item)
    assert as_input is not None
    return as_input


async def raw_inputs(store: SqlResponseStore, response_id: str) -> list[dict[str, Any]]:
    async with store._session() as session:
        data = await session.scalar(
            select(ResponseRow.input_items_json).where(ResponseRow.id == response_id)
        )
    return json.loads(data)


async def rows(store: SqlResponseStore, column) -> int:
    async with store._session() as session:
        return await session.scalar(select(func.count(column)))


async def test_a_resolved_reference_is_stored_as_a_marker_and_reads_as_the_copy(store) -> None:
    first = response("r1", [message("in_1", "question", "user")])
    await store.put(first)
    copy = referenced(first.output_items[0])
    user = referenced(message("in_2", "next", "user"))
    second = response("r2", [copy, user], previous="r1")
    index_rows = await rows(store, ItemRow.row_id)
    await store.put(second)
    raw = await raw_inputs(store, "r2")
    assert raw[0] == {"type": "item_reference", "id": "msg_r1", "stored_row": raw[0]["stored_row"]}
    assert raw[1] == user  # new: a copy
    assert await rows(store, ItemRow.row_id) == index_rows + 2  # r2's new input and output
    assert (await store.get("r2")).input_items == [copy, user]
    chain = await store.chain("r2")
    assert [stored.input_items for stored in chain] == [first.input_items, [copy, user]]
    assert (await store.find_items(["msg_r1"], "a"))["msg_r1"] == first.output_items[0]


async def test_an_item_not_quite_the_stored_one_is_a_copy(store) -> None:
    await store.put(response("r1", []))
    changed = referenced(message("msg_r1", "edited by the client"))
    other_owner = response("r3", [referenced(message("msg_r1", "answer of r1"))], owner="b")
    await store.put(response("r2", [changed]))
    await store.put(other_owner)
    assert (await raw_inputs(store, "r2")) == [changed]
    assert (await raw_inputs(store, "r3")) == other_owner.input_items
    # The latest item with the id wins, as before: r2's copy now.
    assert (await store.find_items(["msg_r1"], "a"))["msg_r1"] == changed
    # One input giving an id twice, the stored item last: copies, so the last is the latest.
    same = referenced(message("msg_r4", "answer of r4"))
    await store.put(response("r4", []))
    await store.put(response("r5", [referenced(message("msg_r4", "other")), same]))
    assert "stored_row" not in (await raw_inputs(store, "r5"))[1]
    assert as_stored_input((await store.find_items(["msg_r4"], "a"))["msg_r4"]) == same


async def test_deleting_what_held_a_named_item_hands_it_on(store) -> None:
    await store.put_conversation(
        StoredConversation(f"{CONVERSATIONS}0", 1, {}, owner="a"),
        [message("note", "a note", "user"), message("other", "x", "user")],
    )
    first = response("r1", [])
    await store.put(first)
    named = [referenced(first.output_items[0]), referenced(message("note", "a note", "user"))]
    await store.put(response("r2", named))
    await store.put(response("r3", named, created_at=NOW + 1))
    assert all("stored_row" in item for item in await raw_inputs(store, "r3"))
    await store.delete("r1")
    await store.delete_item(f"{CONVERSATIONS}0", "note")
    for response_id in ("r2", "r3"):
        assert (await store.get(response_id)).input_items == named
    found = await store.find_items(["msg_r1", "note"], "a")
    # (the stored item itself, which a reference makes the same input item the copy was)
    assert [as_stored_input(found["msg_r1"]), as_stored_input(found["note"])] == named
    await store.delete("r3")  # the newest held them: r2 does now
    assert (await store.get("r2")).input_items == named
    assert set(await store.find_items(["msg_r1", "note"], "a")) == {"msg_r1", "note"}
    await store.delete("r2")
    assert await store.find_items(["msg_r1", "note"], "a") == {}
    assert await rows(store, ItemRefRow.row_id) == 0
    # A conversation deleted whole hands its items on too.
    await store.put(response("r4", [referenced(message("other", "x", "user"))]))
    await store.delete_conversation(f"{CONVERSATIONS}0")
    assert (await store.get("r4")).input_items == [referenced(message("other", "x", "user"))]


async def test_an_expired_response_s_named_item_lives_with_who_names_it(store, clock) -> None:
    first = response("r_old", [], created_at=NOW - RETENTION_S + 10)
    await store.put(first)
    await store.put(response("r_new", [referenced(first.output_items[0])]))
    clock.now += 20  # r_old expires
    assert await store.get("r_old") is None
    assert list(await store.find_items(["msg_r_old"], "a")) == ["msg_r_old"]  # r_new names it
    assert await store.sweep_expired(10) == 1
    assert (await store.get("r_new")).input_items == [referenced(first.output_items[0])]
    assert list(await store.find_items(["msg_r_old"], "a")) == ["msg_r_old"]
    clock.now += RETENTION_S  # r_new expires too
    assert await store.find_items(["msg_r_old"], "a") == {}
    assert await store.sweep_expired(10) == 1
    assert await rows(store, ItemRow.row_id) == 0


async def test_a_store_from_the_previous_version_reads_as_it_did(
    store_url: str,  # noqa: F811
    clock,
) -> None:
    """The previous version's schema (no ``item_refs``, no ``created_at`` index, no
    ``prompt_fingerprint`` column) and rows (inputs holding copies): the store opens, reads
    them as they were, and takes references."""
    old = await open_store(store_url, clock)
    await wipe_all(old)
    await old.close()
    engine = create_async_engine(store_url)
    first = response("r_v1", [message("in_v1", "question", "user")])
    copy = referenced(first.output_items[0])
    async with engine.begin() as connection:
        await connection.execute(text("DROP TABLE item_refs"))
        await connection.execute(text("DROP INDEX ix_responses_created_at"))
        await connection.execute(text("ALTER TABLE responses DROP COLUMN prompt_fingerprint"))
        for stored in (first, response("r_v2", [copy], previous="r_v1")):
            await connection.execute(
                text("INSERT INTO responses VALUES (:id, :prev, :at, :body, :inputs, 'a', false)"),
                {
                    "id": stored.id,
                    "prev": stored.previous_response_id,
                    "at": int(NOW),
                    "body": json.dumps(stored.response),
                    "inputs": json.dumps(stored.input_items),
                },
            )
            for item in [*stored.input_items, *stored.output_items]:
                await connection.execute(
                    text(
                        "INSERT INTO items (item_key, owner, response_id, item_json) "
                        "VALUES (:key, 'a', :id, :item)"
                    ),
                    {"key": _key(item["id"]), "id": stored.id, "item": json.dumps(item)},
                )
    await engine.dispose()
    store = await open_store(store_url, clock)
    try:
        assert (await store.get("r_v2")).input_items == [copy]
        assert await store.prompt_record("r_v2", "a") == PromptRecord(None)  # kept none
        assert [stored.id for stored in await store.chain("r_v2")] == ["r_v1", "r_v2"]
        await store.put(response("r_v3", [copy], previous="r_v2"))
        assert "stored_row" in (await raw_inputs(store, "r_v3"))[0]
        assert (await store.get("r_v3")).input_items == [copy]
        clock.now += RETENTION_S
        assert await store.sweep_expired(10) == 3
    finally:
        await wipe_all(store)
        await store.close()


def _key(item_id: str) -> str:
    from serve_app.store.tables import item_key

    return item_key(item_id)


@pytest.mark.parametrize("round_", range(6))
async def test_deletions_racing_references_lose_no_item(
    store_url: str,  # noqa: F811
    store,
    clock,
    round_: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On two replicas at once: responses naming the items of others are written while those
    others are deleted, by clients and by both replicas' sweeps. Every response left reads its
    input whole, never a bare reference. The sources have expired but stay named by anchors
    (so references still find them) which clients delete meanwhile. Delays vary by round, and
    a writer pauses between finding the rows it names and naming them (its transaction
    open), so deletions run in that window."""
    rng = random.Random(round_)
    name_rows = writes.name_rows

    async def pausing(*args: Any) -> None:
        await asyncio.sleep(rng.uniform(0.02, 0.06))
        await name_rows(*args)

    monkeypatch.setattr(writes, "name_rows", pausing)
    other = await open_store(store_url, clock)
    sources = [response(f"s{index}", [], created_at=NOW - RETENTION_S + 5) for index in range(12)]
    expected: dict[str, list[dict[str, Any]]] = {}
    for index, source in enumerate(sources):
        await store.put(source)
        expected[f"a{index}"] = [referenced(source.output_items[0])]
        await store.put(response(f"a{index}", expected[f"a{index}"]))
    clock.now += 10  # the sources have expired (named by the anchors, still found)

    async def write(replica: SqlResponseStore, index: int) -> None:
        await asyncio.sleep(rng.uniform(0, 0.01))
        named = [referenced(source.output_items[0]) for source in rng.sample(sources, 3)]
        expected[f"w{index}"] = named
        await replica.put(response(f"w{index}", named))

    async def remove(replica: SqlResponseStore, response_id: str) -> None:
        await asyncio.sleep(rng.uniform(0.005, 0.02))
        await replica.delete(response_id)
        expected.pop(response_id, None)

    async def sweep(replica: SqlResponseStore) -> None:
        await asyncio.sleep(rng.uniform(0.01, 0.04))
        while await replica.sweep_expired(rng.choice([1, 2, 5])):
            pass

    replicas = (store, other)
    # Every anchor: then the sources' items are named only by the writers (if they are).
    removed = [f"a{index}" for index in rng.sample(range(12), 12)] + ["s0", "s1"]
    try:
        await asyncio.gather(
            *(write(replicas[index % 2], index) for index in range(12)),
            *(remove(replicas[index % 2], name) for index, name in enumerate(removed)),
            sweep(store),
            sweep(other),
        )
    finally:
        await other.close()
    for response_id, named in expected.items():
        stored = await store.get(response_id)
        assert stored is not None and stored.input_items == named, response_id
    assert [await store.get(source.id) for source in sources] == [None] * len(sources)
    markers = [item for index in range(12) for item in await raw_inputs(store, f"w{index}")]
    assert any("stored_row" in item for item in markers)  # references were stored
    assert await orphans(store) == 0  # no item row outlived every response naming it


async def orphans(store: SqlResponseStore) -> int:
    """Item rows whose response is gone (kept for no one: a leak)."""
    from sqlalchemy import exists

    async with store._session() as session:
        return await session.scalar(
            select(func.count(ItemRow.row_id)).where(
                ItemRow.response_id.is_not(None),
                ~exists().where(ResponseRow.id == ItemRow.response_id),
            )
        )
