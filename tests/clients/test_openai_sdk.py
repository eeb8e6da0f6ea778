"""The openai SDK against the running app (serve run configs/local.yaml, scripted engine)."""

from __future__ import annotations

import json
import uuid

from openai import OpenAI

from tests.support import MODEL
from tests.support.helpers import WEATHER_TOOL


def test_text_answer_non_streaming(client: OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="SDK-TEXT: say hello")
    assert response.status == "completed"
    assert response.id.startswith("resp_")
    assert response.output_text == "Hello from the scripted engine."
    assert [item.type for item in response.output] == ["message"]
    assert response.usage is not None and response.usage.input_tokens > 0
    assert response.usage.output_tokens > 0


def test_streamed_text_through_the_sdk_accumulator(client: OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="SDK-TEXT: say hello") as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert "response.output_text.delta" in types
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert final.output_text == "Hello from the scripted engine."
    assert final.id == events[0].response.id


def test_reasoning_then_text(client: OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input="SDK-REASON: greet me", reasoning={"effort": "low"}
    )
    reasoning, message = response.output
    assert reasoning.type == "reasoning"
    assert reasoning.content[0].text == "The user wants a short greeting."
    assert message.type == "message" and response.output_text == "Hi there."
    assert response.usage.output_tokens_details.reasoning_tokens > 0


def test_tool_call_turn_then_follow_up_with_its_output(client: OpenAI) -> None:
    key = f"conv-{uuid.uuid4()}"
    history: list = [{"role": "user", "content": "SDK-TOOL: weather in Paris?"}]
    with client.responses.stream(
        model=MODEL, input=history, tools=[WEATHER_TOOL], prompt_cache_key=key, store=False
    ) as stream:
        first = stream.get_final_response()
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_")

    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append(
        {"type": "function_call_output", "call_id": call.call_id, "output": "WEATHER-RESULT: sunny"}
    )
    with client.responses.stream(
        model=MODEL, input=history, tools=[WEATHER_TOOL], prompt_cache_key=key, store=False
    ) as stream:
        events = list(stream)
        second = stream.get_final_response()
    assert second.output_text == "It is sunny in Paris."
    # Never echo old items: only this turn's reasoning and message come back.
    assert [item.type for item in second.output] == ["reasoning", "message"]
    old_ids = {item.id for item in first.output}
    added = [event.item.id for event in events if event.type == "response.output_item.added"]
    assert not old_ids & set(added)
    assert "function_call" not in {event.item.type for event in events if hasattr(event, "item")}
    # The second turn re-sends the first turn's prompt: its prefix comes from the KV cache.
    cached_first = first.usage.input_tokens_details.cached_tokens
    cached_second = second.usage.input_tokens_details.cached_tokens
    assert cached_second > cached_first
    assert cached_second >= first.usage.input_tokens // 2


def test_custom_tool_call_carries_raw_input(client: OpenAI) -> None:
    tool = {"type": "custom", "name": "apply_patch", "description": "Edit files."}
    response = client.responses.create(model=MODEL, input="SDK-PATCH: add hello.txt", tools=[tool])
    (call,) = response.output
    assert call.type == "custom_tool_call"
    assert call.name == "apply_patch"
    assert call.input.startswith("*** Begin Patch\n*** Add File: hello.txt")


def test_max_output_tokens_cut_off_is_incomplete(client: OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="SDK-LONG: count", max_output_tokens=8)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 8


def test_engine_failure_ends_the_stream_with_response_failed(client: OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="SDK-FAIL: break") as stream:
        events = list(stream)
    assert events[-1].type == "response.failed"
    error = events[-1].response.error
    assert isinstance(error.code, str) and "simulated engine fault" in error.message


def test_encrypted_reasoning_is_returned_when_asked(client: OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input="SDK-REASON: hi", store=False, include=["reasoning.encrypted_content"]
    )
    reasoning = response.output[0]
    assert reasoning.encrypted_content
    assert "greeting" not in reasoning.encrypted_content


def test_models_endpoint_lists_the_served_model(client: OpenAI) -> None:
    assert MODEL in {model.id for model in client.models.list()}
