"""``tool_search`` and the tool table against the running app, through the openai SDK: the
server's search found and used in one response (streamed and not), the client's search round
trip by ``previous_response_id``, a refused tool type, the echo and the token count."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.support import MODEL

FORECAST: dict[str, Any] = {
    "type": "function",
    "name": "get_forecast",
    "description": "Weather forecast for a city, tomorrow.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "FORECAST-CITY-PARAM"}},
        "required": ["city"],
    },
}
DEFERRED: dict[str, Any] = {**FORECAST, "defer_loading": True}


def test_the_server_search_is_used_in_the_same_response(client: OpenAI) -> None:
    tools: list[Any] = [{"type": "tool_search"}, DEFERRED]
    response = client.responses.create(model=MODEL, input="TSEARCH-QUERY: weather?", tools=tools)
    assert [item.type for item in response.output][-3:] == [
        "tool_search_call",
        "tool_search_output",
        "function_call",
    ]
    call = response.output[-1]
    assert call.type == "function_call" and call.namespace == "get_forecast"
    assert [tool.type for tool in response.tools] == ["tool_search", "function"]
    answer = client.responses.create(
        model=MODEL,
        previous_response_id=response.id,
        input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "FORECAST-RESULT"}
        ],
        tools=tools,
    )
    assert answer.output_text == "Sunny in Paris tomorrow."


def test_the_server_search_streams(client: OpenAI) -> None:
    tools: list[Any] = [{"type": "tool_search"}, DEFERRED]
    with client.responses.stream(model=MODEL, input="TSEARCH-QUERY", tools=tools) as stream:
        events = list(stream)
    done = [e.item.type for e in events if e.type == "response.output_item.done"]
    assert done[-3:] == ["tool_search_call", "tool_search_output", "function_call"]
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_the_client_search_round_trip(client: OpenAI) -> None:
    tools: list[Any] = [{"type": "tool_search", "execution": "client"}, DEFERRED]
    response = client.responses.create(model=MODEL, input="TSEARCH-QUERY", tools=tools)
    search = response.output[-1]
    assert search.type == "tool_search_call" and search.execution == "client"
    found = client.responses.create(
        model=MODEL,
        previous_response_id=response.id,
        input=[
            {
                "type": "tool_search_output",
                "call_id": search.call_id,
                "execution": "client",
                "tools": [FORECAST],
            }
        ],
        tools=tools,
    )
    assert [item.type for item in found.output] == ["function_call"]
    assert found.output[0].name == "get_forecast"  # type: ignore[union-attr]


def test_input_tokens_leave_deferred_parameters_out(client: OpenAI) -> None:
    search: dict[str, Any] = {"type": "tool_search"}
    shown = client.responses.input_tokens.count(model=MODEL, input="hi", tools=[search, FORECAST])
    hidden = client.responses.input_tokens.count(model=MODEL, input="hi", tools=[search, DEFERRED])
    assert hidden.input_tokens < shown.input_tokens


def test_a_refused_tool_is_a_400_naming_it(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model=MODEL,
            input="hi",
            tools=[FORECAST, {"type": "file_search", "vector_store_ids": ["vs"]}],
        )
    assert caught.value.body["param"] == "tools[1].type"  # type: ignore[index]
    assert caught.value.body["message"] == f"Tool 'file_search' is not supported with {MODEL}."  # type: ignore[index]
