"""Item references: ``{"type": "item_reference", "id": ...}`` (or an item with only its id)
resolves to the stored item of the same owner, which renders as if the client had sent it whole.

The Vercel AI SDK sends earlier reasoning, messages and tool calls back this way on every step
when its responses are stored. Through the openai SDK: against the running app (scripted engine
turns ``REF-*``); the parsing and the ownership check without Ray in
tests/unit/serving/turn/test_references.py.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.support import MODEL
from tests.support.helpers import WEATHER_TOOL


def reference(item_id: str) -> dict[str, str]:
    return {"type": "item_reference", "id": item_id}


def count(client: OpenAI, items: list[Any], **options: Any) -> int:
    """Prompt tokens of ``items``, from ``/v1/responses/input_tokens`` (the same rendering)."""
    return client.responses.input_tokens.count(model=MODEL, input=items, **options).input_tokens


def test_a_tool_step_sends_reasoning_and_the_call_back_by_reference(client: OpenAI) -> None:
    question = {"role": "user", "content": "REF-TOOL: weather in Rome?"}
    first = client.responses.create(model=MODEL, input=[question], tools=[WEATHER_TOOL])
    reasoning, call = first.output
    assert (reasoning.type, call.type) == ("reasoning", "function_call")
    (stored_question,) = client.responses.input_items.list(first.id).data
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "REF-RESULT: 9"}
    # As the Vercel AI SDK sends the step after a tool call: the earlier items by reference
    # (here the question too, an input item of the stored response).
    by_reference = [
        reference(stored_question.id),
        reference(reasoning.id),
        reference(call.id),
        result,
    ]
    whole = [question, *[item.model_dump(exclude_none=True) for item in first.output], result]
    tools = {"tools": [WEATHER_TOOL]}
    assert count(client, by_reference, **tools) == count(client, whole, **tools)
    # The stored reasoning's chain of thought is rendered (kept between tool calls).
    without_reasoning = [question, whole[2], result]
    assert count(client, by_reference, **tools) > count(client, without_reasoning, **tools)

    second = client.responses.create(model=MODEL, input=by_reference, tools=[WEATHER_TOOL])
    assert second.status == "completed"
    assert second.output_text == "It is raining in Rome."
    # The response stores the items the references named, so it can be continued and listed.
    listed = client.responses.input_items.list(second.id, order="asc").data
    assert [item.type for item in listed] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert [item.id for item in listed[:3]] == [stored_question.id, reasoning.id, call.id]


def test_a_referenced_call_still_needs_its_output(client: OpenAI) -> None:
    first = client.responses.create(
        model=MODEL, input="REF-TOOL: weather in Rome?", tools=[WEATHER_TOOL]
    )
    call = first.output[-1]
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=[reference(call.id)], tools=[WEATHER_TOOL])
    assert caught.value.body["message"] == f"No tool output found for function call {call.call_id}."
    assert caught.value.body["param"] == "input[0].call_id"


def test_an_item_sent_back_with_only_its_id_is_a_reference(client: OpenAI) -> None:
    question = {"role": "user", "content": "REF-TEXT: remember seven"}
    first = client.responses.create(model=MODEL, input=[question], store=True)
    (message,) = first.output
    follow_up = {"role": "user", "content": "REF-TEXT: what was it?"}
    # Stored with `store` true; the request that references it need not be stored.
    by_id = [question, {"id": message.id}, follow_up]
    whole = [question, message.model_dump(exclude_none=True), follow_up]
    assert count(client, by_id) == count(client, whole)
    answer = client.responses.create(model=MODEL, input=by_id, store=False)
    assert answer.status == "completed" and answer.output_text == "Noted."


def test_a_conversation_item_can_be_referenced(client: OpenAI) -> None:
    note = {"type": "message", "role": "user", "content": "REF-TEXT: a note in a conversation"}
    conversation = client.conversations.create(items=[note])
    (item,) = client.conversations.items.list(conversation.id).data
    ask = {"role": "user", "content": "REF-TEXT: read the note"}
    assert count(client, [reference(item.id), ask]) == count(client, [note, ask])
    answer = client.responses.create(model=MODEL, input=[reference(item.id), ask])
    assert answer.output_text == "Noted."


def test_compaction_resolves_references_too(client: OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="REF-TEXT: keep this question")
    (question,) = client.responses.input_items.list(first.id).data
    compacted = client.responses.compact(
        model=MODEL, input=[reference(question.id), reference(first.output[0].id)]
    )
    # The kept user message is the referenced one, whole.
    assert compacted.output[0].content[0].text == "REF-TEXT: keep this question"
    assert compacted.output[-1].type == "compaction"


def test_a_reference_to_nothing_is_a_400_naming_it(client: OpenAI) -> None:
    items = [{"role": "user", "content": "REF-TEXT: hi"}, reference("msg_nothing_by_this_id")]
    expected = {
        "message": "Item with id 'msg_nothing_by_this_id' not found.",
        "type": "invalid_request_error",
        "param": "input[1].id",
        "code": "item_not_found",
    }
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=items)
    assert caught.value.body == expected
    with pytest.raises(openai.BadRequestError) as counted:
        count(client, items)
    assert counted.value.body == expected
