"""API keys: 401 in OpenAI's shape (checked before the body), and what is stored or sealed
scoped to the key that made it; the store readable by its user only.

Runs the ingress's own FastAPI app in-process (the app every ingress replica serves) with the
simulated engine, through the openai SDK.
"""

from __future__ import annotations

import stat

import httpx
import openai
import pytest

from serve_app.store.base import StoredResponse
from serve_app.store.sql import SqlResponseStore
from tests.support import MODEL
from tests.support.helpers import WEATHER_TOOL, sdk_client


async def test_a_wrong_or_missing_key_is_401_in_openai_shape(two_keys_api) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        await sdk_client(two_keys_api, "key-mallory").responses.create(model=MODEL, input="hi")
    assert caught.value.body["code"] == "invalid_api_key"
    transport = httpx.ASGITransport(app=two_keys_api)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        missing = await http.post("/v1/responses", json={"model": MODEL, "input": "hi"})
        assert missing.status_code == 401
        assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
        assert (await http.get("/health")).status_code == 200  # probes need no key


async def test_stored_responses_belong_to_the_key_that_made_them(two_keys_api) -> None:
    alice, bob = sdk_client(two_keys_api, "key-alice"), sdk_client(two_keys_api, "key-bob")
    created = await alice.responses.create(model=MODEL, input="hello")
    assert (await alice.responses.retrieve(created.id)).id == created.id
    with pytest.raises(openai.NotFoundError):
        await bob.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await bob.responses.create(model=MODEL, previous_response_id=created.id, input="x")
    with pytest.raises(openai.NotFoundError):
        await bob.responses.delete(created.id)
    continued = await alice.responses.create(
        model=MODEL, previous_response_id=created.id, input="again"
    )
    assert continued.status == "completed"


async def test_conversations_belong_to_the_key_that_made_them(two_keys_api) -> None:
    alice, bob = sdk_client(two_keys_api, "key-alice"), sdk_client(two_keys_api, "key-bob")
    conversation = await alice.conversations.create(metadata={"x": "y"})
    with pytest.raises(openai.NotFoundError):
        await bob.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        await bob.responses.create(model=MODEL, conversation=conversation.id, input="x")
    assert (await alice.conversations.retrieve(conversation.id)).metadata == {"x": "y"}


def test_a_websocket_without_a_valid_key_gets_401_and_is_closed(two_keys_api) -> None:
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    with TestClient(two_keys_api) as http:
        for headers in ({}, {"Authorization": "Bearer key-mallory"}):
            with http.websocket_connect("/v1/responses", headers=headers) as socket:
                error = socket.receive_json()
                assert error["type"] == "error" and error["status"] == 401
                assert set(error["error"]) == {"message", "type", "param", "code"}
                with pytest.raises(WebSocketDisconnect) as closed:
                    socket.receive_text()
                assert closed.value.code == 1008  # policy violation


@pytest.mark.parametrize(
    ("method", "path", "options"),
    [
        ("POST", "/v1/responses", {"content": b"{not json"}),
        ("POST", "/v1/responses", {"json": {"model": 1, "input": {"x": []}}}),
        ("POST", "/v1/responses/input_tokens", {"json": {"input": 3}}),
        ("POST", "/v1/responses/compact", {"json": []}),
        ("POST", "/v1/conversations", {"json": {"metadata": "no"}}),
        ("POST", "/v1/conversations/conv_x/items", {"content": b"\xff\xfe"}),
        # Refused on its headers by the body limits, which come after the key.
        ("POST", "/v1/responses", {"headers": {"content-length": str(1 << 40)}}),
        ("POST", "/v1/responses", {"headers": {"content-encoding": "br"}, "content": b"x"}),
        ("GET", "/v1/responses/resp_x?limit=nope", {}),
        ("GET", "/v1/models", {}),
    ],
)
async def test_the_key_is_checked_before_the_body(two_keys_api, method, path, options) -> None:
    # Without a key, whatever the body: 401, never the 400/413/415 the body would get.
    transport = httpx.ASGITransport(app=two_keys_api)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        for headers in ({}, {"Authorization": "Bearer key-mallory"}):
            headers = {**options.get("headers", {}), **headers}
            answer = await http.request(method, path, **{**options, "headers": headers})
            assert answer.status_code == 401, answer.text
            assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


async def test_reasoning_sealed_for_one_key_is_ignored_for_another(two_keys_api) -> None:
    alice, bob = sdk_client(two_keys_api, "key-alice"), sdk_client(two_keys_api, "key-bob")
    created = await alice.responses.create(
        model=MODEL, input="think", store=False, include=["reasoning.encrypted_content"]
    )
    reasoning = next(item for item in created.output if item.type == "reasoning")
    assert reasoning.encrypted_content
    # Sent back as Codex does: the sealed blob only, no text.
    sent_back = {
        "type": "reasoning",
        "summary": [],
        "encrypted_content": reasoning.encrypted_content,
    }
    tool_loop = [
        {"type": "message", "role": "user", "content": "think"},
        sent_back,
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]

    async def prompt_tokens(client) -> int:
        counted = await client.responses.input_tokens.count(
            model=MODEL, input=tool_loop, tools=[WEATHER_TOOL]
        )
        return counted.input_tokens

    without = [item for item in tool_loop if item is not sent_back]
    bare = (
        await alice.responses.input_tokens.count(model=MODEL, input=without, tools=[WEATHER_TOOL])
    ).input_tokens
    assert await prompt_tokens(alice) > bare  # her reasoning is rendered for her
    assert await prompt_tokens(bob) == bare  # and ignored for Bob, as a foreign blob


async def test_a_compaction_sealed_for_one_key_is_refused_for_another(two_keys_api) -> None:
    alice, bob = sdk_client(two_keys_api, "key-alice"), sdk_client(two_keys_api, "key-bob")
    compacted = await alice.responses.compact(model=MODEL, input="a long history")
    item = compacted.output[-1]
    assert item.type == "compaction"
    later = [item.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
    counted = await alice.responses.input_tokens.count(model=MODEL, input=later)
    assert counted.input_tokens > 0
    with pytest.raises(openai.BadRequestError) as refused:
        await bob.responses.input_tokens.count(model=MODEL, input=later)
    assert refused.value.body["code"] == "invalid_encrypted_content"


async def test_the_store_is_readable_by_its_user_only(tmp_path) -> None:
    folder = tmp_path / "new" / "data"
    existing_mode = tmp_path.stat().st_mode
    store = SqlResponseStore(f"sqlite+aiosqlite:///{folder / 'responses.db'}")
    await store.start()
    try:
        await store.put(StoredResponse("resp_1", None, {"id": "resp_1"}, []))
        files = [folder / name for name in ("responses.db", "responses.db-wal", "responses.db-shm")]
        assert all(file.exists() for file in files)
        modes = {file.name: stat.S_IMODE(file.stat().st_mode) for file in files}
        assert modes == dict.fromkeys(modes, 0o600)
        for directory in (folder, folder.parent):  # both created by the store
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert tmp_path.stat().st_mode == existing_mode  # a folder it did not create: as it was
    finally:
        await store.close()


async def test_a_streamed_turn_takes_no_worker_thread(two_keys_api, monkeypatch) -> None:
    """The owner dependency runs on the event loop: FastAPI runs a plain function dependency on
    a worker thread (a thread hop and a GIL handover per request; issue 31)."""
    import anyio.to_thread

    hops: list[object] = []
    run_sync = anyio.to_thread.run_sync

    async def counted(function, *args, **kwargs):
        hops.append(function)
        return await run_sync(function, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    client = sdk_client(two_keys_api, "key-alice")
    stream = await client.responses.create(model=MODEL, input="hi", stream=True)
    types = [event.type async for event in stream]
    assert types[-1] == "response.completed"
    assert hops == []
