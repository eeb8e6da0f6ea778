"""API keys: 401 in OpenAI's shape, and stored state scoped to the key that made it.

Runs the ingress's own FastAPI app in-process (the app every ingress replica serves) with the
simulated engine, through the openai SDK.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.helpers import sdk_client

MODEL = "gpt-oss-120b"




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
