"""Stored responses through the openai SDK: chaining, forks, retrieval, deletion, paging."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import ray
from openai import OpenAI

from tests.support import AUTH, MODEL
from tests.support.replicas import replica_actor, replica_actors, wait_for_ingress_replicas

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_three_chained_turns_with_a_tool_call_in_the_middle(client: OpenAI) -> None:
    first = client.responses.create(
        model=MODEL, input="SDK-TOOL: weather in Paris?", tools=[WEATHER_TOOL]
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        tools=[WEATHER_TOOL],
        input=[
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": "WEATHER-RESULT: sunny",
            }
        ],
    )
    assert second.output_text == "It is sunny in Paris."
    assert second.previous_response_id == first.id
    # Tools are per request (OpenAI semantics): a continuation sends them again.
    third = client.responses.create(
        model=MODEL, previous_response_id=second.id, input="SDK-TEXT: thanks", tools=[WEATHER_TOOL]
    )
    assert third.output_text == "Hello from the scripted engine."
    # The server rebuilt the whole conversation (less the reasoning of the finished turn), and
    # its start is served from the prefix cache.
    assert third.usage.input_tokens > second.usage.input_tokens > first.usage.input_tokens
    assert third.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // 2


def test_an_output_that_matches_no_call_in_the_chain_is_rejected(client: OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="SDK-TEXT: hi")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}],
        )
    assert "call_nowhere" in caught.value.body["message"]


def test_continuing_a_response_twice_forks_and_both_branches_stay_valid(client: OpenAI) -> None:
    root = client.responses.create(model=MODEL, input="SDK-TEXT: start")
    left = client.responses.create(model=MODEL, previous_response_id=root.id, input="SDK-REASON")
    right = client.responses.create(model=MODEL, previous_response_id=root.id, input="SDK-TEXT")
    assert (
        left.output_text == "Hi there." and right.output_text == "Hello from the scripted engine."
    )
    for branch in (left, right):
        after = client.responses.create(
            model=MODEL, previous_response_id=branch.id, input="SDK-TEXT"
        )
        assert after.status == "completed"
        assert after.usage.input_tokens > branch.usage.input_tokens


def test_retrieve_returns_the_created_response(client: OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="SDK-REASON: hi", metadata={"k": "v"})
    fetched = client.responses.retrieve(created.id)
    assert fetched.id == created.id and fetched.status == "completed"
    assert fetched.output_text == created.output_text == "Hi there."
    assert [item.id for item in fetched.output] == [item.id for item in created.output]
    assert fetched.metadata == {"k": "v"}


def test_store_false_is_not_retrievable(client: OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="SDK-TEXT", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


def test_delete_then_404_and_no_continuation(client: OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="SDK-TEXT: delete me")
    deleted = client.responses.delete(created.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL, previous_response_id=created.id, input="SDK-TEXT")
    assert caught.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)


def test_input_items_are_paged_with_cursors(client: OpenAI) -> None:
    messages = [{"role": "user", "content": f"SDK-TEXT message {index}"} for index in range(5)]
    created = client.responses.create(model=MODEL, input=messages)
    page = client.responses.input_items.list(created.id, limit=2, order="asc")
    assert [item.content[0].text for item in page.data] == [
        "SDK-TEXT message 0",
        "SDK-TEXT message 1",
    ]
    assert page.has_more
    rest = client.responses.input_items.list(created.id, limit=10, order="asc", after=page.last_id)
    assert [item.content[0].text for item in rest.data] == [
        f"SDK-TEXT message {index}" for index in (2, 3, 4)
    ]
    assert not rest.has_more
    newest = client.responses.input_items.list(created.id, limit=1)
    assert newest.data[0].content[0].text == "SDK-TEXT message 4"


def test_input_tokens_counts_the_rendered_prompt(app_url: str, client: OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="SDK-TEXT: count me")
    body = {"model": MODEL, "input": "SDK-TEXT: count me"}
    counted = httpx.post(
        f"{app_url}/v1/responses/input_tokens", json=body, headers=AUTH, timeout=30
    ).json()
    assert counted == {
        "object": "response.input_tokens",
        "input_tokens": created.usage.input_tokens,
    }


def test_cancel_of_a_foreground_response_is_rejected(app_url: str, client: OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="SDK-TEXT")
    response = httpx.post(f"{app_url}/v1/responses/{created.id}/cancel", headers=AUTH, timeout=30)
    assert response.status_code == 400
    assert (
        httpx.post(f"{app_url}/v1/responses/resp_nope/cancel", headers=AUTH, timeout=30).status_code
        == 404
    )


def test_stored_responses_survive_an_ingress_restart(
    app_cluster: None, app_url: str, client: OpenAI
) -> None:
    created = client.responses.create(model=MODEL, input="SDK-TEXT: remember me")
    names = replica_actors("ResponsesIngress")
    assert names, "no ingress replica found"
    for actor in names:
        ray.kill(replica_actor(actor), no_restart=True)
    deadline = time.monotonic() + 60
    while True:  # Serve replaces the killed replica; the store is the SQLite file on disk
        try:
            fetched = client.responses.retrieve(created.id)
            break
        except (openai.APIConnectionError, openai.InternalServerError, openai.NotFoundError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    assert fetched.output_text == "Hello from the scripted engine."
    wait_for_ingress_replicas(app_url, 2)


def wait_status(client: OpenAI, response_id: str, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while True:
        response = client.responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress") or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def test_background_response_runs_detached_and_can_be_polled(client: OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="SDK-REASON: hi", background=True)
    assert created.background is True
    assert created.status in ("queued", "in_progress")
    done = wait_status(client, created.id)
    assert done.status == "completed" and done.output_text == "Hi there."


def test_background_response_can_be_cancelled(client: OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="SDK-SLOW: forever", background=True)
    time.sleep(0.5)  # it is now paused mid-turn in the engine
    cancelled = client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(created.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(created.id)  # already settled


def test_background_stream_resumes_after_a_sequence_number(client: OpenAI) -> None:
    stream = client.responses.create(
        model=MODEL, input="SDK-LONG: count", background=True, stream=True
    )
    seen = []
    for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break  # the connection drops mid-answer
    stream.close()
    response_id, last = seen[0].response.id, seen[-1].sequence_number
    resumed = list(client.responses.retrieve(response_id, stream=True, starting_after=last))
    numbers = [event.sequence_number for event in seen + resumed]
    assert numbers == list(range(len(numbers)))
    assert resumed[-1].type == "response.completed"
    text = "".join(e.delta for e in seen + resumed if e.type == "response.output_text.delta")
    assert text == resumed[-1].response.output_text
    assert text.startswith("one two three")


def test_only_background_responses_stream_after_creation(app_url: str, client: OpenAI) -> None:
    created = client.responses.create(model=MODEL, input="SDK-TEXT")
    response = httpx.get(
        f"{app_url}/v1/responses/{created.id}?stream=true", headers=AUTH, timeout=30
    )
    assert response.status_code == 400
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="SDK-TEXT", background=True, store=False)


def test_a_chain_started_on_one_ingress_replica_continues_on_the_other(client: OpenAI) -> None:
    """Both ingress replicas read and write the one store."""
    raw = client.responses.with_raw_response
    first = raw.create(model=MODEL, input="SDK-TEXT: start here")
    previous, replicas = first.parse(), {first.headers["x-serve-app-replica"]}
    for _ in range(30):  # the proxy spreads requests over the replicas
        turn = raw.create(model=MODEL, previous_response_id=previous.id, input="SDK-TEXT")
        replicas.add(turn.headers["x-serve-app-replica"])
        previous = turn.parse()
        assert previous.status == "completed"
        if len(replicas) == 2:
            break
    assert len(replicas) == 2, "every turn landed on one ingress replica"
    assert client.responses.retrieve(first.parse().id).id == first.parse().id


def test_conversation_items_and_responses_that_extend_it(client: OpenAI) -> None:
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "SDK-TEXT: my name is Ada"}],
        metadata={"topic": "names"},
    )
    assert conversation.id.startswith("conv_") and conversation.metadata == {"topic": "names"}
    first = client.responses.create(model=MODEL, conversation=conversation.id, input="SDK-REASON")
    assert first.output_text == "Hi there."
    second = client.responses.create(
        model=MODEL, conversation={"id": conversation.id}, input="SDK-TEXT: and now?"
    )
    # The conversation held the earlier turn: the prompt grew and its start was cached.
    assert second.usage.input_tokens > first.usage.input_tokens
    items = client.conversations.items.list(conversation.id, order="asc").data
    texts = [item.content[0].text for item in items if item.type == "message"]
    assert texts == [
        "SDK-TEXT: my name is Ada",
        "SDK-REASON",
        "Hi there.",
        "SDK-TEXT: and now?",
        "Hello from the scripted engine.",
    ]
    assert client.conversations.items.retrieve(items[0].id, conversation_id=conversation.id)
    client.conversations.items.delete(items[0].id, conversation_id=conversation.id)
    assert len(client.conversations.items.list(conversation.id).data) == len(items) - 1
    updated = client.conversations.update(conversation.id, metadata={"topic": "other"})
    assert client.conversations.retrieve(conversation.id).metadata == updated.metadata
    client.conversations.delete(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, conversation=conversation.id, input="SDK-TEXT")
