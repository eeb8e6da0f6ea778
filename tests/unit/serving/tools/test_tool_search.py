"""``tool_search`` through the whole API in this process (the openai SDK, the simulated engine
playing tests/fixtures/engine_script.yaml): deferred tools hidden until searched, the server's
search answered inside the response and the tool found called in it, the client's search round
trip, stored chains keeping found tools shown, and ``input_tokens`` counting what is shown."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi import FastAPI
from openai import AsyncOpenAI
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from serve_app.engines.base import GenerateChunk, GenerateRequest
from serve_app.engines.simulated import SimulatedEngineConfig
from tests.support import ENGINE_SCRIPT, MODEL
from tests.support.helpers import decode, in_process_api, sdk_client
from tests.support.open_responses import check_spec

EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)

FORECAST = {
    "type": "function",
    "name": "get_forecast",
    "description": "Weather forecast for a city, tomorrow.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "FORECAST-CITY-PARAM"}},
        "required": ["city"],
    },
}
DEFERRED_FORECAST = {**FORECAST, "defer_loading": True}
CRM = {
    "type": "namespace",
    "name": "crm",
    "description": "Customer records.",
    "tools": [
        {
            "type": "function",
            "name": "lookup_customer",
            "description": "Find a customer by id.",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
            "defer_loading": True,
        }
    ],
}
OTHER = {
    "type": "function",
    "name": "send_invoice",
    "description": "Send an invoice.",
    "parameters": {"type": "object", "properties": {"to": {"type": "string"}}},
    "defer_loading": True,
}


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FastAPI]:
    engine = SimulatedEngineConfig(script=str(ENGINE_SCRIPT), decode_tokens_per_s=50_000)
    async with in_process_api(tmp_path / "t.db", engine=engine) as app:
        simulated = app.state.engine
        generate = simulated.generate
        app.state.prompts = []

        def recorded(request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
            app.state.prompts.append(request.prompt_token_ids)
            return generate(request)

        simulated.generate = recorded
        yield app


@pytest.fixture
def client(api: FastAPI) -> AsyncOpenAI:
    return sdk_client(api)


def _prompt(api: FastAPI) -> str:
    """The text of the last prompt the engine was asked to complete."""
    return decode(api.state.prompts[-1])


async def test_the_server_search_finds_the_tool_and_the_model_calls_it_in_the_response(
    api: FastAPI, client: AsyncOpenAI
) -> None:
    response = await client.responses.create(
        model=MODEL,
        input="TSEARCH-QUERY: what will the weather be in Paris?",
        tools=[{"type": "tool_search"}, DEFERRED_FORECAST, OTHER],  # type: ignore[list-item]
    )
    types = [item.type for item in response.output]
    assert types == ["reasoning", "tool_search_call", "tool_search_output", "function_call"]
    call, found, forecast = response.output[1], response.output[2], response.output[3]
    assert call.type == "tool_search_call" and found.type == "tool_search_output"
    assert call.execution == "server" and call.status == "completed"
    assert call.arguments == {"query": "weather forecast"}
    assert found.call_id == call.call_id and found.status == "completed"
    # The query found the forecast tool, not the invoice one.
    assert [tool.name for tool in found.tools] == ["get_forecast"]  # type: ignore[union-attr]
    assert forecast.type == "function_call" and forecast.name == "get_forecast"
    # A deferred top-level tool's call carries its name as namespace (OpenAI's wire shape).
    assert forecast.namespace == "get_forecast"
    assert response.status == "completed"
    # The function call went back to the client; its output continues the stored chain, where
    # the tool found stays shown (the model answers from its output).
    answer = await client.responses.create(
        model=MODEL,
        previous_response_id=response.id,
        input=[
            {
                "type": "function_call_output",
                "call_id": forecast.call_id,
                "output": "FORECAST-RESULT",
            }
        ],
        tools=[{"type": "tool_search"}, DEFERRED_FORECAST, OTHER],  # type: ignore[list-item]
    )
    assert answer.output_text == "Sunny in Paris tomorrow."
    assert "FORECAST-CITY-PARAM" in _prompt(api)  # the stored search output shows it


async def test_a_conversation_keeps_the_tools_found_shown(
    api: FastAPI, client: AsyncOpenAI
) -> None:
    conversation = await client.conversations.create()
    tools: list[Any] = [{"type": "tool_search"}, DEFERRED_FORECAST]
    first = await client.responses.create(
        model=MODEL, conversation=conversation.id, input="TSEARCH-QUERY: weather?", tools=tools
    )
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "get_forecast"
    items = await client.conversations.items.list(conversation.id)
    stored = {item.type for item in items.data}
    assert {"tool_search_call", "tool_search_output"} <= stored
    answer = await client.responses.create(
        model=MODEL,
        conversation=conversation.id,
        input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "FORECAST-RESULT"}
        ],
        tools=tools,
    )
    assert answer.output_text == "Sunny in Paris tomorrow."
    prompt = _prompt(api)
    # Shown once, where the search answered; its parameters never in the developer message.
    assert prompt.count("FORECAST-CITY-PARAM") == 1
    assert prompt.index("FORECAST-CITY-PARAM") > prompt.index("TSEARCH-QUERY")


async def test_the_server_search_streams_its_items(client: AsyncOpenAI) -> None:
    stream = await client.responses.create(
        model=MODEL,
        input="TSEARCH-PATHS: look up customer 7",
        tools=[{"type": "tool_search"}, CRM],  # type: ignore[list-item]
        stream=True,
    )
    events = [event async for event in stream]
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(len(events)))
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert added == ["tool_search_call", "tool_search_output", "function_call"]
    assert [item.type for item in done] == added
    namespace = done[1].tools[0]  # type: ignore[union-attr]
    assert namespace.type == "namespace" and namespace.name == "crm"
    assert [tool.name for tool in namespace.tools] == ["lookup_customer"]
    assert done[2].name == "lookup_customer" and done[2].namespace == "crm"  # type: ignore[union-attr]
    final = events[-1]
    assert final.type == "response.completed"
    assert [item.type for item in final.response.output] == added
    # Every event is the SDK's type, whole (validated, not constructed), and the spec's.
    dumped = [event.model_dump(mode="json", exclude_unset=True) for event in events]
    for event in dumped:
        EVENT.validate_python(event)
    check_spec(dumped[-1]["response"], dumped)


async def test_deferred_tools_are_hidden_until_found(api: FastAPI, client: AsyncOpenAI) -> None:
    await client.responses.create(
        model=MODEL,
        input="TSEARCH-QUERY: the weather?",
        tools=[{"type": "tool_search"}, DEFERRED_FORECAST],  # type: ignore[list-item]
    )
    first, after_search = (decode(prompt) for prompt in api.state.prompts)
    # Its name and description are listed for the search; its parameters are not shown...
    assert "get_forecast: Weather forecast" in first
    assert "FORECAST-CITY-PARAM" not in first and "type get_forecast" not in first
    # ...until the server's search answered with it, in the same response.
    assert after_search.startswith(first)
    assert "FORECAST-CITY-PARAM" in after_search[len(first) :]


async def test_the_client_search_round_trip(api: FastAPI, client: AsyncOpenAI) -> None:
    tools: list[Any] = [{"type": "tool_search", "execution": "client"}, DEFERRED_FORECAST]
    response = await client.responses.create(
        model=MODEL, input="TSEARCH-QUERY: the weather in Paris?", tools=tools, store=False
    )
    assert [item.type for item in response.output] == ["reasoning", "tool_search_call"]
    call = response.output[1]
    assert call.type == "tool_search_call" and call.execution == "client"
    assert response.status == "completed"
    # The client answers with the tools it found; resent statelessly, they are shown and the
    # model calls the one found.
    history = [item.model_dump(exclude_none=True) for item in response.output]
    output = {
        "type": "tool_search_output",
        "call_id": call.call_id,
        "execution": "client",
        "tools": [FORECAST],
    }
    followed = await client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "TSEARCH-QUERY"}, *history, output],
        tools=tools,
        store=False,
    )
    assert [item.type for item in followed.output] == ["function_call"]
    assert followed.output[0].name == "get_forecast"  # type: ignore[union-attr]
    assert followed.output[0].namespace == "get_forecast"  # type: ignore[union-attr]
    assert "FORECAST-CITY-PARAM" in _prompt(api)


async def test_a_client_search_is_shown_as_the_client_describes_it(
    api: FastAPI, client: AsyncOpenAI
) -> None:
    search = {
        "type": "tool_search",
        "execution": "client",
        "description": "FIND-TOOLS-DESC",
        "parameters": {
            "type": "object",
            "properties": {"goal": {"type": "string", "description": "GOAL-PARAM"}},
        },
    }
    await client.responses.create(
        model=MODEL, input="TSEARCH-QUERY", tools=[search, DEFERRED_FORECAST], store=False
    )
    prompt = _prompt(api)
    assert "FIND-TOOLS-DESC" in prompt and "GOAL-PARAM" in prompt
    assert "type tool_search" in prompt and "get_forecast: Weather forecast" in prompt


async def test_input_tokens_count_what_the_model_is_shown(client: AsyncOpenAI) -> None:
    async def count(tools: list[Any], input_items: Any = "hello") -> int:
        counted = await client.responses.input_tokens.count(
            model=MODEL, input=input_items, tools=tools
        )
        return counted.input_tokens

    search: dict[str, Any] = {"type": "tool_search", "execution": "client"}
    shown = await count([search, FORECAST])
    deferred = await count([search, DEFERRED_FORECAST])
    assert deferred < shown  # its parameters are not counted until found
    found = [
        {"role": "user", "content": "hello"},
        {"type": "tool_search_call", "call_id": "c1", "execution": "client", "arguments": {}},
        {"type": "tool_search_output", "call_id": "c1", "execution": "client", "tools": [FORECAST]},
    ]
    assert await count([search, DEFERRED_FORECAST], found) > deferred + 20


async def test_deferred_tools_without_a_search_are_a_400(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model=MODEL, input="hi", tools=[DEFERRED_FORECAST])  # type: ignore[list-item]
    assert caught.value.body["param"] == "tools[0].defer_loading"  # type: ignore[index]
