"""pydantic-ai (`pydantic-ai-slim[openai]`: `OpenAIResponsesModel` on an `OpenAIProvider` with
the app's `base_url`) against the app.

The scripted engine plays the model (the turns marked PYDANTIC-AI- in
tests/fixtures/engine_script.yaml). Each test checks what the agent run returns (its output,
the tool it ran, the parsed object, the streamed text) and the request fields that make the
test mean what it says.

What pydantic-ai sends (docs/protocol.md, "Other clients"): `input` as role/content messages
without `type`, no `store`; its tools with `strict: true` where their schema allows it and
`tool_choice: "auto"`; `ToolOutput` is a `final_result` function tool with `tool_choice:
"required"`; `NativeOutput` is a strict `json_schema` `text.format`; a tool step sends its
reasoning items back with `encrypted_content: null` and the calls without ids.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, NativeOutput, ToolOutput
from pydantic_ai.messages import ToolCallPart, ToolReturnPart
from pydantic_ai.models.openai import OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.support import API_KEY, MODEL
from tests.support.helpers import recording_http_client


class City(BaseModel):
    city: str
    population: int


def responses_model(app_url: str, bodies: list[dict[str, Any]]) -> OpenAIResponsesModel:
    provider = OpenAIProvider(
        base_url=f"{app_url}/v1",
        api_key=API_KEY,
        http_client=recording_http_client(bodies, asynchronous=True),
    )
    return OpenAIResponsesModel(MODEL, provider=provider)


def item_types(body: dict[str, Any]) -> list[str]:
    return [item.get("type", "message") for item in body["input"]]


async def test_plain_run(app_url: str) -> None:
    bodies: list[dict[str, Any]] = []
    result = await Agent(responses_model(app_url, bodies)).run("PYDANTIC-AI-HELLO: say hello")
    assert result.output == "Hello from the scripted engine, through pydantic-ai."
    usage = result.usage
    assert usage.requests == 1 and usage.input_tokens > 0 and usage.output_tokens > 0
    (body,) = bodies
    assert body["stream"] is False and item_types(body) == ["message"]


async def test_run_with_a_tool(app_url: str) -> None:
    bodies: list[dict[str, Any]] = []
    agent = Agent(responses_model(app_url, bodies), instructions="Answer with the tool.")
    calls: list[str] = []

    @agent.tool_plain
    def city_population(city: str) -> str:
        """The population of a French city."""
        calls.append(city)
        return f"PYDANTIC-AI-POPULATION {city.upper()}: 522000"

    result = await agent.run("PYDANTIC-AI-TOOL: how many people live in Lyon?")
    assert calls == ["Lyon"]
    assert result.output == "Lyon has 522000 inhabitants."
    parts = [part for message in result.all_messages() for part in message.parts]
    (call,) = [part for part in parts if isinstance(part, ToolCallPart)]
    assert (call.tool_name, call.args_as_dict()) == ("city_population", {"city": "Lyon"})
    (returned,) = [part for part in parts if isinstance(part, ToolReturnPart)]
    assert returned.tool_call_id == call.tool_call_id

    first, second = bodies
    assert first["instructions"] == "Answer with the tool."
    assert first["tool_choice"] == "auto"
    (sent_tool,) = first["tools"]
    assert (sent_tool["name"], sent_tool["strict"]) == ("city_population", True)
    assert item_types(second) == ["message", "reasoning", "function_call", "function_call_output"]
    assert second["input"][3]["output"] == "PYDANTIC-AI-POPULATION LYON: 522000"


async def test_tool_output_calls_final_result(app_url: str) -> None:
    bodies: list[dict[str, Any]] = []
    agent = Agent(responses_model(app_url, bodies), output_type=ToolOutput(City))
    result = await agent.run("PYDANTIC-AI-TOOL-OUTPUT: the second city of France?")
    assert result.output == City(city="Marseille", population=873000)
    # One request: the call to final_result is the output, nothing is sent back for it.
    (body,) = bodies
    assert body["tool_choice"] == "required"
    assert [(t["name"], t["strict"]) for t in body["tools"]] == [("final_result", True)]


async def test_native_output_is_a_strict_json_schema(app_url: str) -> None:
    bodies: list[dict[str, Any]] = []
    agent = Agent(responses_model(app_url, bodies), output_type=NativeOutput(City))
    result = await agent.run("PYDANTIC-AI-NATIVE: the fourth city of France?")
    assert result.output == City(city="Toulouse", population=504000)
    (body,) = bodies
    format_ = body["text"]["format"]
    assert (format_["type"], format_["name"], format_["strict"]) == ("json_schema", "City", True)
    assert "tools" not in body


async def test_run_stream(app_url: str) -> None:
    bodies: list[dict[str, Any]] = []
    agent = Agent(responses_model(app_url, bodies))
    async with agent.run_stream("PYDANTIC-AI-STREAM: say something") as result:
        # Every delta as it came, not debounced (how many depends on how the engine's tokens
        # were batched).
        deltas = [delta async for delta in result.stream_text(delta=True, debounce_by=None)]
    expected = "Streamed from the scripted engine, through pydantic-ai, one delta at a time."
    assert deltas and "".join(deltas) == expected
    assert result.usage.output_tokens > 0
    (body,) = bodies
    assert body["stream"] is True
