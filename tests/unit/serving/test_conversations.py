"""Conversation and response items over HTTP, on the in-process app with a SQLite and a
PostgreSQL store: concurrent appends keep every item in the order the answers imply, and
client-chosen ids (long, repeated, too long) page to the end or are refused with a 400."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from serve_app.protocol.requests import MAX_ITEM_ID_LENGTH
from tests.support import MODEL
from tests.support.helpers import in_process_api, sdk_client
from tests.unit.store.test_sql import (  # noqa: F401 - postgres_url: the fixture, for store_url
    LONG_ID,
    REPEATING_IDS,
    assert_each_call_contiguous,
    postgres_url,
    store_url,
)


@pytest.fixture
async def api(store_url: str) -> AsyncIterator[FastAPI]:  # noqa: F811 - the imported fixture
    """The in-process app on either store (SQLite or the session's PostgreSQL)."""
    async with in_process_api(store_url) as app:
        yield app


@pytest.fixture
async def http(api: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        yield client


def message(text: str, item_id: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "message", "role": "user", "content": text}
    if item_id is not None:
        item["id"] = item_id
    return item


async def walk(http: httpx.AsyncClient, url: str, limit: int, order: str) -> list[str]:
    """Every id of a paged list, following ``after`` = the last id of each page."""
    seen: list[str] = []
    params: dict[str, Any] = {"limit": limit, "order": order}
    for _ in range(200):
        answer = await http.get(url, params=params)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        seen += [item["id"] for item in page["data"]]
        if not page["has_more"]:
            return seen
        assert page["last_id"] == page["data"][-1]["id"]
        params["after"] = page["last_id"]
    raise AssertionError(f"paging never ended: {len(seen)} items seen")


async def test_concurrent_item_posts_keep_every_item_in_order(http: httpx.AsyncClient) -> None:
    conversation = (await http.post("/v1/conversations", json={})).json()["id"]
    url = f"/v1/conversations/{conversation}/items"
    answers = await asyncio.gather(
        *(
            http.post(url, json={"items": [message(f"call {call} item {n}") for n in range(3)]})
            for call in range(50)
        )
    )
    statuses = [answer.status_code for answer in answers]
    kept = await walk(http, url, limit=100, order="asc")
    assert statuses == [200] * 50, f"{sum(s >= 500 for s in statuses)} of 50 5xx; {len(kept)} kept"
    calls = [[item["id"] for item in answer.json()["data"]] for answer in answers]
    assert_each_call_contiguous(kept, calls)


async def test_concurrent_responses_extend_their_conversation_in_order(
    api: FastAPI, caplog: pytest.LogCaptureFixture
) -> None:
    client = sdk_client(api)
    conversation = await client.conversations.create()
    inputs = [[f"msg_r{turn}_{n}" for n in range(2)] for turn in range(20)]
    responses = await asyncio.gather(
        *(
            client.responses.create(
                model=MODEL,
                conversation=conversation.id,
                input=[message(f"turn {turn}", item_id) for item_id in ids],
            )
            for turn, ids in enumerate(inputs)
        )
    )
    assert all(response.status == "completed" for response in responses)
    kept = [
        item.id
        async for item in client.conversations.items.list(conversation.id, order="asc", limit=100)
    ]
    # Each response's input items, then its output items, together.
    turns = [
        [*ids, *(item.id for item in response.output)]
        for ids, response in zip(inputs, responses, strict=True)
    ]
    # The service logs a store error and answers anyway: there must be none to swallow.
    swallowed = [record for record in caplog.records if "not extended" in record.getMessage()]
    assert len(kept) == sum(map(len, turns)), f"{len(kept)} kept, {len(swallowed)} errors logged"
    assert not swallowed
    assert_each_call_contiguous(kept, turns)


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_long_and_repeated_ids_page_to_the_end(http: httpx.AsyncClient, order) -> None:
    items = [message(f"item {n}", item_id) for n, item_id in enumerate(REPEATING_IDS)]
    conversation = (await http.post("/v1/conversations", json={"items": items})).json()["id"]
    answer = await http.post("/v1/responses", json={"model": MODEL, "input": items})
    assert answer.status_code == 200, answer.text
    response = answer.json()["id"]
    expected = REPEATING_IDS if order == "asc" else REPEATING_IDS[::-1]
    for limit in (1, 2, 100):
        for url in (
            f"/v1/conversations/{conversation}/items",
            f"/v1/responses/{response}/input_items",
        ):
            assert await walk(http, url, limit, order) == expected, (url, limit)
    # The SDK's own paging (`last_id` for conversations, the last item's id for input items).
    client = sdk_client(http._transport.app)  # type: ignore[attr-defined]
    listed = client.conversations.items.list(conversation, order=order, limit=1)
    assert [item.id async for item in listed] == expected
    listed = client.responses.input_items.list(response, order=order, limit=1)
    assert [item.id async for item in listed] == expected


async def test_an_item_id_beyond_the_limit_is_a_400_naming_it(http: httpx.AsyncClient) -> None:
    longest, too_long = "i" * MAX_ITEM_ID_LENGTH, "i" * (MAX_ITEM_ID_LENGTH + 1)
    conversation = (await http.post("/v1/conversations", json={})).json()["id"]
    url = f"/v1/conversations/{conversation}/items"
    answer = await http.post(url, json={"items": [message("a"), message("b", too_long)]})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "items[1].id"
    assert answer.json()["error"]["type"] == "invalid_request_error"
    answer = await http.post("/v1/conversations", json={"items": [message("a", too_long)]})
    assert (answer.status_code, answer.json()["error"]["param"]) == (400, "items[0].id")
    answer = await http.post(
        "/v1/responses", json={"model": MODEL, "input": [message("a", too_long)]}
    )
    assert (answer.status_code, answer.json()["error"]["param"]) == (400, "input[0].id")
    reference = {"type": "item_reference", "id": too_long}
    answer = await http.post("/v1/responses", json={"model": MODEL, "input": [reference]})
    assert (answer.status_code, answer.json()["error"]["param"]) == (400, "input[0].id")
    # At the limit: stored and listed.
    assert (await http.post(url, json={"items": [message("c", longest)]})).status_code == 200
    assert (await http.get(f"{url}/{longest}")).json()["id"] == longest
    assert await walk(http, url, limit=1, order="desc") == [longest]
    answer = await http.post(
        "/v1/responses",
        json={"model": MODEL, "conversation": conversation, "input": [message("d", LONG_ID)]},
    )
    assert answer.status_code == 200, answer.text
    assert LONG_ID in await walk(http, url, limit=1, order="asc")


# Each bad paging parameter, and the `param` OpenAI's 400 names for it.
BAD_PAGING = [
    ({"limit": 0}, "limit"),
    ({"limit": 101}, "limit"),
    ({"limit": "twenty"}, "limit"),
    ({"order": "newest"}, "order"),
    ({"after": "msg_nowhere"}, "after"),
]


async def test_both_lists_page_alike_and_refuse_bad_paging_naming_the_parameter(
    http: httpx.AsyncClient,
) -> None:
    # 21 items each: one more than the default page.
    items = [message(f"item {n}", f"msg_{n}") for n in range(21)]
    conversation = (await http.post("/v1/conversations", json={"items": items[:20]})).json()["id"]
    added = await http.post(f"/v1/conversations/{conversation}/items", json={"items": items[20:]})
    assert added.status_code == 200, added.text
    answer = await http.post("/v1/responses", json={"model": MODEL, "input": items})
    assert answer.status_code == 200, answer.text
    response = answer.json()["id"]
    for url in (
        f"/v1/conversations/{conversation}/items",
        f"/v1/responses/{response}/input_items",
    ):
        # The defaults: 20 items, newest first; the bounds 1 and 100 are pages.
        listed = (await http.get(url)).json()
        assert [item["id"] for item in listed["data"]] == [f"msg_{n}" for n in range(20, 0, -1)]
        assert (listed["first_id"], listed["last_id"], listed["has_more"]) == (
            "msg_20",
            "msg_1",
            True,
        )
        for limit in (1, 100):
            assert (await http.get(url, params={"limit": limit})).status_code == 200, url
        for params, param in BAD_PAGING:
            answer = await http.get(url, params=params)
            assert answer.status_code == 400, (url, params, answer.text)
            error = answer.json()["error"]
            assert set(answer.json()) == {"error"}
            assert set(error) == {"message", "type", "param", "code"}
            assert (error["type"], error["param"]) == ("invalid_request_error", param), (url, error)
            assert isinstance(error["message"], str) and error["message"]
